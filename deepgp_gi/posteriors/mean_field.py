"""DSVI mean-field posterior (Salimbeni & Deisenroth 2017); docs/algorithms.md,
"Mean-field deep GPs (DSVI)".

``q(U) = prod_l prod_lambda N(u_{l,lambda} | m_{l,lambda}, S_{l,lambda})`` with per-layer inducing
inputs Z on the layers. Inner layers are sampled per data point with the reparameterisation
trick; the last layer's marginals go to the likelihood expectation.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes, inherit_check_shapes
from gpflow.kullback_leiblers import gauss_kl

from ..layers import GPLayer
from .base import DeepPosterior, Propagation
from .conditionals import (
    conditional_mean,
    inducing_cholesky,
    inducing_choleskies,
    require_local_inducing,
    residual_variance,
    sample_rows,
    unit_variances,
    whitened_projection,
)

__all__ = ["MeanFieldPosterior"]


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
        require_local_inducing(self)
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
            chol = np.eye(M) if self.whiten else inducing_cholesky(layer, layer.Z).numpy()
            q_mu.append(gpflow.Parameter(np.zeros((M, P)), name="q_mu"))
            q_sqrt.append(
                gpflow.Parameter(
                    np.tile(scale * chol[None], [P, 1, 1]), transform=gpflow.utilities.triangular(), name="q_sqrt"
                )
            )
        self.q_mu = q_mu
        self.q_sqrt = q_sqrt

    def natural_gradient_blocks(self):
        """``(q_mu[l], q_sqrt[l])`` for every layer: GPflow's SVGP layout, so GPflow's
        ``NaturalGradient`` updates them (in the whitened or the plain parameterisation alike)."""
        return list(zip(self.q_mu, self.q_sqrt))

    def whitened_parameters(self, l: int, Lk: tf.Tensor):
        """``(m', R')`` of layer ``l`` in whitened coordinates: the parameters themselves when
        ``whiten``, else ``L_K^{-1} q_mu`` and ``L_K^{-1} q_sqrt`` (M x M solves only)."""
        q_mu, q_sqrt = self.q_mu[l], self.q_sqrt[l]
        if self.whiten:
            return q_mu, q_sqrt
        P = tf.shape(q_sqrt)[0]
        Lk_b = tf.broadcast_to(Lk, tf.concat([[P], tf.shape(Lk)], 0))
        return tf.linalg.triangular_solve(Lk, q_mu), tf.linalg.triangular_solve(Lk_b, q_sqrt)

    @check_shapes("F: [S, N, D]", "return[0]: [S, N, P]", "return[1]: [S, N, P]")
    def layer_marginals(self, l: int, F: tf.Tensor, Lk: Optional[tf.Tensor] = None, white=None):
        """Mean and variance ``[S, N, N_l]`` of layer ``l``'s outputs given its inputs F ``[S,N,D]``.

        Both parameterisations use one data-sized solve, ``A = L_K^{-1} K_uf``:
        mean = ``A^T m' + m_l(F)``, var = ``k_ff - ||A||^2 + ||R'^T A||^2`` per unit, with
        ``(m', R')`` from :meth:`whitened_parameters` (for the non-whitened form this is the same
        algebra as ``k_ff - a^T (K - S) a`` with ``a = K^{-1} k``); ``white`` passes ``(m', R')``
        when the caller already has them.
        """
        layer = self.layers[l]
        if Lk is None:
            Lk = inducing_cholesky(layer, layer.Z)
        A = whitened_projection(Lk, layer.K(layer.Z, F))
        m_white, R_white = self.whitened_parameters(l, Lk) if white is None else white
        mean = conditional_mean(A, m_white, layer.mean(F))
        var = residual_variance(layer, F, A)[..., None] + unit_variances(R_white, A)
        return mean, var

    def kl_divergence(self, prior_choleskies: Optional[Sequence[tf.Tensor]] = None, white=None) -> tf.Tensor:
        """Sum over layers of ``KL(q(U_l) || p(U_l))`` (analytic, scalar).

        Computed in whitened coordinates, ``KL(N(m', R' R'^T) || N(0, I))``, which equals the
        non-whitened ``KL(N(m, S S^T) || N(0, K))`` exactly: ``tr(K^{-1} S S^T) = |R'|^2``,
        ``m^T K^{-1} m = |m'|^2`` and ``diag(R') = diag(S) / diag(L_K)`` (a triangular solve of a
        lower-triangular right-hand side stays lower-triangular). The solves are those of
        :meth:`whitened_parameters`, which :meth:`propagate` shares with the marginals, so a step
        does two M x M solves per layer, not four. ``prior_choleskies`` reuses the layers'
        ``chol(K_uu)`` and ``white`` the per-layer ``(m', R')`` when the caller has them.
        """
        terms = []
        if white is None and not self.whiten and prior_choleskies is None:
            prior_choleskies = inducing_choleskies(self.layers)
        for l, layer in enumerate(self.layers):
            if white is None:
                if self.whiten:
                    m_white, R_white = self.q_mu[l], self.q_sqrt[l]
                else:
                    m_white, R_white = self.whitened_parameters(l, prior_choleskies[l])
            else:
                m_white, R_white = white[l]
            terms.append(gauss_kl(m_white, R_white))
        return tf.add_n(terms)

    @inherit_check_shapes
    def propagate(self, X, num_samples=1, seed=None) -> Propagation:
        source, F = self._start(X, num_samples, seed)
        jitter = gpflow.config.default_jitter()
        choleskies = inducing_choleskies(self.layers)  # once per step, one batched factorisation
        white = [self.whitened_parameters(l, Lk) for l, Lk in enumerate(choleskies)]  # shared with the KL
        samples = []
        for l in range(self.depth - 1):
            mean, var = self.layer_marginals(l, F, choleskies[l], white[l])
            F = sample_rows(mean, var, source.normal(f"f/{l}", tf.shape(mean), mean.dtype), jitter)
            samples.append(F)
        mean, var = self.layer_marginals(self.depth - 1, F, choleskies[-1], white[-1])
        var = tf.maximum(var, 0.0)
        samples.append(self.sample_last_layer(mean, var, source))
        kl = tf.fill([num_samples], self.kl_divergence(white=white))
        return Propagation(samples=samples, mean=mean, var=var, kl=kl)
