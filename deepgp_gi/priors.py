"""Priors over the weights of a BNN layer (ALGORITHMS.md §2.4, "Priors").

A layer ``l`` with fan-in ``D_l`` (bias column included) has weight columns
``w_lambda ~ N(0, P_l^{-1} I)``, ``P_l`` the prior precision:

* :class:`StandardPrior`: ``N(0, 1)`` weights, ``P_l = 1``;
* :class:`NealPrior`: ``N(0, 1/D_l)`` weights, ``P_l = D_l``;
* :class:`ScalePrior`: a per-layer scale ``s ~ Gamma(2, 2)`` with ``P_l = D_l s`` (the paper's
  choice; ``power`` gives ``P_l = D_l s^power``). ``s`` is random, so the prior object also holds
  its approximate posterior ``q(s) = Gamma(2 + e^a, 2 + e^b)`` (``a = b = 6`` initially), sampled
  with a reparameterised Gamma draw; the ELBO gains ``log p(s) - log q(s)`` per sample.

Every posterior family asks its layer's prior for :meth:`WeightPrior.sample_precision` once per
forward pass, then builds ``q(W | P_l)`` with the (possibly sampled) precision. A prior instance
belongs to one layer: share one between layers only if the layers should share ``s``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import gpflow
import numpy as np
import scipy.special
import tensorflow as tf
import tensorflow_probability as tfp

from .noise import NoiseSource

__all__ = ["WeightPrior", "StandardPrior", "NealPrior", "ScalePrior", "PRIORS", "make_prior"]


class WeightPrior(gpflow.Module):
    """Interface of a Gaussian weight prior with (optionally random) precision ``P_l``."""

    #: True when the precision is random (has its own approximate posterior).
    is_random: bool = False

    def weight_variance(self, fan_in: int) -> float:
        """Prior variance of one weight, ``E[P_l^{-1}]`` (the exact prior covariance scale of
        the pre-activations; for a random precision the weights are not Gaussian marginally)."""
        raise NotImplementedError

    def sample_precision(
        self, fan_in: int, num_samples: int, noise_source: NoiseSource, name: str, dtype: tf.DType
    ) -> Tuple[tf.Tensor, tf.Tensor]:
        """The prior precision of the weight columns for each of S samples.

        :param fan_in: ``D_l`` (bias column included).
        :param num_samples: S.
        :param noise_source: where random draws come from (a Gamma draw named ``name`` for
            :class:`ScalePrior`; nothing is drawn by the fixed priors).
        :param name: the noise name of this layer's hyper-parameter draw, e.g. ``"s/0"``.
        :param dtype: float dtype of the result.
        :return: ``(precision [S], log_ratio [S])`` where ``log_ratio = log p(s) - log q(s)``
            (zeros for fixed priors).
        """
        raise NotImplementedError


class _FixedPrior(WeightPrior):
    def _precision(self, fan_in: int) -> float:
        raise NotImplementedError

    def weight_variance(self, fan_in: int) -> float:
        return 1.0 / self._precision(fan_in)

    def sample_precision(self, fan_in, num_samples, noise_source, name, dtype):
        precision = tf.fill([num_samples], tf.constant(self._precision(fan_in), dtype))
        return precision, tf.zeros([num_samples], dtype)


class StandardPrior(_FixedPrior):
    """``N(0, 1)`` weights: ``P_l = 1``. Pre-activations grow with the width."""

    def _precision(self, fan_in: int) -> float:
        return 1.0


class NealPrior(_FixedPrior):
    """``N(0, 1/D_l)`` weights (Neal 1996): ``P_l = D_l``, the fan-in with the bias column."""

    def _precision(self, fan_in: int) -> float:
        return float(fan_in)


class ScalePrior(WeightPrior):
    """A learned per-layer scale: ``s ~ Gamma(2, 2)``, weights ``N(0, 1/(D_l s^power))``.

    The approximate posterior is ``q(s) = Gamma(2 + exp(alpha), 2 + exp(beta))`` (shape, rate);
    ``alpha`` and ``beta`` are unconstrained parameters initialised to 6, so ``q`` starts
    concentrated near 1. ``power = 1`` is the paper's prior; ``power = -0.5`` reproduces the
    reference code's ``rsqrt`` parameterisation (ALGORITHMS.md §5 item 1).

    :param prior_concentration: shape of ``p(s)`` (2).
    :param prior_rate: rate of ``p(s)`` (2).
    :param alpha_init: initial ``alpha`` (6).
    :param beta_init: initial ``beta`` (6).
    :param power: ``P_l = D_l s^power``.
    """

    is_random = True

    def __init__(
        self,
        prior_concentration: float = 2.0,
        prior_rate: float = 2.0,
        alpha_init: float = 6.0,
        beta_init: float = 6.0,
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
        self.alpha = gpflow.Parameter(float(alpha_init), name="alpha")
        self.beta = gpflow.Parameter(float(beta_init), name="beta")

    def prior_distribution(self, dtype: tf.DType) -> tfp.distributions.Gamma:
        """``p(s) = Gamma(prior_concentration, prior_rate)``."""
        return tfp.distributions.Gamma(
            tf.constant(self.prior_concentration, dtype), tf.constant(self.prior_rate, dtype)
        )

    def posterior_distribution(self) -> tfp.distributions.Gamma:
        """``q(s) = Gamma(2 + exp(alpha), 2 + exp(beta))`` in the parameters' dtype."""
        dtype = self.alpha.dtype
        two = tf.constant(2.0, dtype)
        return tfp.distributions.Gamma(two + tf.exp(self.alpha), two + tf.exp(self.beta))

    def weight_variance(self, fan_in: int) -> float:
        # E_p[s^{-power}] for s ~ Gamma(a, b) is Gamma(a - power) / Gamma(a) * b^power.
        a, b, k = self.prior_concentration, self.prior_rate, self.power
        moment = float(np.exp(scipy.special.gammaln(a - k) - scipy.special.gammaln(a)) * b**k)
        return moment / float(fan_in)

    def sample_scale(self, num_samples: int, noise_source: NoiseSource, name: str, dtype: tf.DType):
        """Reparameterised draws ``s ~ q(s)`` ``[S]`` and ``log p(s) - log q(s)`` ``[S]``."""
        q = self.posterior_distribution()
        concentration = tf.cast(q.concentration, dtype)
        rate = tf.cast(q.rate, dtype)
        g = noise_source.gamma(name, [num_samples], concentration, dtype)  # Gamma(conc, 1)
        s = g / rate
        log_q = tfp.distributions.Gamma(concentration, rate).log_prob(s)
        log_p = self.prior_distribution(dtype).log_prob(s)
        return s, log_p - log_q

    def sample_precision(self, fan_in, num_samples, noise_source, name, dtype):
        s, log_ratio = self.sample_scale(num_samples, noise_source, name, dtype)
        precision = tf.constant(float(fan_in), dtype) * tf.pow(s, tf.constant(self.power, dtype))
        return precision, log_ratio


#: Names accepted by ``build_bnn(prior=...)``.
PRIORS = {"standard": StandardPrior, "neal": NealPrior, "scale": ScalePrior}


def make_prior(prior) -> WeightPrior:
    """A fresh prior from a name in :data:`PRIORS`, or ``prior`` itself if it is a WeightPrior."""
    if isinstance(prior, WeightPrior):
        return prior
    if isinstance(prior, str) and prior in PRIORS:
        return PRIORS[prior]()
    raise ValueError(f"unknown prior {prior!r}; choose one of {', '.join(map(repr, PRIORS))}")
