"""Factorised weight posteriors for BNNs and their global-inducing hybrids (docs/algorithms.md,
"Posterior families").

* :class:`FactorisedWeightPosterior` -- ``q(W) = prod N(mu, sigma^2)`` (fac), with the local
  reparameterisation by default;
* :class:`FactorisedGlobalPosterior` -- fac->gi: factorised lower layers, sampled explicitly, and
  a global-inducing last layer (the weight-space layer of :mod:`.inducing`);
* :class:`RandomGlobalPosterior` -- rand->gi: lower layers from the prior.

The global-inducing family itself (gi) and local inducing (li) for BNNs are
:class:`~deepgp_gi.posteriors.GlobalInducingPosterior` and
:class:`~deepgp_gi.posteriors.LocalInducingPosterior`, which take the weight-space path on
DenseLayers.

Conventions: ``S`` samples, ``N`` data rows, ``M`` inducing rows, ``D`` = fan-in with the bias
column, ``P`` = the layer's width; weights are ``[S, D, P]``. ``Propagation.kl`` is
``log q - log p`` per sample (analytic in the weights where available), summed over layers and
including a random-scale prior's ``log q(s) - log p(s)``. Noise names: ``"w/{l}"`` ``[S, D_l, N_l]``
for explicitly sampled weights, ``"f/{l}"`` ``[S, N, N_l]`` for pre-activations under the local
reparameterisation, ``"s/{l}"`` ``[S]`` for Gamma scale draws, ``"L/{l}/chi"`` ``[S, 1]`` for the
spatial inverse-Wishart prior's Bartlett (Gamma) draws.

Parameter scalings (O&A App. H): factorised means are stored times ``sqrt(D)`` and variances as
``log(D sigma^2)``.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

from ..conv_layers import check_network, is_convolution
from ..linalg import safe_cholesky
from ..validation import check_bool, check_choice, check_finite_array, check_float, per_layer_list
from .base import DeepPosterior, Propagation
from .inducing import LAST_LAYER_MODES, has_feature_map, regulariser, weight_space_layer
from .prior_scales import PriorPrecisions
from .pseudo_data import PRECISIONS, PseudoData

__all__ = [
    "FactorisedWeightPosterior",
    "FactorisedGlobalPosterior",
    "RandomGlobalPosterior",
    "FactorisedWeights",
    "factorised_kl",
    "local_reparameterisation_moments",
]


@check_shapes(
    "mean: [D, P]",
    "var: [D, P]",
    "prior_precision: [S, prior_shape...]",
    "return: [S]",
)
def factorised_kl(mean: tf.Tensor, var: tf.Tensor, prior_precision: tf.Tensor) -> tf.Tensor:
    """``sum_{d,p} KL(N(mean, var) || N(0, 1/prior_precision))`` for each sample's precision:
    ``0.5 * sum(p var + p mean^2 - 1 - log(p var))``.

    With a full prior precision ``P`` ``[S, D, D]`` (a spatial inverse-Wishart prior), per unit
    ``0.5 * (sum_d P_dd var_d + mean^T P mean - D - log|P| - sum_d log var_d)``.
    """
    if len(prior_precision.shape) == 3:
        P = prior_precision
        L_P = safe_cholesky(P, name="weight prior precision")
        units = tf.cast(tf.shape(mean)[-1], mean.dtype)
        trace = tf.einsum("sdd,dp->s", P, var)
        mahal = tf.reduce_sum(tf.square(tf.einsum("sde,dp->sep", L_P, mean)), axis=[-2, -1])
        logdet = 2.0 * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(L_P)), axis=-1)
        numel = tf.cast(tf.size(mean), mean.dtype)
        return 0.5 * (trace + mahal - numel - units * logdet - tf.reduce_sum(tf.math.log(var)))
    p = prior_precision[:, None, None]
    terms = p * var + p * tf.square(mean) - 1.0 - tf.math.log(p * var)
    return 0.5 * tf.reduce_sum(terms, axis=[-2, -1])


@check_shapes(
    "Phi: [S, N, D]",
    "mean: [D, P]",
    "var: [D, P]",
    "return[0]: [S, N, P]",
    "return[1]: [S, N, P]",
)
def local_reparameterisation_moments(Phi: tf.Tensor, mean: tf.Tensor, var: tf.Tensor):
    """Mean ``Phi mean`` and variance ``Phi^2 var`` of ``Phi W`` for factorised Gaussian W."""
    return tf.einsum("snd,dp->snp", Phi, mean), tf.einsum("snd,dp->snp", tf.square(Phi), var)


class FactorisedWeights(gpflow.Module):
    """Factorised Gaussian weights ``[D, P]`` of one layer, stored with App. H scalings."""

    def __init__(self, mean, variance, name: Optional[str] = None):
        super().__init__(name=name)
        mean = check_finite_array(mean, "means entry", ndim=2)
        D = mean.shape[0]
        variance = np.broadcast_to(np.asarray(variance, dtype=np.float64), mean.shape)
        if not np.all(variance > 0):
            raise ValueError("factorised weight variances must be positive")
        self.fan_in = D
        self.mean_scaled = gpflow.Parameter(mean * np.sqrt(D), name="weight_mean_scaled")
        self.log_variance_scaled = gpflow.Parameter(np.log(variance * D), name="weight_log_variance_scaled")

    def moments(self):
        """Mean and variance ``[D, P]`` of the weights."""
        D = tf.constant(float(self.fan_in), self.mean_scaled.dtype)
        return self.mean_scaled / tf.sqrt(D), tf.exp(self.log_variance_scaled) / D

    def sample(self, z):
        mean, var = self.moments()
        return mean + tf.sqrt(var) * z


def _factorised_weights(layers, means, variances, rng: np.random.Generator) -> List[FactorisedWeights]:
    """Per-layer :class:`FactorisedWeights`; defaults: means ``N(0, 1/D)`` (NealPrior draws) and
    variances ``1e-3 / D`` (O&A code, docs/algorithms.md, "Paper versus reference code", item 3)."""
    out = []
    for layer, mean, var in zip(layers, per_layer_list(means, "means", len(layers)),
                                per_layer_list(variances, "variances", len(layers))):
        D, P = layer.fan_in, layer.output_dim
        default_mean = rng.standard_normal((D, P)) / np.sqrt(D)
        mean = default_mean if mean is None else np.asarray(mean, dtype=np.float64)
        if mean.shape != (D, P):
            raise ValueError(f"means entries must have shape {(D, P)}, got {mean.shape}")
        out.append(FactorisedWeights(mean, 1e-3 / D if var is None else var))
    return out


class _WeightPosterior(DeepPosterior, PriorPrecisions):
    """Checks that every layer is a DenseLayer and sets up the prior precisions.

    A subclass with ``_CONV_NETWORKS = True`` also accepts a convolutional network
    (:func:`~deepgp_gi.conv_layers.check_network`: convolutions, deterministic layers, residual
    blocks, a DenseLayer last); its per-layer lists, the prior precisions and
    ``parameter_count``'s ``layer_j`` then index the weighted layers (:attr:`weighted`), which are
    the layers themselves for a fully-connected network.
    """

    _CONV_NETWORKS = False
    #: The family's name in error messages.
    family_name = "weight-space"

    def __init__(self, layers, name=None, seed=None):
        super().__init__(layers, name=name)
        dense = all(has_feature_map(layer) and not is_convolution(layer) for layer in self.layers)
        if dense or not self._CONV_NETWORKS:
            for i, layer in enumerate(self.layers):
                if not has_feature_map(layer) or is_convolution(layer):
                    raise TypeError(
                        f"layers[{i}] is a {type(layer).__name__}; weight-space posteriors need DenseLayer "
                        "layers (a feature map and a weight prior)"
                    )
            weighted = self.layers
        else:
            weighted = check_network(self.layers, self.family_name)
        self._init_prior_precisions(weighted, seed)

    def _weight_noise(self, l: int, S: int, source, dtype):
        layer = self.layers[l]
        return source.normal(f"w/{l}", [S, layer.fan_in, layer.output_dim], dtype)


class FactorisedWeightPosterior(_WeightPosterior):
    """Mean-field Gaussian weights ``q(W_l) = prod N(mu, sigma^2)`` (fac).

    The KL is analytic given the prior precision (sampled for a random-scale prior).

    :param layers: DenseLayers.
    :param means: per-layer initial means ``[D_l, N_l]``; default ``N(0, 1/D_l)``.
    :param variances: per-layer initial variances (scalar or ``[D_l, N_l]``); default ``1e-3/D_l``.
    :param local_reparameterisation: if True, every layer's pre-activations are sampled per data
        point from their Gaussian marginals (mean ``Phi mu``, variance ``Phi^2 sigma^2``, noise
        ``"f/{l}"``) and the last layer's marginals go to the likelihood; if False, weights are
        sampled explicitly (noise ``"w/{l}"``) and shared by all rows of a sample (``var = 0``).
    :param seed: seed for the default initial means.
    """

    def __init__(
        self,
        layers,
        means: Optional[Sequence] = None,
        variances: Optional[Sequence] = None,
        local_reparameterisation: bool = True,
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        super().__init__(layers, name=name, seed=seed)
        self.weights = _factorised_weights(self.layers, means, variances, np.random.default_rng(seed))
        self.local_reparameterisation = check_bool(local_reparameterisation, "local_reparameterisation")

    def propagate(self, X, num_samples: int = 1, seed=None) -> Propagation:
        S = num_samples
        source, F = self._start(X, S, seed)
        dtype = F.dtype
        kl = tf.zeros([S], dtype)
        samples = []
        for l, (layer, q) in enumerate(zip(self.layers, self.weights)):
            Phi = layer.features(F)
            p, scale_log_ratio = self.prior_precision(l, S, source, dtype)
            mean, var = q.moments()
            kl = kl + factorised_kl(mean, var, p) - scale_log_ratio
            if self.local_reparameterisation:
                fmean, fvar = local_reparameterisation_moments(Phi, mean, var)
                if l == self.depth - 1:
                    samples.append(self.sample_last_layer(fmean, fvar, source))
                    return Propagation(samples=samples, mean=fmean, var=fvar, kl=kl)
                F = fmean + tf.sqrt(fvar) * source.normal(f"f/{l}", tf.shape(fmean), dtype)
            else:
                F = tf.linalg.matmul(Phi, q.sample(self._weight_noise(l, S, source, dtype)))
            samples.append(F)
        return Propagation(samples=samples, mean=F, var=tf.zeros_like(F), kl=kl)


class FactorisedGlobalPosterior(_WeightPosterior):
    """fac->gi: factorised lower layers and a global-inducing last layer (O&A 2021;
    docs/algorithms.md, "Posterior families", hybrids).

    The lower layers' weights are sampled explicitly (noise ``"w/{l}"``; no local
    reparameterisation, because the inducing rows must see the same weights as the data rows).
    ``U_0`` is propagated through every layer and the last layer's ``q(W_L)`` is the pseudo-data
    posterior on the propagated inducing features.

    With ``lower="prior"`` (rand->gi) the lower layers' weights are drawn from the prior and
    contribute no log-ratio (random-scale priors still learn ``q(s)``).

    :param layers: DenseLayers.
    :param inducing_inputs: ``U_0`` ``[M, D_0]``.
    :param pseudo_outputs: the last layer's ``[M, N_L]``; default ``N(0, 1)``.
    :param log_precision_init: the last layer's initial log-precision, a number or an array of
        the precision's shape (0).
    :param lower: ``"factorised"`` or ``"prior"``.
    :param means, variances: initial factorised moments of the lower layers (see
        :class:`FactorisedWeightPosterior`).
    :param precision: the last layer's ``Lambda`` kind (default ``"diagonal"``, per unit).
    :param kl: ``"sampled"`` (default) or ``"analytic"`` for the last layer's weights.
    :param last_layer: ``"marginal"`` (default): the last layer's weights are integrated out of
        the ELBO (its rows get their Gaussian marginal and its KL is analytic), or
        ``"sampled"`` (O&A's algorithm); see :class:`~deepgp_gi.posteriors.GlobalInducingPosterior`.
    :param rho: Adam re-scaling of the log-precisions (3).
    """

    LOWER = ("factorised", "prior")
    #: ``pseudo_data`` is the last layer's (read by :func:`~deepgp_gi.posteriors.counting.parameter_count`).
    _LAYER_OF_ATTRIBUTE = {"pseudo_data": -1}

    def __init__(
        self,
        layers,
        inducing_inputs,
        pseudo_outputs=None,
        log_precision_init=0.0,
        lower: str = "factorised",
        means: Optional[Sequence] = None,
        variances: Optional[Sequence] = None,
        precision: str = "diagonal",
        kl: str = "sampled",
        last_layer: str = "marginal",
        rho: float = 3.0,
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        super().__init__(layers, name=name, seed=seed)
        self.lower = check_choice(lower, "lower", self.LOWER)
        self.kl_mode = check_choice(kl, "kl", ("sampled", "analytic"))
        self.last_layer = check_choice(last_layer, "last_layer", LAST_LAYER_MODES)
        U0 = check_finite_array(inducing_inputs, "inducing_inputs", ndim=2)
        if U0.shape[1] != self.layers[0].input_dim:
            raise ValueError(f"inducing_inputs must have shape [M, {self.layers[0].input_dim}], got {U0.shape}")
        self.inducing_inputs = gpflow.Parameter(U0, name="inducing_inputs")
        M = U0.shape[0]
        rng = np.random.default_rng(seed)
        if lower == "factorised":
            self.weights = _factorised_weights(self.layers[:-1], means, variances, rng)
        else:
            if means is not None or variances is not None:
                raise ValueError("means/variances are only used with lower='factorised'")
            self.weights = []
        last = self.layers[-1]
        V = rng.standard_normal((M, last.output_dim)) if pseudo_outputs is None else pseudo_outputs
        V = check_finite_array(V, "pseudo_outputs", shape=(M, last.output_dim))
        if not isinstance(log_precision_init, np.ndarray):
            log_precision_init = check_float(log_precision_init, "log_precision_init")
        self.pseudo_data = PseudoData(V, check_choice(precision, "precision", PRECISIONS), log_precision_init,
                                      rho, name="pseudo_data")

    @property
    def num_inducing(self) -> int:
        return int(self.inducing_inputs.shape[0])

    def propagate(self, X, num_samples: int = 1, seed=None) -> Propagation:
        S, M = num_samples, self.num_inducing
        source, H = self._start(X, S, seed, top_rows=self.inducing_inputs)  # [S, M + N, D_0]
        dtype = H.dtype
        kl = tf.zeros([S], dtype)
        samples = []
        for l, layer in enumerate(self.layers):
            Phi = layer.features(H)
            p, scale_log_ratio = self.prior_precision(l, S, source, dtype)
            kl = kl - scale_log_ratio
            z = self._weight_noise(l, S, source, dtype)
            if l == self.depth - 1:
                step = weight_space_layer(self.pseudo_data, Phi, M, p, z, self.kl_mode,
                                          marginal=self.last_layer == "marginal")
                H = step.H
                kl = kl + regulariser(step.log_ratio, step.kl)
            else:
                if self.lower == "factorised":
                    mean, var = self.weights[l].moments()
                    W = self.weights[l].sample(z)
                    kl = kl + factorised_kl(mean, var, p)
                else:
                    W = z / tf.sqrt(p)[:, None, None]
                H = tf.linalg.matmul(Phi, W)
            samples.append(H[:, M:])
        if self.last_layer == "marginal":
            return Propagation(samples=samples, mean=step.mean, var=step.var, kl=kl)
        last = samples[-1]
        return Propagation(samples=samples, mean=last, var=tf.zeros_like(last), kl=kl)


class RandomGlobalPosterior(FactorisedGlobalPosterior):
    """rand->gi: lower-layer weights from the prior (log-ratio 0), global-inducing last layer."""

    def __init__(self, layers, inducing_inputs, pseudo_outputs=None, log_precision_init=0.0, **kwargs):
        super().__init__(layers, inducing_inputs, pseudo_outputs, log_precision_init, lower="prior", **kwargs)
