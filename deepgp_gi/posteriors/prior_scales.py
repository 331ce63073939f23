"""The weight prior's precision inside a posterior, ``q(s)`` for random-scale priors and ``q(L)``
for the spatial inverse-Wishart prior.

A BNN layer's prior (:mod:`deepgp_gi.priors`) states ``p``: a fixed precision ``P_l`` (Standard,
Neal), a random scale ``s`` with ``P_l = D_l s^power`` (Scale) or a random spatial matrix ``L``
with ``P_l = D_l (L kron I_C)`` (SpatialIW; ``p = 1`` and ``P_l = D_l L`` for dense layers). The
approximate posteriors of these random quantities are variational parameters and so live here,
in the posterior:

* ``q(s) = Gamma(2 + e^alpha, 2 + e^beta)`` (:class:`ScalePosterior`; ``alpha = beta = 6``
  initially, so ``q`` starts concentrated near 1);
* ``q(L) = IW(nu0 I + Psi, nu0 + nu)`` from ``p`` weighted pseudo-observations
  (:class:`SpatialIWPosterior`; initially almost the prior).
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

import gpflow
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from ..linalg import safe_cholesky
from ..noise import NoiseSource
from ..validation import check_finite_array, check_float, check_positive_int
from ..wishart import bartlett_factor, bartlett_inverse_wishart_log_prob, kron_identity

__all__ = [
    "ScalePosterior",
    "SpatialIWPosterior",
    "SpatialIWSample",
    "PriorPrecisions",
    "kron_identity",
]


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

    def sample_scale(
        self, prior, num_samples: int, noise_source: NoiseSource, name: str, dtype: tf.DType
    ):
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


class SpatialIWSample(NamedTuple):
    """``S`` draws ``L ~ q(L)`` of :meth:`SpatialIWPosterior.sample_full` and their densities.

    :ivar L: ``[S, p, p]`` the spatial matrices (symmetric positive definite).
    :ivar factor: ``[S, p, p]`` ``B = C A^{-T}`` with ``L = B B^T`` (not triangular).
    :ivar bartlett: ``[S, p, p]`` the Bartlett factors ``A`` of ``G = A A^T ~ W(I, nu_q)``.
    :ivar log_det: ``[S]`` ``log|L| = log|C C^T| - 2 sum log A_jj``.
    :ivar log_prior: ``[S]`` ``log p(L)``.
    :ivar log_posterior: ``[S]`` ``log q(L)``.
    """

    L: tf.Tensor
    factor: tf.Tensor
    bartlett: tf.Tensor
    log_det: tf.Tensor
    log_prior: tf.Tensor
    log_posterior: tf.Tensor

    @property
    def log_ratio(self) -> tf.Tensor:
        """``log p(L) - log q(L)`` ``[S]``."""
        return self.log_prior - self.log_posterior


class SpatialIWPosterior(gpflow.Module):
    """``q(L) = IW(nu0 I + Psi, nu0 + nu)`` for one layer's ``p x p`` spatial matrix ``L``
    (O&A 2021 §2.3, App. D; docs/algorithms.md, "Priors").

    ``Psi = (1/p) sum_j w_j y_j y_j^T`` and ``nu = sum_j w_j`` come from ``p`` learned
    pseudo-observations ``y_j`` (the rows of ``pseudo_observations`` ``[p, p]``) with weights
    ``w_j = exp(omega_j)`` (``log_weights`` ``[p]``): the conjugate update of ``p(L) =
    IW(nu0 I, nu0)`` by weighted observations. ``nu0 = prior.dof(p) = p + 1`` comes from the
    layer's :class:`~deepgp_gi.priors.SpatialIWPrior`. The reference initialisation is
    ``y ~ N(0, 1)`` and ``omega = -5``, so ``q`` starts close to the prior.

    :param dim: ``p`` (``k^2`` for a ``k x k`` convolution, 1 for a dense layer).
    :param pseudo_observations: initial ``y`` ``[p, p]``; default ``N(0, 1)`` from ``seed``.
    :param log_weights_init: initial ``omega``, a number or ``[p]`` (-5).
    :param seed: seed of the NumPy generator for the default ``y``.
    """

    def __init__(
        self,
        dim: int,
        pseudo_observations=None,
        log_weights_init: Union[float, Sequence[float], np.ndarray] = -5.0,
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        p = check_positive_int(dim, "dim")
        self.dim = p
        if pseudo_observations is None:
            y = np.random.default_rng(seed).standard_normal((p, p))
        else:
            y = check_finite_array(pseudo_observations, "pseudo_observations", shape=(p, p))
        if np.ndim(log_weights_init) == 0:
            omega = np.full([p], check_float(log_weights_init, "log_weights_init"))
        else:
            omega = check_finite_array(log_weights_init, "log_weights_init", shape=(p,))
        dtype = gpflow.default_float()
        self.pseudo_observations = gpflow.Parameter(
            np.asarray(y, dtype), name="pseudo_observations"
        )
        self.log_weights = gpflow.Parameter(np.asarray(omega, dtype), name="log_weights")

    def _check_prior(self, prior) -> None:
        if not getattr(prior, "is_spatial", False):
            raise TypeError(
                f"SpatialIWPosterior needs a SpatialIWPrior, got {type(prior).__name__}"
            )

    def parameters_for(self, prior, dtype: tf.DType) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """``(Psi_q [p, p], C [p, p], nu_q [])``: the scale ``Psi_q = nu0 I + Psi``, its Cholesky
        factor ``C`` and the degrees of freedom ``nu_q = nu0 + sum_j w_j`` of ``q(L)``."""
        self._check_prior(prior)
        p = self.dim
        nu0 = tf.constant(prior.dof(p), dtype)
        y = tf.cast(self.pseudo_observations, dtype)
        w = tf.exp(tf.cast(self.log_weights, dtype))
        psi = tf.linalg.matmul(y * w[:, None], y, transpose_a=True) / tf.constant(float(p), dtype)
        scale = nu0 * tf.eye(p, dtype=dtype) + psi
        return scale, safe_cholesky(scale, name="q(L) scale"), nu0 + tf.reduce_sum(w)

    def sample_full(
        self, prior, num_samples: int, noise_source: NoiseSource, name: str, dtype: tf.DType
    ) -> SpatialIWSample:
        """``S`` reparameterised draws ``L ~ q(L)`` with their factors and densities.

        ``G = A A^T ~ W(I, nu_q)`` by Bartlett with real degrees of freedom
        (:func:`~deepgp_gi.wishart.bartlett_factor`), then ``L = C G^{-1} C^T = B B^T`` with
        ``B = C A^{-T}`` (a triangular solve), so ``L ~ IW(C C^T, nu_q)``. ``log q(L)`` needs no
        inversion (``tr(Psi_q L^{-1}) = tr(G)``, ``log|L| = log|C C^T| - log|G|``) and ``log p(L)``
        one triangular solve ``C^{-1} sqrt(nu0) I``. Gradients reach ``y`` through ``C`` and
        ``omega`` through ``C`` and the Gamma draws' implicit reparameterisation.

        Noise names: ``f"{name}/chi"`` -- Gamma draws ``[S, p]`` (shapes ``(nu_q - j + 1)/2``);
        ``f"{name}/normal"`` -- below-diagonal normals ``[S, p(p-1)/2]`` (only when ``p > 1``).

        :param prior: the layer's :class:`~deepgp_gi.priors.SpatialIWPrior`.
        :param name: the noise-name prefix, e.g. ``"L/0"``.
        """
        _, C, nu_q = self.parameters_for(prior, dtype)
        S = int(num_samples)
        p = self.dim
        A = bartlett_factor(nu_q, p, S, noise_source, name, dtype)  # [S, p, p]
        Ainv_Ct = tf.linalg.triangular_solve(
            A, tf.broadcast_to(tf.transpose(C), [S, p, p]), lower=True
        )
        factor = tf.linalg.matrix_transpose(Ainv_Ct)  # B = C A^{-T}
        L = tf.linalg.matmul(factor, factor, transpose_b=True)
        L = 0.5 * (L + tf.linalg.matrix_transpose(L))
        log_det = 2.0 * (
            tf.reduce_sum(tf.math.log(tf.linalg.diag_part(C)))
            - tf.reduce_sum(tf.math.log(tf.linalg.diag_part(A)), axis=-1)
        )
        log_q = bartlett_inverse_wishart_log_prob(A, C, nu_q)
        log_p = bartlett_inverse_wishart_log_prob(
            A, C, prior.dof(p), scale_tril=prior.scale_tril(p, dtype)
        )
        return SpatialIWSample(
            L=L, factor=factor, bartlett=A, log_det=log_det, log_prior=log_p, log_posterior=log_q
        )

    def sample(
        self, prior, num_samples: int, noise_source: NoiseSource, name: str, dtype: tf.DType
    ) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(L [S, p, p], log p(L) - log q(L) [S])``; see :meth:`sample_full` (noise names
        ``f"{name}/chi"`` and ``f"{name}/normal"``). A conv layer's weight precision is then
        ``prior.conv_precision(L, C)`` (``D (L kron I_C)``, bias ``D``)."""
        draw = self.sample_full(prior, num_samples, noise_source, name, dtype)
        return draw.L, draw.log_ratio


class PriorPrecisions:
    """Mixin for weight-space posteriors: ``self.scale_posteriors[l]`` is a :class:`ScalePosterior`
    for a random-scale layer, a :class:`SpatialIWPosterior` (``p = 1``) for a dense layer with a
    :class:`~deepgp_gi.priors.SpatialIWPrior`, ``None`` for fixed priors; and
    :meth:`prior_precision`."""

    def _init_prior_precisions(self, layers: Sequence, seed: Optional[int] = None) -> None:
        """Set up the priors of the weighted ``layers`` (in forward order; every layer of a
        fully-connected network, only the convolutions and dense layers of a convolutional one),
        which ``l`` then indexes here, in :attr:`weighted` and in ``parameter_count``'s ``layer_l``.

        :param seed: seeds the default pseudo-observations of :class:`SpatialIWPosterior`
        (a stream of its own: other initial values do not change)."""
        self.__dict__["_weighted"] = tuple(
            layers
        )  # the model's layers: not tracked twice (DeepPosterior)
        rng = np.random.default_rng(None if seed is None else [int(seed) & 0x7FFFFFFF, 0x51A7])
        posteriors: List[Optional[gpflow.Module]] = []
        for l, layer in enumerate(layers):
            prior = getattr(layer, "prior", None)
            if prior is None or not prior.is_random:
                posteriors.append(None)
            elif getattr(prior, "is_spatial", False):
                # p = k*k for a k x k convolution, 1 for a dense layer (one spatial position).
                p = int(getattr(layer, "spatial_dim", 1))
                posteriors.append(
                    SpatialIWPosterior(p, seed=int(rng.integers(2**31 - 1)), name=f"spatial_iw_{l}")
                )
            else:
                posteriors.append(ScalePosterior())
        self.scale_posteriors = posteriors

    @property
    def weighted(self) -> Sequence:
        """The weighted layers in forward order (``l`` / ``j`` indexes them)."""
        return self._weighted

    @property
    def _prior_layers(self) -> Sequence:
        return self._weighted

    @property
    def _parameter_layers(self) -> Sequence:
        """``parameter_count(per_layer=True)``'s ``layer_j`` is weighted layer ``j``."""
        return self._weighted

    def prior_precision(
        self, l: int, num_samples: int, noise_source: NoiseSource, dtype: tf.DType
    ) -> Tuple[tf.Tensor, tf.Tensor]:
        """Layer ``l``'s weight precision per sample ``[S]`` (``[S, D, D]`` for a convolution with a
        spatial inverse-Wishart prior) and the random precision's
        ``log p - log q`` ``[S]`` (zeros for a fixed prior).

        Noise names: ``"s/{l}"`` ``[S]`` for a Gamma scale draw; ``"L/{l}/chi"`` ``[S, 1]`` for the
        spatial inverse-Wishart's Bartlett draw (``p = 1`` has no ``"L/{l}/normal"``), whose
        precision is ``D_l L``."""
        layer = self._prior_layers[l]
        q = self.scale_posteriors[l]
        if q is None:
            precision = tf.fill(
                [num_samples], tf.constant(layer.prior.fixed_precision(layer.fan_in), dtype)
            )
            return precision, tf.zeros([num_samples], dtype)
        if isinstance(q, SpatialIWPosterior):
            L, log_ratio = q.sample(layer.prior, num_samples, noise_source, f"L/{l}", dtype)
            if int(getattr(layer, "spatial_dim", 1)) > 1:  # a convolution: [S, D, D]
                return layer.prior.conv_precision(L, layer.input_dim, bias=layer.bias), log_ratio
            return layer.prior.dense_precision(layer.fan_in, L), log_ratio
        s, log_ratio = q.sample_scale(layer.prior, num_samples, noise_source, f"s/{l}", dtype)
        return layer.prior.precision_from_scale(layer.fan_in, s), log_ratio
