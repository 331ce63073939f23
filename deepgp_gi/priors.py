"""Priors over the weights of a BNN layer (docs/algorithms.md, "Priors").

A layer ``l`` with fan-in ``D_l`` (bias column included) has weight columns
``w_lambda ~ N(0, P_l^{-1} I)``, ``P_l`` the prior precision:

* :class:`StandardPrior`: ``N(0, 1)`` weights, ``P_l = 1``;
* :class:`NealPrior`: ``N(0, sd^2/D_l)`` weights, ``P_l = D_l/sd^2`` (``sd = 1`` by default);
* :class:`ScalePrior`: a per-layer scale ``s ~ Gamma(2, 2)`` with ``P_l = D_l s`` (the paper's
  choice; ``power`` gives ``P_l = D_l s^power``). ``s`` is random: its approximate posterior
  ``q(s)`` is a variational parameter and lives in the posterior object
  (:class:`~deepgp_gi.posteriors.prior_scales.ScalePosterior`); the ELBO gains
  ``log p(s) - log q(s)`` per sample;
* :class:`SpatialIWPrior`: a random ``p x p`` spatial matrix ``L ~ IW(nu0 I, nu0)``,
  ``nu0 = p + 1``, over the ``p = k^2`` offsets of a ``k x k`` convolution, with precision
  ``P_l = D_l (L kron I_C)`` (O&A 2021 §2.3, Eq. 19, App. D). For a dense layer ``p = 1`` and
  ``P_l = D_l L`` with ``L ~ InvGamma(1, 1)``. Its ``q(L)`` is
  :class:`~deepgp_gi.posteriors.prior_scales.SpatialIWPosterior`; the ELBO gains
  ``log p(L) - log q(L)`` per sample.

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

from .validation import check_positive_int
from .wishart import inverse_wishart_log_prob, kron_identity

__all__ = [
    "WeightPrior",
    "StandardPrior",
    "NealPrior",
    "ScalePrior",
    "SpatialIWPrior",
    "PRIORS",
    "make_prior",
]


class WeightPrior(gpflow.Module):
    """Interface of a Gaussian weight prior with (optionally random) precision ``P_l``."""

    #: True when the precision is random (has its own approximate posterior).
    is_random: bool = False
    #: True when the random precision is a matrix over kernel offsets (:class:`SpatialIWPrior`)
    #: rather than a scalar scale.
    is_spatial: bool = False

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
        if (
            isinstance(sd, bool)
            or not isinstance(sd, (int, float, np.integer, np.floating))
            or not (np.isfinite(sd) and sd > 0)
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
    ``rsqrt`` parameterisation (docs/algorithms.md, "Paper versus reference code", item 1).

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
                f"prior_concentration and prior_rate must be positive, got {prior_concentration}, "
                f"{prior_rate}"
            )
        if prior_concentration - power <= 0:
            raise ValueError(
                f"power {power} needs prior_concentration > power for a finite prior weight "
                "variance"
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
        return tf.constant(float(fan_in), scale.dtype) * tf.pow(
            scale, tf.constant(self.power, scale.dtype)
        )


class SpatialIWPrior(WeightPrior):
    """The spatial inverse-Wishart prior (O&A 2021 §2.3, Eq. 19, App. D; docs/algorithms.md,
    "Priors").

    A layer's weights have the random precision ``P_l = D_l (L kron I_C)``, ``L`` a ``p x p``
    matrix over the ``p = k^2`` offsets of a ``k x k`` convolution with ``C`` input channels, and

        ``p(L) = IW(nu0 I_p, nu0)``, ``nu0 = p + 1``

    (the standard inverse Wishart with scale ``nu0 I``: bayesfunc's mean-parameterised
    ``IW(I, nu0)``, docs/algorithms.md, "Paper versus reference code", items 2 and 10; O&A's
    Eq. 19 writes the fan-in where the code uses ``p``, the fan-in being folded into ``D_l``).
    ``E[L]`` does not exist at ``nu0 = p + 1``,
    but ``L^{-1} ~ W(I/nu0, nu0)`` has ``E[L^{-1}] = I``, so every weight has prior variance
    ``E[P_l^{-1}]_ii = 1/D_l``, the NealPrior's.

    Feature order is offset-major (feature index = offset index * C + channel, bias last): the
    ``p C`` patch weights have precision ``D_l (L kron I_C)`` and the bias weight ``D_l`` (the
    paper gives the bias no spatial structure; we keep the NealPrior precision for it). For a
    dense layer ``p = 1``: ``L`` is a scalar with ``L ~ InvGamma(nu0/2 = 1, scale nu0/2 = 1)`` and
    every weight, bias included, has precision ``D_l L``.

    The approximate posterior ``q(L)`` is a variational parameter and lives in the posterior
    object (:class:`~deepgp_gi.posteriors.prior_scales.SpatialIWPosterior`).
    """

    is_random = True
    is_spatial = True

    def dof(self, dim: int) -> float:
        """``nu0 = p + 1`` for a ``p x p`` spatial matrix."""
        return float(check_positive_int(dim, "dim") + 1)

    def scale_tril(self, dim: int, dtype: tf.DType) -> tf.Tensor:
        """The Cholesky factor ``sqrt(nu0) I_p`` of the prior scale ``nu0 I_p``."""
        dim = check_positive_int(dim, "dim")
        return tf.eye(dim, dtype=dtype) * tf.constant(np.sqrt(self.dof(dim)), dtype)

    def log_prob(self, L: tf.Tensor, L_tril: Optional[tf.Tensor] = None) -> tf.Tensor:
        """``log p(L) = log IW(L; nu0 I, nu0)`` for ``L`` ``[..., p, p]`` (``p`` from the shape;
        ``L_tril = chol(L)`` if known)."""
        L = tf.convert_to_tensor(L)
        p = int(L.shape[-1])
        return inverse_wishart_log_prob(L, self.scale_tril(p, L.dtype), self.dof(p), X_tril=L_tril)

    def weight_variance(self, fan_in: int) -> float:
        # E[L^{-1}] = nu0 (nu0 I)^{-1} = I for L^{-1} ~ W((nu0 I)^{-1}, nu0), so E[P^{-1}]_ii = 1/D.
        return 1.0 / float(fan_in)

    def dense_precision(self, fan_in: int, L: tf.Tensor) -> tf.Tensor:
        """``P_l = D_l L`` ``[S]`` of a dense layer (``p = 1``) from ``L`` ``[S, 1, 1]``."""
        if L.shape[-1] != 1 or L.shape[-2] != 1:
            raise ValueError(f"a dense layer's spatial matrix is 1 x 1, got L of shape {L.shape}")
        return tf.constant(float(fan_in), L.dtype) * L[:, 0, 0]

    def conv_precision(self, L: tf.Tensor, channels: int, bias: bool = True) -> tf.Tensor:
        """The full precision ``[S, D, D]`` of a conv layer's weight columns, ``D = p C + bias``:
        ``D (L kron I_C)`` on the patch weights (offset-major) and ``D`` for the bias weight.

        :param L: ``[S, p, p]`` spatial matrices.
        :param channels: ``C``, the number of input channels.
        :param bias: whether the features end with a bias column.
        """
        channels = check_positive_int(channels, "channels")
        p = int(L.shape[-1])
        D = p * channels + int(bool(bias))
        patch = tf.constant(float(D), L.dtype) * kron_identity(L, channels)  # [S, pC, pC]
        if not bias:
            return patch
        S = tf.shape(L)[0]
        pc = p * channels
        top = tf.concat([patch, tf.zeros([S, pc, 1], L.dtype)], axis=2)
        bottom = tf.concat(
            [tf.zeros([S, 1, pc], L.dtype), tf.fill([S, 1, 1], tf.constant(float(D), L.dtype))],
            axis=2,
        )
        return tf.concat([top, bottom], axis=1)


#: Names accepted by ``build_bnn(prior=...)``.
PRIORS = {
    "standard": StandardPrior,
    "neal": NealPrior,
    "scale": ScalePrior,
    "spatial_iw": SpatialIWPrior,
}


def make_prior(prior) -> WeightPrior:
    """A fresh prior from a name in :data:`PRIORS`, or ``prior`` itself if it is a WeightPrior."""
    if isinstance(prior, WeightPrior):
        return prior
    if isinstance(prior, str) and prior in PRIORS:
        return PRIORS[prior]()
    raise ValueError(f"unknown prior {prior!r}; choose one of {', '.join(map(repr, PRIORS))}")
