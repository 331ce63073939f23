"""Factorised weight posteriors for BNNs and their global-inducing hybrids (docs/algorithms.md,
"Posterior families").

* :class:`FactorisedWeightPosterior` -- ``q(W) = prod N(mu, sigma^2)`` (fac), with the local
  reparameterisation by default;
* :class:`FactorisedGlobalPosterior` -- fac->gi: factorised lower layers, sampled explicitly, and
  a global-inducing last layer (:func:`~.weight_space.weight_space_layer`);
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
``log(D sigma^2)``. The factorised weights, their KL and the local reparameterisation are the
maths of :mod:`.weight_space`, shared with the convolutional families.
"""

from __future__ import annotations

from typing import Optional, Sequence

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import inherit_check_shapes

from ..initialisation import global_inducing_rows
from ..validation import check_bool, check_choice, check_finite_array, check_float
from .base import Propagation
from .pseudo_data import KL_MODES, LAST_LAYER_MODES, PRECISIONS, PseudoData, regulariser
from .weight_space import (
    FactorisedWeights,
    WeightSpacePosterior,
    factorised_kl,
    factorised_weights,
    local_reparameterisation_moments,
    weight_space_layer,
)

__all__ = [
    "FactorisedWeightPosterior",
    "FactorisedGlobalPosterior",
    "RandomGlobalPosterior",
    # re-exported from .weight_space, where they live
    "FactorisedWeights",
    "factorised_kl",
    "local_reparameterisation_moments",
]


class FactorisedWeightPosterior(WeightSpacePosterior):
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

    options = ("local_reparameterisation",)
    summary = "factorised Gaussian weights (fac)"

    @classmethod
    def from_data(cls, layers, X, Y, *, num_inducing, seed, **options):
        """Factorised Gaussian weights: the posterior draws its initial means ``N(0, 1/fan_in)``
        (variances ``1e-3/fan_in``) from ``seed``; ``X``, ``Y`` and ``num_inducing``
        are not used."""
        return cls(layers, seed=seed, **options)

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
        self.weights = factorised_weights(
            self.layers, means, variances, np.random.default_rng(seed)
        )
        self.local_reparameterisation = check_bool(
            local_reparameterisation, "local_reparameterisation"
        )

    @inherit_check_shapes
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


class FactorisedGlobalPosterior(WeightSpacePosterior):
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
    :param means: initial factorised means of the lower layers (see
        :class:`FactorisedWeightPosterior`).
    :param variances: their initial variances.
    :param precision: the last layer's ``Lambda`` kind (default ``"diagonal"``, per unit).
    :param kl: ``"sampled"`` (default) or ``"analytic"`` for the last layer's weights.
    :param last_layer: ``"marginal"`` (default): the last layer's weights are integrated out of
        the ELBO (its rows get their Gaussian marginal and its KL is analytic), or
        ``"sampled"`` (O&A's algorithm); see :class:`~deepgp_gi.posteriors.GlobalInducingPosterior`.
    :param rho: Adam re-scaling of the log-precisions (3).
    """

    options = ("precision", "kl", "last_layer", "rho")
    summary = "factorised lower layers, global-inducing last layer (fac->gi)"

    @classmethod
    def from_data(cls, layers, X, Y, *, num_inducing, seed, **options):
        """Factorised (or prior) lower layers and a global-inducing last layer whose rows come from
        :func:`~deepgp_gi.initialisation.global_inducing_rows`, log-precision 0."""
        rng = np.random.default_rng(seed)
        U0, V_top = global_inducing_rows(np.asarray(X), np.asarray(Y), num_inducing, rng)
        return cls(layers, U0, V_top, log_precision_init=0.0, seed=seed, **options)

    LOWER = ("factorised", "prior")
    #: ``pseudo_data`` is the last layer's (read
    #: by :func:`~deepgp_gi.posteriors.counting.parameter_count`).
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
        self.kl_mode = check_choice(kl, "kl", KL_MODES)
        self.last_layer = check_choice(last_layer, "last_layer", LAST_LAYER_MODES)
        U0 = check_finite_array(inducing_inputs, "inducing_inputs", ndim=2)
        if U0.shape[1] != self.layers[0].input_dim:
            raise ValueError(
                f"inducing_inputs must have shape [M, {self.layers[0].input_dim}], got {U0.shape}"
            )
        self.inducing_inputs = gpflow.Parameter(U0, name="inducing_inputs")
        M = U0.shape[0]
        rng = np.random.default_rng(seed)
        if lower == "factorised":
            self.weights = factorised_weights(self.layers[:-1], means, variances, rng)
        else:
            if means is not None or variances is not None:
                raise ValueError("means/variances are only used with lower='factorised'")
            self.weights = []
        last = self.layers[-1]
        V = rng.standard_normal((M, last.output_dim)) if pseudo_outputs is None else pseudo_outputs
        V = check_finite_array(V, "pseudo_outputs", shape=(M, last.output_dim))
        if not isinstance(log_precision_init, np.ndarray):
            log_precision_init = check_float(log_precision_init, "log_precision_init")
        self.pseudo_data = PseudoData(
            V,
            check_choice(precision, "precision", PRECISIONS),
            log_precision_init,
            rho,
            name="pseudo_data",
        )

    @property
    def num_inducing(self) -> int:
        return int(self.inducing_inputs.shape[0])

    @inherit_check_shapes
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
                step = weight_space_layer(
                    self.pseudo_data,
                    Phi,
                    M,
                    p,
                    z,
                    self.kl_mode,
                    marginal=self.last_layer == "marginal",
                )
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

    summary = "prior lower layers, global-inducing last layer (rand->gi)"

    def __init__(
        self, layers, inducing_inputs, pseudo_outputs=None, log_precision_init=0.0, **kwargs
    ):
        super().__init__(
            layers, inducing_inputs, pseudo_outputs, log_precision_init, lower="prior", **kwargs
        )
