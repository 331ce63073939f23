"""Weight-space maths shared by the BNN posterior families.

* :func:`has_feature_map` -- whether a layer is a BNN layer (a finite feature map and a weight
  prior), i.e. whether its weights can be the variables of a posterior;
* :class:`WeightSpacePosterior` -- the base of the posteriors over the weights of DenseLayers (or
  of the weighted layers of a convolutional network): layer checks and prior precisions;
* :class:`FactorisedWeights`, :func:`factorised_weights`, :func:`factorised_kl` and
  :func:`local_reparameterisation_moments` -- factorised Gaussian weights
  ``q(W) = prod N(mu, sigma^2)``, their KL to the weight prior and the moments of ``Phi W``;
* :func:`weight_space_layer` (returning a :class:`WeightSpaceStep`) -- one inducing layer in
  weight space: the pseudo-data posterior of the weights on the inducing rows
  (:mod:`.pseudo_data`), a weight sample, and every row pushed through it.

Conventions: ``S`` samples, ``N`` data rows, ``M`` inducing rows, ``D`` = fan-in with the bias
column, ``P`` = the layer's width; weights are ``[S, D, P]`` (column ``lambda`` is unit
``lambda``). Factorised means are stored times ``sqrt(D)`` and variances as ``log(D sigma^2)``
(O&A App. H).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

from ..layers import WeightedLayer, check_network, is_convolution
from ..linalg import safe_cholesky
from ..validation import check_finite_array, per_layer_list
from .base import DeepPosterior
from .prior_scales import PriorPrecisions
from .pseudo_data import PseudoData, draw_weights, marginal_variance

__all__ = [
    "has_feature_map",
    "WeightSpacePosterior",
    "FactorisedWeights",
    "factorised_weights",
    "factorised_kl",
    "local_reparameterisation_moments",
    "WeightSpaceStep",
    "weight_space_layer",
]


def has_feature_map(layer) -> bool:
    """Whether the layer's kernel is an explicit finite feature map with a weight prior (BNN): a
    :class:`~deepgp_gi.layers.WeightedLayer` (DenseLayer, Conv2DLayer)."""
    return isinstance(layer, WeightedLayer)


# ============================================================================ the posterior base


class WeightSpacePosterior(DeepPosterior, PriorPrecisions):
    """Checks that every layer is a DenseLayer and sets up the prior precisions.

    A subclass with ``_CONV_NETWORKS = True`` also accepts a convolutional network
    (:func:`~deepgp_gi.layers.check_network`: convolutions, deterministic layers, residual
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
                        f"layers[{i}] is a {type(layer).__name__}; weight-space posteriors need "
                        "DenseLayer layers (a feature map and a weight prior)"
                    )
            weighted = self.layers
        else:
            weighted = check_network(self.layers, self.family_name)
        self._init_prior_precisions(weighted, seed)

    def _weight_noise(self, l: int, S: int, source, dtype):
        """Standard-normal noise ``"w/{l}"`` ``[S, D_l, N_l]`` for layer ``l``'s weights."""
        layer = self.layers[l]
        return source.normal(f"w/{l}", [S, layer.fan_in, layer.output_dim], dtype)


# ============================================================================ factorised weights


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
        self.log_variance_scaled = gpflow.Parameter(
            np.log(variance * D), name="weight_log_variance_scaled"
        )

    def moments(self):
        """Mean and variance ``[D, P]`` of the weights."""
        D = tf.constant(float(self.fan_in), self.mean_scaled.dtype)
        return self.mean_scaled / tf.sqrt(D), tf.exp(self.log_variance_scaled) / D

    def sample(self, z):
        """Weights ``mean + sd * z`` for standard-normal ``z`` ``[S, D, P]``."""
        mean, var = self.moments()
        return mean + tf.sqrt(var) * z


def factorised_weights(
    layers, means, variances, rng: np.random.Generator
) -> List[FactorisedWeights]:
    """Per-layer :class:`FactorisedWeights` with their initial values; defaults: means
    ``N(0, 1/D)`` (NealPrior draws from ``rng``) and variances ``1e-3 / D`` (O&A code,
    docs/algorithms.md, "Paper versus reference code", item 3)."""
    out = []
    for layer, mean, var in zip(
        layers,
        per_layer_list(means, "means", len(layers)),
        per_layer_list(variances, "variances", len(layers)),
    ):
        D, P = layer.fan_in, layer.output_dim
        default_mean = rng.standard_normal((D, P)) / np.sqrt(D)
        mean = default_mean if mean is None else np.asarray(mean, dtype=np.float64)
        if mean.shape != (D, P):
            raise ValueError(f"means entries must have shape {(D, P)}, got {mean.shape}")
        out.append(FactorisedWeights(mean, 1e-3 / D if var is None else var))
    return out


# ============================================================================ inducing layer


class WeightSpaceStep(NamedTuple):
    """What :func:`weight_space_layer` returns.

    :ivar H: ``Phi W`` ``[S, M + N, P]`` for the sampled weights.
    :ivar log_ratio: ``log p(W) - log q(W)`` ``[S]``.
    :ivar kl: the analytic KL given ``P_l`` ``[S]`` (``kl_mode="analytic"`` or ``marginal``;
        else None).
    :ivar mean: with ``marginal``: ``Phi E[W]`` ``[S, N, P]`` for the data rows (the rows after
        the first ``num_inducing``) with the weights integrated out (else None).
    :ivar var: with ``marginal``: their variance ``diag(Phi Prec^{-1} Phi^T)`` per unit
        ``[S, N, P]`` (else None).
    """

    H: tf.Tensor
    log_ratio: tf.Tensor
    kl: Optional[tf.Tensor]
    mean: Optional[tf.Tensor]
    var: Optional[tf.Tensor]


def weight_space_layer(
    pseudo: PseudoData,
    Phi: tf.Tensor,
    num_inducing: int,
    prior_precision: tf.Tensor,
    z: tf.Tensor,
    kl_mode: str,
    marginal: bool = False,
) -> WeightSpaceStep:
    """One weight-space inducing layer: the pseudo-data posterior of the weights on the first
    ``num_inducing`` rows of ``Phi`` ``[S, M + N, D]``, a weight sample from ``z`` ``[S, D, P]``,
    and the rows pushed through it. With ``marginal``, also the rows' Gaussian marginal with the
    weights integrated out, and the analytic KL whatever ``kl_mode`` is (see
    :class:`WeightSpaceStep`).
    """
    L, mean = pseudo.posterior(Phi[:, :num_inducing], prior_precision)
    W, log_ratio, kl = draw_weights(
        L, mean, z, prior_precision, analytic=kl_mode == "analytic" or marginal
    )
    rows_mean = rows_var = None
    if marginal:
        Phi_rows = Phi[:, num_inducing:]
        rows_mean = tf.linalg.matmul(Phi_rows, mean)
        rows_var = marginal_variance(L, tf.linalg.matrix_transpose(Phi_rows), tf.shape(mean)[-1])
    return WeightSpaceStep(tf.linalg.matmul(Phi, W), log_ratio, kl, rows_mean, rows_var)
