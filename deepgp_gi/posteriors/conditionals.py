"""The per-layer GP conditional, as pure functions shared by every posterior family.

For a layer with inducing inputs Z (fixed per layer, ``[M, D]``, or propagated per sample,
``[S, M, D]``) and inputs ``F`` ``[S, N, D]``, every family needs the same pieces:

* ``L_K = chol(K(Z, Z) + jitter I)`` (:func:`inducing_cholesky`; every layer's at once, as one
  batched factorisation, :func:`inducing_choleskies`, with the inverses ``L_K^{-1}`` for
  solve-free gradients, :func:`inducing_factors`);
* the whitened projection ``A = L_K^{-1} K(Z, F)`` ``[S, M, N]`` (:func:`whitened_projection`),
  one data-sized triangular solve; with a shared ``L_K`` the S samples are solved as one
  ``[M, S*N]`` right-hand side (one solve, not S batched ones); given ``L_K^{-1}``
  (:func:`~deepgp_gi.linalg.cholesky_with_inverse`), its gradient is two products, no solve;
* the conditional mean ``m(F) + A^T a`` for whitened inducing outputs ``a``
  (:func:`conditional_mean`) and the prior's residual variance ``k(F, F) - |A|^2``
  (:func:`residual_variance`);
* reparameterised samples of the data rows from their marginals (:func:`sample_rows`);
* for the families whose inducing inputs are the layers' own (mean-field, fully-coupled, STAR),
  the check that every layer has them (:func:`require_local_inducing`).

What differs between families is only what they know about ``a``: a Gaussian per unit
(mean-field), a coupled Gaussian (fully-coupled, STAR) or a pseudo-data posterior (global and
local inducing).
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import gpflow
import tensorflow as tf
from check_shapes import check_shapes

from ..kernels import constant_diagonal
from ..layers import GPLayer
from ..linalg import add_jitter, cholesky_with_inverse, safe_cholesky, triangular_solve_with_inverse

__all__ = [
    "inducing_cholesky",
    "inducing_choleskies",
    "inducing_factors",
    "whitened_projection",
    "conditional_mean",
    "residual_variance",
    "unit_variances",
    "symmetric_quadratic_forms",
    "sample_rows",
    "layer_mean",
    "require_local_inducing",
]


def require_local_inducing(posterior) -> None:
    """Raise unless every layer of the :class:`~deepgp_gi.posteriors.DeepPosterior` carries local
    inducing inputs (``inducing_variable``)."""
    for i, layer in enumerate(posterior.layers):
        if getattr(layer, "inducing_variable", None) is None:
            raise ValueError(
                f"layers[{i}] ({layer.name}) has no inducing_inputs; {type(posterior).__name__} "
                "needs local inducing inputs on every layer"
            )


@check_shapes("Z: [batch..., M, D]", "return: [batch..., M, M]")
def inducing_cholesky(layer, Z: tf.Tensor, name: str = "K_uu") -> tf.Tensor:
    """``chol(K(Z, Z) + jitter I)`` with GPflow's default jitter, by :func:`safe_cholesky`."""
    Kuu = add_jitter(layer.K(Z), gpflow.config.default_jitter())
    return safe_cholesky(Kuu, name=f"{name} of layer {layer.name}")


def inducing_choleskies(layers: Sequence, stacked: bool = False):
    """:func:`inducing_cholesky` of every layer's fixed inducing inputs ``layer.Z``, ``[M_l, M_l]``
    each, with one :func:`safe_cholesky` per distinct ``M_l``: the usual stack of equal-sized
    ``K_uu`` is one batched factorisation (one kernel, one jitter ladder and one gradient) rather
    than one per layer. Each member keeps its own jitter escalation, so the factors are those of
    the per-layer calls. With ``stacked``, returns ``(factors, stack)``: ``stack`` is the batched
    factor ``[L, M, M]`` itself when one factorisation covers every layer (for callers that batch
    their own solves over layers), else None."""
    jitter = gpflow.config.default_jitter()
    Kuus = [layer.K(layer.Z) for layer in layers]
    groups: Dict[object, List[int]] = {}  # a run-time size is a group of its own
    for i, K in enumerate(Kuus):
        groups.setdefault(K.shape[-1] if K.shape[-1] is not None else ("run-time", i), []).append(i)
    out: List[tf.Tensor] = [None] * len(Kuus)  # type: ignore[list-item]
    stack = None
    for members in groups.values():
        names = ", ".join(layers[i].name for i in members)
        if len(members) == 1:
            (i,) = members
            out[i] = safe_cholesky(add_jitter(Kuus[i], jitter), name=f"K_uu of layer {names}")
            continue
        factor = safe_cholesky(
            add_jitter(tf.stack([Kuus[i] for i in members]), jitter), name=f"K_uu of layers {names}"
        )
        if len(members) == len(Kuus):
            stack = factor
        for i, L in zip(members, tf.unstack(factor)):
            out[i] = L
    return (out, stack) if stacked else out


def inducing_factors(layers: Sequence, stacked: bool = False):
    """``(L_K, L_K^{-1})`` of every layer's fixed inducing inputs, as :func:`inducing_choleskies`
    (one batched factorisation per distinct ``M_l``) with the inverses from one triangular solve
    (:func:`~deepgp_gi.linalg.cholesky_with_inverse`): the factorisation's gradient, and that of
    every :func:`whitened_projection` given the inverse, solve nothing. ``stacked``: returns
    ``(factors, stack)`` as :func:`inducing_choleskies` does."""
    jitter = gpflow.config.default_jitter()
    Kuus = [add_jitter(layer.K(layer.Z), jitter) for layer in layers]
    groups: Dict[object, List[int]] = {}
    for i, K in enumerate(Kuus):
        groups.setdefault(K.shape[-1] if K.shape[-1] is not None else ("run-time", i), []).append(i)
    out: List[Tuple[tf.Tensor, tf.Tensor]] = [None] * len(Kuus)  # type: ignore[list-item]
    stack = None
    for members in groups.values():
        names = ", ".join(layers[i].name for i in members)
        if len(members) == 1:
            (i,) = members
            out[i] = tuple(cholesky_with_inverse(Kuus[i], name=f"K_uu of layer {names}"))
            continue
        L, T = cholesky_with_inverse(
            tf.stack([Kuus[i] for i in members]), name=f"K_uu of layers {names}"
        )
        if len(members) == len(Kuus):
            stack = L
        for i, L_i, T_i in zip(
            members, tf.unstack(L, num=len(members)), tf.unstack(T, num=len(members))
        ):
            out[i] = (L_i, T_i)
    return (out, stack) if stacked else out


@check_shapes(
    "L_K: [batch..., M, M]", "Kuf: [S, M, N]", "inverse: [batch..., M, M]", "return: [S, M, N]"
)
def whitened_projection(
    L_K: tf.Tensor, Kuf: tf.Tensor, inverse: Optional[tf.Tensor] = None
) -> tf.Tensor:
    """``A = L_K^{-1} K_uf``; ``L_K`` is ``[M, M]`` (shared by the samples) or ``[S, M, M]``.
    ``inverse``: ``L_K^{-1}`` (same layout) where the caller has it; the values are the same (a
    triangular solve), the gradient uses it instead of a second solve
    (:func:`~deepgp_gi.linalg.triangular_solve_with_inverse`)."""
    if inverse is None:
        solve = lambda L, B: tf.linalg.triangular_solve(L, B, lower=True)  # noqa: E731
    else:
        solve = lambda L, B: triangular_solve_with_inverse(L, inverse, B)  # noqa: E731
    if L_K.shape.rank == 3:
        return solve(L_K, Kuf)
    S, M, N = tf.shape(Kuf)[0], tf.shape(Kuf)[1], tf.shape(Kuf)[2]
    rhs = tf.reshape(tf.transpose(Kuf, [1, 0, 2]), [M, S * N])
    A = solve(L_K, rhs)
    return tf.transpose(tf.reshape(A, [M, S, N]), [1, 0, 2])


@check_shapes("A: [S, M, N]", "a: [batch..., M, P]", "prior_mean: [S, N, P]", "return: [S, N, P]")
def conditional_mean(A: tf.Tensor, a: tf.Tensor, prior_mean: tf.Tensor) -> tf.Tensor:
    """``m(F) + A^T a`` for whitened inducing outputs ``a`` (``[M, P]`` or ``[1, M, P]`` shared, or
    ``[S, M, P]``)."""
    return prior_mean + tf.linalg.matmul(A, a, transpose_a=True)


@check_shapes("F: [S, N, D]", "A: [S, M, N]", "return: [S, N]")
def residual_variance(layer, F: tf.Tensor, A: tf.Tensor) -> tf.Tensor:
    """The prior's conditional variance given the inducing outputs, ``k(f, f) - |A_f|^2`` (a
    kernel's :func:`~deepgp_gi.kernels.constant_diagonal` broadcasts, with no fill)."""
    value = (
        constant_diagonal(layer.kernel)
        if getattr(type(layer), "K_diag", None) is GPLayer.K_diag
        else None
    )
    prior = layer.K_diag(F) if value is None else value
    return prior - tf.reduce_sum(tf.square(A), axis=-2)


@check_shapes("R: [P, M, M]", "A: [S, M, N]", "return: [S, N, P]")
def unit_variances(R: tf.Tensor, A: tf.Tensor) -> tf.Tensor:
    """``|R_lambda^T A_f|^2`` per unit: the variance a whitened ``q(a_lambda) = N(., R R^T)`` adds.

    Computed as the quadratic form ``A_f^T C_lambda A_f`` with ``C = R R^T`` (``[P, M, M]``, no data
    axis) by :func:`symmetric_quadratic_forms`, whose gradient uses the symmetry of ``C``: two
    data-sized products per unit (forward and one backward) where ``|R^T A|^2`` takes three.
    """
    C = tf.linalg.matmul(R, R, transpose_b=True)
    return tf.linalg.matrix_transpose(symmetric_quadratic_forms(C, A))


@tf.custom_gradient
def symmetric_quadratic_forms(C: tf.Tensor, A: tf.Tensor):
    """``q[s, p, n] = A[s, :, n]^T C[p] A[s, :, n]`` for symmetric ``C`` ``[P, M, M]`` and ``A``
    ``[S, M, N]``; returns ``[S, P, N]``.

    The gradient is written out: ``dq/dA = 2 C A`` (the forward product ``C A``, reused: this is
    where the symmetry of ``C`` enters) and ``dq/dC = A diag(g) A^T`` summed over samples (one
    product); automatic differentiation of ``sum(A * (C A))`` would form ``C^T (g A)`` as well.
    Only valid for symmetric ``C`` (``R R^T`` here); ``tests/posteriors/test_conditionals.py``
    holds values and gradients to automatic differentiation of ``|R^T A|^2``."""
    A1 = tf.expand_dims(A, 1)  # [S, 1, M, N]
    CA = tf.linalg.matmul(C, A1)  # [S, P, M, N]
    forms = tf.reduce_sum(A1 * CA, axis=-2)

    def grad(upstream):  # [S, P, N]
        g = tf.expand_dims(upstream, 2)  # [S, P, 1, N]
        dA = 2.0 * tf.reduce_sum(g * CA, axis=1)
        dC = tf.reduce_sum(tf.linalg.matmul(A1 * g, A1, transpose_b=True), axis=0)
        return dC, dA

    return forms, grad


@check_shapes(
    "mean: [S, N, P]",
    "var: [broadcast S, broadcast N, broadcast P]",
    "eps: [S, N, P]",
    "return: [S, N, P]",
)
def sample_rows(mean: tf.Tensor, var: tf.Tensor, eps: tf.Tensor, jitter: float = 0.0) -> tf.Tensor:
    """``mean + sqrt(max(var, 0) + jitter) * eps``: data rows drawn from their marginals."""
    return mean + tf.sqrt(tf.maximum(var, 0.0) + jitter) * eps


def layer_mean(layer, H: tf.Tensor, use_mean_function: bool = True) -> tf.Tensor:
    """The layer's mean function on ``H`` ``[..., D]`` (zeros of the layer's width if switched
    off)."""
    if use_mean_function:
        return layer.mean(H)
    shape = tf.concat([tf.shape(H)[:-1], [layer.output_dim]], axis=0)
    return tf.zeros(shape, dtype=H.dtype)
