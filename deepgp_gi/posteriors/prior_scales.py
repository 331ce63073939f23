"""The weight prior's precision inside a posterior, and ``q(s)`` for random-scale priors.

A BNN layer's prior (:mod:`deepgp_gi.priors`) states ``p``: a fixed precision ``P_l`` (Standard,
Neal) or a random scale ``s`` with ``P_l = D_l s^power`` (Scale). The approximate posterior of a
random scale, ``q(s) = Gamma(2 + e^alpha, 2 + e^beta)`` (``alpha = beta = 6`` initially, so ``q``
starts concentrated near 1), is a variational parameter and so lives here, in the posterior.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import gpflow
import tensorflow as tf
import tensorflow_probability as tfp

from ..noise import NoiseSource

__all__ = ["ScalePosterior", "PriorPrecisions"]


class ScalePosterior(gpflow.Module):
    """``q(s) = Gamma(2 + exp(alpha), 2 + exp(beta))`` (shape, rate) for one layer's scale.

    :param alpha_init: initial ``alpha`` (6).
    :param beta_init: initial ``beta`` (6).
    """

    def __init__(self, alpha_init: float = 6.0, beta_init: float = 6.0, name: Optional[str] = None):
        super().__init__(name=name)
        self.alpha = gpflow.Parameter(float(alpha_init), name="alpha")
        self.beta = gpflow.Parameter(float(beta_init), name="beta")

    def distribution(self) -> tfp.distributions.Gamma:
        """``q(s)`` in the parameters' dtype."""
        two = tf.constant(2.0, self.alpha.dtype)
        return tfp.distributions.Gamma(two + tf.exp(self.alpha), two + tf.exp(self.beta))

    def sample_scale(self, prior, num_samples: int, noise_source: NoiseSource, name: str, dtype: tf.DType):
        """Reparameterised draws ``s ~ q(s)`` ``[S]`` and ``log p(s) - log q(s)`` ``[S]``.

        :param prior: the layer's :class:`~deepgp_gi.priors.ScalePrior` (gives ``p(s)``).
        :param name: the noise name of the Gamma draw, e.g. ``"s/0"``.
        """
        q = self.distribution()
        concentration = tf.cast(q.concentration, dtype)
        rate = tf.cast(q.rate, dtype)
        g = noise_source.gamma(name, [num_samples], concentration, dtype)  # Gamma(conc, 1)
        s = g / rate
        log_q = tfp.distributions.Gamma(concentration, rate).log_prob(s)
        return s, prior.prior_distribution(dtype).log_prob(s) - log_q


class PriorPrecisions:
    """Mixin for weight-space posteriors: one :class:`ScalePosterior` per random-scale layer
    (``self.scale_posteriors``, ``None`` for fixed priors) and :meth:`prior_precision`."""

    def _init_prior_precisions(self, layers: Sequence) -> None:
        posteriors: List[Optional[ScalePosterior]] = []
        for layer in layers:
            prior = getattr(layer, "prior", None)
            posteriors.append(ScalePosterior() if (prior is not None and prior.is_random) else None)
        self.scale_posteriors = posteriors

    @property
    def _prior_layers(self) -> Sequence:
        """The layers ``l`` indexes: every layer (a network with weightless layers overrides it)."""
        return self.layers

    def prior_precision(self, l: int, num_samples: int, noise_source: NoiseSource, dtype: tf.DType
                        ) -> Tuple[tf.Tensor, tf.Tensor]:
        """Layer ``l``'s weight precision per sample ``[S]`` and ``log p(s) - log q(s)`` ``[S]``
        (zeros for a fixed prior; the Gamma draw is named ``"s/{l}"``)."""
        layer = self._prior_layers[l]
        q = self.scale_posteriors[l]
        if q is None:
            precision = tf.fill([num_samples], tf.constant(layer.prior.fixed_precision(layer.fan_in), dtype))
            return precision, tf.zeros([num_samples], dtype)
        s, log_ratio = q.sample_scale(layer.prior, num_samples, noise_source, f"s/{l}", dtype)
        return layer.prior.precision_from_scale(layer.fan_in, s), log_ratio
