"""One draw of every layer's inducing outputs: what a latent-variable model propagates with.

A latent-variable deep GP (:class:`~deepgp_gi.LatentDeepGP`) pushes K latent draws per data row
through the layers with the same inducing outputs, so it needs the family's ``q(U)`` drawn as a
whole, not the family's ``propagate``. A family that takes a latent input implements
:meth:`~deepgp_gi.posteriors.DeepPosterior.inducing_draw`, returning an :class:`InducingDraw`;
the helpers here give the last layer's variance term in its usual forms.
"""

from __future__ import annotations

from typing import Callable, List, NamedTuple

import tensorflow as tf

from .conditionals import (
    inducing_choleskies,
    inducing_cholesky,
    layer_mean,
    symmetric_quadratic_forms,
)
from .pseudo_data import analytic_kl, draw_weights, marginal_variance, regulariser

__all__ = [
    "InducingDraw",
    "unit_rows_variance",
    "zero_variance",
    "pseudo_data_variance",
    "pseudo_data_draw",
]


class InducingDraw(NamedTuple):
    """One draw of every layer's inducing outputs per Monte Carlo sample.

    :ivar inputs: per layer, its inducing inputs ``[M, D_l]`` (fixed) or ``[S, M, D_l]``
        (global inducing: the sampled outputs of the layer below).
    :ivar choleskies: per layer, ``chol(K(Z_l) + jitter)`` ``[M, M]`` or ``[S, M, M]``.
    :ivar weights: per layer, the whitened inducing outputs ``a_l`` with ``U_l - m(Z_l) = L_K a_l``,
        ``[S, M, N_l]`` (or ``[M, N_l]`` shared): a draw for hidden layers, the mean of ``q(a_L)``
        given the hidden draws for the last layer.
    :ivar last_variance: ``A [S, M, N] -> [S, N, P]``: the variance ``q(a_L)`` adds to the last
        layer's data rows (``diag(A^T Cov(a_L) A)`` per unit).
    :ivar kl: ``[S]`` the family's regulariser (analytic KL, or sampled log-ratios).
    :ivar residual_mean: whether the layers' mean functions apply (global/local inducing option).
    """

    inputs: List[tf.Tensor]
    choleskies: List[tf.Tensor]
    weights: List[tf.Tensor]
    last_variance: Callable[[tf.Tensor], tf.Tensor]
    kl: tf.Tensor
    residual_mean: bool = True


def unit_rows_variance(R: tf.Tensor) -> Callable[[tf.Tensor], tf.Tensor]:
    """For whitened covariance factors ``R`` ``[P, M, Q]`` (unit p's ``a_p = mean + R_p eps``):
    ``A -> sum_q (R_p^T A)_q^2`` ``[S, N, P]``, evaluated as the quadratic form ``A^T (R R^T) A``
    by :func:`~deepgp_gi.posteriors.conditionals.symmetric_quadratic_forms` (one data-sized
    product in the gradient instead of two; ``C = R R^T`` has no data axis)."""
    C = tf.linalg.matmul(R, R, transpose_b=True)  # [P, M, M]

    def variance(A):
        return tf.linalg.matrix_transpose(symmetric_quadratic_forms(C, A))

    return variance


def zero_variance(num_units: int) -> Callable[[tf.Tensor], tf.Tensor]:
    """``A [S, M, N] -> 0`` ``[S, N, P]``: a last layer whose inducing outputs were drawn."""

    def variance(A):
        return tf.zeros(tf.concat([tf.shape(A)[:1], tf.shape(A)[2:], [num_units]], 0), A.dtype)

    return variance


def pseudo_data_variance(L_B: tf.Tensor, num_units: int) -> Callable[[tf.Tensor], tf.Tensor]:
    """``A [S, M, N] -> [S, N, P]``: the variance of a pseudo-data posterior with factor ``L_B``
    (:func:`~deepgp_gi.posteriors.pseudo_data.marginal_variance`)."""
    return lambda A: marginal_variance(L_B, A, num_units)


def pseudo_data_draw(post, S: int, source, dtype, is_global: bool) -> InducingDraw:
    """The latent-input draw of the global and local inducing posteriors ``post`` (``S`` samples,
    noise from ``source``): every hidden layer's whitened outputs drawn
    from the pseudo-data posterior, the last layer's integrated out with its analytic KL when
    the family's ``propagate`` integrates it out (global inducing per ``last_layer``, local
    inducing when its KL is analytic); the chain ``U_0 -> U_1 -> ...`` per sample for global
    inducing, each layer's own inputs for local inducing."""
    if any(post.weight_space):
        raise ValueError(
            "a latent-variable model takes GP layers only (the posterior has weight-space layers)"
        )
    marginal_last = (post.last_layer == "marginal") if is_global else post.kl_mode == "analytic"
    inputs, chols, weights, terms = [], [], [], []
    last_variance = None
    if is_global:
        U0 = tf.convert_to_tensor(post.inducing_inputs)
        U = tf.broadcast_to(U0[None], tf.concat([[S], tf.shape(U0)], 0))
    else:
        local_chols = inducing_choleskies(post.layers)
    for l, layer in enumerate(post.layers):
        P = layer.output_dim
        last = l == post.depth - 1
        if is_global:
            Z, L_K = U, inducing_cholesky(layer, U, name="K_uu (global inducing)")  # [S, M, M]
            L_B, a_mean = post.pseudo_data[l].posterior(L_K)
        else:  # one posterior shared by the samples
            Z, L_K = layer.Z, local_chols[l]
            L_B, a_mean = post.pseudo_data[l].posterior(L_K[None])
            L_B = tf.broadcast_to(L_B, tf.concat([[S], tf.shape(L_B)[1:]], 0))
            a_mean = tf.broadcast_to(a_mean, tf.concat([[S], tf.shape(a_mean)[1:]], 0))
        if last and marginal_last:
            a = a_mean
            terms.append(analytic_kl(L_B, a_mean))
            last_variance = pseudo_data_variance(L_B, P)
        else:
            eps = source.normal(f"u/{l}", tf.shape(a_mean), dtype)
            a, lr, kl = draw_weights(L_B, a_mean, eps, analytic=post.kl_mode == "analytic")
            terms.append(regulariser(lr, kl))
            last_variance = zero_variance(P)
        inputs.append(Z)
        chols.append(L_K)
        weights.append(a)
        if is_global and not last:
            U = layer_mean(layer, U, post.residual_mean) + tf.linalg.matmul(L_K, a)
    return InducingDraw(inputs, chols, weights, last_variance, tf.add_n(terms), post.residual_mean)
