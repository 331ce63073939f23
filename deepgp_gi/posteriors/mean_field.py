"""DSVI mean-field posterior (Salimbeni & Deisenroth 2017), ALGORITHMS.md §2.1.

``q(U) = prod_l prod_lambda N(u_{l,lambda} | m_{l,lambda}, S_{l,lambda})`` with per-layer inducing
inputs Z on the layers. Inner layers are sampled per data point with the reparameterisation
trick; the last layer's marginals go to the likelihood expectation.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes
from gpflow.kullback_leiblers import gauss_kl

from ..layers import GPLayer
from ..linalg import add_jitter, safe_cholesky
from ..noise import as_noise_source
from .base import DeepPosterior, Propagation

__all__ = ["MeanFieldPosterior", "conditional_projection", "inducing_prior_cholesky"]


def inducing_prior_cholesky(layer: GPLayer) -> tf.Tensor:
    """``chol(K(Z, Z) + jitter I)`` for a layer with local inducing inputs, ``[M, M]``."""
    Kuu = add_jitter(layer.K(layer.Z), gpflow.config.default_jitter())
    return safe_cholesky(Kuu, name=f"K_uu of layer {layer.name}")


@check_shapes(
    "Lk: [M, M]",
    "Kuf: [S, M, N]",
    "return: [S, M, N]",
)
def conditional_projection(Lk: tf.Tensor, Kuf: tf.Tensor, whiten: bool) -> tf.Tensor:
    """``L_K^{-1} K_uf`` (whitened) or ``K_uu^{-1} K_uf`` (non-whitened), by triangular solves.

    The S samples share ``L_K``, so they are solved as one ``[M, S*N]`` right-hand side (one
    large triangular solve is markedly faster than S batched ones on CPU).
    """
    S, M, N = tf.shape(Kuf)[0], tf.shape(Kuf)[1], tf.shape(Kuf)[2]
    rhs = tf.reshape(tf.transpose(Kuf, [1, 0, 2]), [M, S * N])
    A = tf.linalg.triangular_solve(Lk, rhs, lower=True)
    if not whiten:
        A = tf.linalg.triangular_solve(Lk, A, lower=True, adjoint=True)
    return tf.transpose(tf.reshape(A, [M, S, N]), [1, 0, 2])


class MeanFieldPosterior(DeepPosterior):
    """Independent Gaussian ``q(u_{l,lambda})`` per layer and unit (DSVI).

    Parameters per layer l (width ``N_l``, ``M_l`` inducing inputs on the layer):
    ``q_mu[l]`` ``[M_l, N_l]`` and ``q_sqrt[l]`` ``[N_l, M_l, M_l]`` lower-triangular.

    :param layers: GP layers, each with ``inducing_inputs``.
    :param whiten: if True, ``u = L_K u'`` and ``q`` is over ``u'`` with an ``N(0, I)`` prior.
    :param q_sqrt_scales: per-layer multipliers of the initial ``q_sqrt`` (the prior Cholesky,
        or the identity when whitened). Default: 1e-5 for inner layers, 1 for the last (DSVI).
    """

    def __init__(
        self,
        layers: Sequence[GPLayer],
        whiten: bool = False,
        q_sqrt_scales: Optional[Sequence[float]] = None,
        name: Optional[str] = None,
    ):
        super().__init__(layers, name=name)
        for i, layer in enumerate(self.layers):
            if layer.inducing_variable is None:
                raise ValueError(
                    f"layers[{i}] has no inducing_inputs; the mean-field posterior needs local "
                    "inducing inputs on every layer"
                )
        L = self.depth
        if q_sqrt_scales is None:
            q_sqrt_scales = [1e-5] * (L - 1) + [1.0]
        if len(q_sqrt_scales) != L:
            raise ValueError(f"q_sqrt_scales needs {L} entries (one per layer), got {len(q_sqrt_scales)}")
        self.whiten = bool(whiten)
        q_mu: List[gpflow.Parameter] = []
        q_sqrt: List[gpflow.Parameter] = []
        for layer, scale in zip(self.layers, q_sqrt_scales):
            M, P = layer.num_inducing, layer.output_dim
            if self.whiten:
                chol = np.eye(M)
            else:
                chol = inducing_prior_cholesky(layer).numpy()
            q_mu.append(gpflow.Parameter(np.zeros((M, P)), name="q_mu"))
            q_sqrt.append(
                gpflow.Parameter(
                    np.tile(scale * chol[None], [P, 1, 1]), transform=gpflow.utilities.triangular(), name="q_sqrt"
                )
            )
        self.q_mu = q_mu
        self.q_sqrt = q_sqrt

    def whitened_parameters(self, l: int, Lk: tf.Tensor):
        """``(m', R')`` of layer ``l`` in whitened coordinates: the parameters themselves when
        ``whiten``, else ``L_K^{-1} q_mu`` and ``L_K^{-1} q_sqrt`` (M x M solves only)."""
        q_mu, q_sqrt = self.q_mu[l], self.q_sqrt[l]
        if self.whiten:
            return q_mu, q_sqrt
        P = tf.shape(q_sqrt)[0]
        Lk_b = tf.broadcast_to(Lk, tf.concat([[P], tf.shape(Lk)], 0))
        return tf.linalg.triangular_solve(Lk, q_mu), tf.linalg.triangular_solve(Lk_b, q_sqrt)

    def layer_marginals(self, l: int, F: tf.Tensor, Lk: Optional[tf.Tensor] = None):
        """Mean and variance ``[S, N, N_l]`` of layer ``l``'s outputs given its inputs F ``[S,N,D]``.

        Both parameterisations use one data-sized solve, ``A = L_K^{-1} K_uf``:
        mean = ``A^T m' + m_l(F)``, var = ``k_ff - ||A||^2 + ||R'^T A||^2`` per unit, with
        ``(m', R')`` from :meth:`whitened_parameters` (for the non-whitened form this is the same
        algebra as ``k_ff - a^T (K - S) a`` with ``a = K^{-1} k``).
        """
        layer = self.layers[l]
        if Lk is None:
            Lk = inducing_prior_cholesky(layer)
        Kuf = layer.K(layer.Z, F)  # [S, M, N]
        A = conditional_projection(Lk, Kuf, whiten=True)
        m_white, R_white = self.whitened_parameters(l, Lk)
        mean = tf.linalg.matmul(A, m_white, transpose_a=True) + layer.mean(F)  # [S, N, P]
        prior_term = tf.reduce_sum(tf.square(A), axis=-2)  # [S, N]
        RA = tf.linalg.matmul(R_white, A[:, None], transpose_a=True)  # [S, P, M, N]
        q_term = tf.linalg.matrix_transpose(tf.reduce_sum(tf.square(RA), axis=-2))  # [S, N, P]
        var = (layer.K_diag(F) - prior_term)[..., None] + q_term
        return mean, var

    def kl_divergence(self, prior_choleskies: Optional[Sequence[tf.Tensor]] = None) -> tf.Tensor:
        """Sum over layers of ``KL(q(U_l) || p(U_l))`` (analytic, scalar); ``prior_choleskies``
        reuses the layers' ``chol(K_uu)`` when the caller has them."""
        terms = []
        for l, layer in enumerate(self.layers):
            if self.whiten:
                K_chol = None
            else:
                K_chol = inducing_prior_cholesky(layer) if prior_choleskies is None else prior_choleskies[l]
            terms.append(gauss_kl(self.q_mu[l], self.q_sqrt[l], K_cholesky=K_chol))
        return tf.add_n(terms)

    def propagate(self, X, num_samples=1, noise=None) -> Propagation:
        source = as_noise_source(noise)
        S = num_samples
        X = tf.convert_to_tensor(X)
        F = tf.broadcast_to(X[None], tf.concat([[S], tf.shape(X)], 0))
        jitter = gpflow.config.default_jitter()
        choleskies = [inducing_prior_cholesky(layer) for layer in self.layers]  # once per step
        samples = []
        for l in range(self.depth - 1):
            mean, var = self.layer_marginals(l, F, choleskies[l])
            eps = source.normal(f"f/{l}", tf.shape(mean), mean.dtype)
            F = mean + tf.sqrt(tf.maximum(var, 0.0) + jitter) * eps
            samples.append(F)
        mean, var = self.layer_marginals(self.depth - 1, F, choleskies[-1])
        var = tf.maximum(var, 0.0)
        samples.append(self.sample_last_layer(mean, var, source, mean.dtype))
        kl = tf.fill([S], self.kl_divergence(choleskies))
        return Propagation(samples=samples, mean=mean, var=var, kl=kl)
