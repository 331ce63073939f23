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

from ..initialisation import kmeans_inducing_inputs
from ..layers import GPLayer
from ..noise import NoiseSource
from .base import DeepPosterior, Propagation
from .conditionals import (
    conditional_mean,
    inducing_choleskies,
    inducing_cholesky,
    require_local_inducing,
    residual_variance,
    sample_rows,
    unit_variances,
    whitened_projection,
)
from .draws import InducingDraw, unit_rows_variance

__all__ = ["MeanFieldPosterior", "whitened_kl"]


def whitened_kl(means: Sequence[tf.Tensor], roots: Sequence[tf.Tensor]) -> tf.Tensor:
    """``sum_l KL(N(m'_l, R'_l R'_l^T) || N(0, I))`` for whitened means ``[M_l, P_l]`` and
    lower-triangular roots ``[P_l, M_l, M_l]``, as one expression over all layers:
    ``(|m'|^2 + |R'|^2 - sum log diag(R')^2 - sum_l M_l P_l) / 2`` (GPflow's ``gauss_kl`` per
    layer, summed). Means of equal ``M`` are concatenated along the units and so are roots, so
    each term is one reduction, not one per layer; ``roots`` may also be fewer tensors than
    ``means`` (the units of several layers already concatenated)."""

    def grouped(tensors, axis):
        groups: dict = {}
        for t in tensors:
            groups.setdefault(
                t.shape[-1 if axis == 0 else 0] if t.shape.rank else id(t), []
            ).append(t)
        return [g[0] if len(g) == 1 else tf.concat(g, axis=axis) for g in groups.values()]

    terms, size = [], 0
    for m in grouped(means, -1):
        terms.append(tf.reduce_sum(tf.square(m)))
        n = m.shape.num_elements()
        size = size + (n if n is not None else tf.cast(tf.size(m), m.dtype))
    for R in grouped(roots, 0):
        terms += [
            tf.reduce_sum(tf.square(R)),
            -tf.reduce_sum(tf.math.log(tf.square(tf.linalg.diag_part(R)))),
        ]
    return 0.5 * (tf.add_n(terms) - size)


class MeanFieldPosterior(DeepPosterior):
    """Independent Gaussian ``q(u_{l,lambda})`` per layer and unit (DSVI).

    Parameters per layer l (width ``N_l``, ``M_l`` inducing inputs on the layer):
    ``q_mu[l]`` ``[M_l, N_l]`` and ``q_sqrt[l]`` ``[N_l, M_l, M_l]`` lower-triangular.

    :param layers: GP layers, each with ``inducing_inputs``.
    :param whiten: if True, ``u = L_K u'`` and ``q`` is over ``u'`` with an ``N(0, I)`` prior.
    :param q_sqrt_scales: per-layer multipliers of the initial ``q_sqrt`` (the prior Cholesky,
        or the identity when whitened). Default: 1e-5 for inner layers, 1 for the last (DSVI).
    """

    options = ("whiten", "q_sqrt_scales")
    summary = "DSVI mean-field (Salimbeni & Deisenroth 2017)"

    @classmethod
    def initial_inducing_inputs(cls, X, num_inducing, seed):
        """DSVI's inducing inputs: ``num_inducing`` k-means centres of ``X``."""
        return kmeans_inducing_inputs(X, num_inducing, seed)

    def inducing_draw(self, num_samples: int, source: NoiseSource, dtype: tf.DType) -> InducingDraw:
        """Each hidden layer's whitened inducing outputs drawn from its ``q``; the last layer's
        mean, with its covariance as the variance term."""
        chols = inducing_choleskies(self.layers)
        white = [self.whitened_parameters(l, Lk) for l, Lk in enumerate(chols)]
        weights = []
        for l, (m, R) in enumerate(white[:-1]):
            M, P = self.layers[l].num_inducing, self.layers[l].output_dim
            eps = source.normal(f"u/{l}", [num_samples, M, P], dtype)
            weights.append(m + tf.einsum("pmq,sqp->smp", R, eps))
        m_last, R_last = white[-1]
        weights.append(m_last)
        kl = tf.fill([num_samples], self.kl_divergence(white=white))
        return InducingDraw(
            [layer.Z for layer in self.layers], chols, weights, unit_rows_variance(R_last), kl
        )

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
            raise ValueError(
                f"q_sqrt_scales needs {L} entries (one per layer), got {len(q_sqrt_scales)}"
            )
        self.whiten = bool(whiten)
        q_mu: List[gpflow.Parameter] = []
        q_sqrt: List[gpflow.Parameter] = []
        for layer, scale in zip(self.layers, q_sqrt_scales):
            M, P = layer.num_inducing, layer.output_dim
            chol = np.eye(M) if self.whiten else inducing_cholesky(layer, layer.Z).numpy()
            q_mu.append(gpflow.Parameter(np.zeros((M, P)), name="q_mu"))
            q_sqrt.append(
                gpflow.Parameter(
                    np.tile(scale * chol[None], [P, 1, 1]),
                    transform=gpflow.utilities.triangular(),
                    name="q_sqrt",
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
        """Mean and variance ``[S, N, N_l]`` of layer ``l``'s outputs given its inputs F
        ``[S,N,D]``.

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
        var = tf.expand_dims(residual_variance(layer, F, A), -1) + unit_variances(R_white, A)
        return mean, var

    def kl_divergence(
        self,
        prior_choleskies: Optional[Sequence[tf.Tensor]] = None,
        white=None,
        roots: Optional[Sequence[tf.Tensor]] = None,
    ) -> tf.Tensor:
        """Sum over layers of ``KL(q(U_l) || p(U_l))`` (analytic, scalar).

        Computed in whitened coordinates, ``KL(N(m', R' R'^T) || N(0, I))``, which equals the
        non-whitened ``KL(N(m, S S^T) || N(0, K))`` exactly: ``tr(K^{-1} S S^T) = |R'|^2``,
        ``m^T K^{-1} m = |m'|^2`` and ``diag(R') = diag(S) / diag(L_K)`` (a triangular solve of a
        lower-triangular right-hand side stays lower-triangular). The solves are those of
        :meth:`whitened_parameters`, which :meth:`propagate` shares with the marginals, so a step
        does two M x M solves per layer, not four. ``prior_choleskies`` reuses the layers'
        ``chol(K_uu)`` and ``white`` the per-layer ``(m', R')`` when the caller has them;
        ``roots``, the same ``R'`` with the units of layers concatenated (``_whitened_layers``).
        """
        if white is None:
            if self.whiten:
                white = list(zip(self.q_mu, self.q_sqrt))
            else:
                if prior_choleskies is None:
                    prior_choleskies = inducing_choleskies(self.layers)
                white = [self.whitened_parameters(l, Lk) for l, Lk in enumerate(prior_choleskies)]
        return whitened_kl(
            [m for m, _ in white], roots if roots is not None else [R for _, R in white]
        )

    def _whitened_layers(self, choleskies: Sequence[tf.Tensor], stack: Optional[tf.Tensor]):
        """:meth:`whitened_parameters` of every layer, ``[(m'_l, R'_l)]``, and the roots as
        :meth:`kl_divergence` takes them (None: the per-layer ones). When one batched factor
        ``stack`` ``[L, M, M]`` covers the layers, the roots of all layers are whitened by one
        triangular solve of the concatenated ``[sum_l P_l, M, M]`` roots against the factor
        gathered per unit (one solve and one gradient, not one per layer), and the KL reads that
        concatenation."""
        widths = [q.shape[0] for q in self.q_sqrt]
        if self.whiten or stack is None or any(w is None for w in widths):
            return [self.whitened_parameters(l, Lk) for l, Lk in enumerate(choleskies)], None
        units = np.repeat(np.arange(self.depth), widths)
        roots = tf.concat([tf.convert_to_tensor(q) for q in self.q_sqrt], axis=0)
        roots = tf.linalg.triangular_solve(tf.gather(stack, units), roots)
        means = [tf.linalg.triangular_solve(Lk, q) for Lk, q in zip(choleskies, self.q_mu)]
        return list(zip(means, tf.split(roots, widths, axis=0))), [roots]

    @inherit_check_shapes
    def propagate(self, X, num_samples=1, seed=None) -> Propagation:
        """As :meth:`DeepPosterior.propagate`. The first layer's inputs are the same rows in every
        sample, and so are its marginals: they are computed once, on ``[1, N, D]``, and
        broadcast over the ``S`` samples (its draws differ per sample), which makes a
        many-sample prediction, or a deep sigma point process's ``Q`` paths, cost one first-layer
        conditional instead of ``S``."""
        source, F = self._start(X, 1, seed)
        jitter = gpflow.config.default_jitter()
        choleskies, stack = inducing_choleskies(
            self.layers, stacked=True
        )  # one batched factorisation
        white, roots = self._whitened_layers(choleskies, stack)  # shared with the KL

        def marginals(l, F):
            mean, var = self.layer_marginals(l, F, choleskies[l], white[l])
            if l > 0:
                return mean, var
            shape = tf.concat([[num_samples], tf.shape(mean)[1:]], 0)
            return tf.broadcast_to(mean, shape), tf.broadcast_to(var, shape)

        samples = []
        for l in range(self.depth - 1):
            mean, var = marginals(l, F)
            F = sample_rows(mean, var, source.normal(f"f/{l}", tf.shape(mean), mean.dtype), jitter)
            samples.append(F)
        mean, var = marginals(self.depth - 1, F)
        var = tf.maximum(var, 0.0)
        samples.append(self.sample_last_layer(mean, var, source))
        kl = tf.fill([num_samples], self.kl_divergence(white=white, roots=roots))
        return Propagation(samples=samples, mean=mean, var=var, kl=kl)
