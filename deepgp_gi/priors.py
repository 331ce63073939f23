"""Priors over the weights of a BNN layer (ALGORITHMS.md §2.4, "Priors").

A layer ``l`` with fan-in ``D_l`` (bias column included) has weight columns
``w_lambda ~ N(0, P_l^{-1} I)``, ``P_l`` the prior precision:

* :class:`StandardPrior`: ``N(0, 1)`` weights, ``P_l = 1``;
* :class:`NealPrior`: ``N(0, sd^2/D_l)`` weights, ``P_l = D_l/sd^2`` (``sd = 1`` by default);
* :class:`ScalePrior`: a per-layer scale ``s ~ Gamma(2, 2)`` with ``P_l = D_l s`` (the paper's
  choice; ``power`` gives ``P_l = D_l s^power``). ``s`` is random: its approximate posterior
  ``q(s)`` is a variational parameter and lives in the posterior object
  (:class:`~deepgp_gi.posteriors.prior_scales.ScalePosterior`); the ELBO gains
  ``log p(s) - log q(s)`` per sample.

A prior states ``p`` only. Every weight-space posterior asks
:class:`~deepgp_gi.posteriors.prior_scales.PriorPrecisions` for the layer's precision once per
forward pass (fixed, or sampled from ``q(s)``), then builds ``q(W | P_l)`` with it.
"""
from __future__ import annotations

from typing import Optional

import gpflow
import numpy as np
import scipy.special
import tensorflow as tf
import tensorflow_probability as tfp


__all__ = ["WeightPrior", "StandardPrior", "NealPrior", "ScalePrior", "PRIORS", "make_prior"]


class WeightPrior(gpflow.Module):
    """Interface of a Gaussian weight prior with (optionally random) precision ``P_l``."""

    #: True when the precision is random (has its own approximate posterior).
    is_random: bool = False

    def weight_variance(self, fan_in: int) -> float:
        """Prior variance of one weight, ``E[P_l^{-1}]`` (the exact prior covariance scale of
        the pre-activations; for a random precision the weights are not Gaussian marginally)."""
        raise NotImplementedError

    def fixed_precision(self, fan_in: int) -> float:
        """The precision ``P_l`` of a prior whose precision is not random."""
        raise NotImplementedError(f"{type(self).__name__} has a random precision")


class _FixedPrior(WeightPrior):
    def weight_variance(self, fan_in: int) -> float:
        return 1.0 / self.fixed_precision(fan_in)


class StandardPrior(_FixedPrior):
    """``N(0, 1)`` weights: ``P_l = 1``. Pre-activations grow with the width."""

    def fixed_precision(self, fan_in: int) -> float:
        return 1.0


class NealPrior(_FixedPrior):
    """``N(0, sd^2/D_l)`` weights (Neal 1996): ``P_l = D_l / sd^2``, ``D_l`` the fan-in with the
    bias column. ``sd = 1`` (default) is O&A's prior; Ritter et al.'s 1-D toy uses ``sd = 4``
    (their "prior sd / sqrt(d_in)").

    :param sd: the standard deviation ``sigma_0`` of a weight times ``sqrt(D_l)``.
    """

    def __init__(self, sd: float = 1.0, name: Optional[str] = None):
        super().__init__(name=name)
        if isinstance(sd, bool) or not isinstance(sd, (int, float, np.integer, np.floating)) or not (
            np.isfinite(sd) and sd > 0
        ):
            raise ValueError(f"sd must be a positive finite number, got {sd!r}")
        self.sd = float(sd)

    def fixed_precision(self, fan_in: int) -> float:
        return float(fan_in) / self.sd**2


class ScalePrior(WeightPrior):
    """A learned per-layer scale: ``s ~ Gamma(2, 2)``, weights ``N(0, 1/(D_l s^power))``.

    The prior states ``p(s)`` and how ``s`` sets the precision; the approximate posterior
    ``q(s)`` belongs to the posterior object
    (:class:`~deepgp_gi.posteriors.prior_scales.ScalePosterior`), like every other variational
    parameter. ``power = 1`` is the paper's prior; ``power = -0.5`` reproduces the reference code's
    ``rsqrt`` parameterisation (ALGORITHMS.md §5 item 1).

    :param prior_concentration: shape of ``p(s)`` (2).
    :param prior_rate: rate of ``p(s)`` (2).
    :param power: ``P_l = D_l s^power``.
    """

    is_random = True

    def __init__(
        self,
        prior_concentration: float = 2.0,
        prior_rate: float = 2.0,
        power: float = 1.0,
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        if not (prior_concentration > 0 and prior_rate > 0):
            raise ValueError(
                f"prior_concentration and prior_rate must be positive, got {prior_concentration}, {prior_rate}"
            )
        if prior_concentration - power <= 0:
            raise ValueError(
                f"power {power} needs prior_concentration > power for a finite prior weight variance"
            )
        self.prior_concentration = float(prior_concentration)
        self.prior_rate = float(prior_rate)
        self.power = float(power)

    def prior_distribution(self, dtype: tf.DType) -> tfp.distributions.Gamma:
        """``p(s) = Gamma(prior_concentration, prior_rate)``."""
        return tfp.distributions.Gamma(
            tf.constant(self.prior_concentration, dtype), tf.constant(self.prior_rate, dtype)
        )

    def weight_variance(self, fan_in: int) -> float:
        # E_p[s^{-power}] for s ~ Gamma(a, b) is Gamma(a - power) / Gamma(a) * b^power.
        a, b, k = self.prior_concentration, self.prior_rate, self.power
        moment = float(np.exp(scipy.special.gammaln(a - k) - scipy.special.gammaln(a)) * b**k)
        return moment / float(fan_in)

    def precision_from_scale(self, fan_in: int, scale: tf.Tensor) -> tf.Tensor:
        """``P_l = D_l s^power`` for scales ``s`` ``[S]``."""
        return tf.constant(float(fan_in), scale.dtype) * tf.pow(scale, tf.constant(self.power, scale.dtype))


#: Names accepted by ``build_bnn(prior=...)``.
PRIORS = {"standard": StandardPrior, "neal": NealPrior, "scale": ScalePrior}


def make_prior(prior) -> WeightPrior:
    """A fresh prior from a name in :data:`PRIORS`, or ``prior`` itself if it is a WeightPrior."""
    if isinstance(prior, WeightPrior):
        return prior
    if isinstance(prior, str) and prior in PRIORS:
        return PRIORS[prior]()
    raise ValueError(f"unknown prior {prior!r}; choose one of {', '.join(map(repr, PRIORS))}")
