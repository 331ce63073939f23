"""Weight-space posteriors for BNNs (ALGORITHMS.md §2.4, "Posterior families").

Every class here works on a stack of :class:`~deepgp_gi.dense.DenseLayer` (any prior from
:mod:`deepgp_gi.priors`) and implements :class:`~deepgp_gi.posteriors.base.DeepPosterior`:

* :class:`FactorisedWeightPosterior` -- ``q(W) = prod N(mu, sigma^2)`` (fac), with the local
  reparameterisation by default;
* :class:`LocalInducingWeightPosterior` -- per-layer inducing features Z, pseudo-outputs V and
  precisions Lambda (li);
* :class:`GlobalInducingWeightPosterior` -- global inducing points ``U_0`` propagated through the
  network together with the data (gi, O&A Alg. 1 / Eq. 11), ``O(D^3)`` in the width;
* :class:`FactorisedGlobalPosterior` -- fac->gi (factorised lower layers, sampled explicitly, and
  a global-inducing last layer), or rand->gi with ``lower="prior"``
  (:class:`RandomGlobalPosterior`).

Conventions. ``S`` samples, ``N`` data rows, ``M`` inducing rows, ``D`` = fan-in with the bias
column, ``P`` = the layer's width. Weights are ``[S, D, P]`` (column ``lambda`` holds unit
``lambda``'s input weights). ``Propagation.kl`` is ``log q - log p`` per sample, summed over
layers and including the ScalePrior's ``log q(s) - log p(s)``.

Noise names (see :mod:`deepgp_gi.noise`):

* ``"w/{l}"`` -- ``[S, D_l, N_l]`` standard normals for the weights of layer ``l`` (explicitly
  sampled weights: fac without local reparameterisation, li, gi, the lower layers of fac->gi and
  rand->gi);
* ``"f/{l}"`` -- ``[S, N, N_l]`` standard normals for the pre-activations of layer ``l`` under
  the local reparameterisation (fac);
* ``"s/{l}"`` -- ``[S]`` Gamma(concentration, 1) draws of the ScalePrior of layer ``l``.

Parameter scalings (O&A App. H, ALGORITHMS.md §1.3): factorised means are stored times
``sqrt(D)``, factorised variances as ``log(D sigma^2)``, inducing log-precisions divided by
``rho = 3`` (``log_precision_multiplier``).
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple, Union

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

from ..linalg import safe_cholesky
from ..noise import NoiseSource, as_noise_source
from .base import DeepPosterior, Propagation

__all__ = [
    "FactorisedWeightPosterior",
    "LocalInducingWeightPosterior",
    "GlobalInducingWeightPosterior",
    "FactorisedGlobalPosterior",
    "RandomGlobalPosterior",
    "factorised_kl",
    "local_reparameterisation_moments",
    "weight_posterior_factor",
    "sample_weights",
    "gaussian_weight_kl",
]

#: Default multiplier of the stored inducing log-precisions (O&A App. O).
LOG_PRECISION_MULTIPLIER = 3.0


# --------------------------------------------------------------------------------------------
# Pure functions
# --------------------------------------------------------------------------------------------


@check_shapes(
    "mean: [D, P]",
    "var: [D, P]",
    "prior_precision: [S]",
    "return: [S]",
)
def factorised_kl(mean: tf.Tensor, var: tf.Tensor, prior_precision: tf.Tensor) -> tf.Tensor:
    """``sum_{d,p} KL(N(mean, var) || N(0, 1/prior_precision))`` for each sample's precision.

    ``0.5 * sum(p var + p mean^2 - 1 - log(p var))``.
    """
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


@check_shapes(
    "Phi_u: [S, M, D]",
    "precision: [K, M]",
    "V: [M, P]",
    "prior_precision: [S]",
    "return[0]: [S, K, D, D]",
    "return[1]: [S, K, D, C]",
)
def weight_posterior_factor(
    Phi_u: tf.Tensor, precision: tf.Tensor, V: tf.Tensor, prior_precision: tf.Tensor
) -> Tuple[tf.Tensor, tf.Tensor]:
    """Cholesky factor and mean of the pseudo-data weight posterior (O&A Eq. 11).

    ``Prec_lambda = p I + Phi_u^T diag(Lambda_lambda) Phi_u`` and
    ``m_lambda = Prec_lambda^{-1} Phi_u^T diag(Lambda_lambda) v_lambda``: Bayesian linear
    regression of the pseudo-outputs ``V`` on the features ``Phi_u`` with noise precisions
    ``Lambda``. The precision is never inverted.

    :param Phi_u: features of the inducing rows, ``[S, M, D]``.
    :param precision: diagonal pseudo-data precisions ``Lambda``, ``[K, M]`` with ``K = P``
        (one per unit) or ``K = 1`` (shared by every unit).
    :param V: pseudo-outputs ``[M, P]``.
    :param prior_precision: ``p`` per sample, ``[S]``.
    :return: ``(L, m)``: lower Cholesky factors of the precisions ``[S, K, D, D]`` and the means
        ``[S, K, D, C]``; per unit (``K = P``) ``C = 1`` and ``m[:, k, :, 0]`` is unit k's mean;
        shared (``K = 1``) ``C = P`` and ``m[:, 0]`` is the ``[D, P]`` mean matrix.
    """
    K, P = precision.shape[0], V.shape[-1]
    if K is not None and P is not None and K not in (1, P):
        raise ValueError(f"precision must have 1 or {P} rows (one per unit), got {K}")
    D = tf.shape(Phi_u)[-1]
    eye = tf.eye(D, dtype=Phi_u.dtype)
    p = prior_precision[:, None, None, None]
    if K == 1:
        lam = precision[0][:, None]  # [M, 1]
        G = tf.linalg.matmul(Phi_u * lam, Phi_u, transpose_a=True)[:, None]  # [S, 1, D, D]
        rhs = tf.einsum("smd,mp->sdp", Phi_u, lam * V)[:, None]  # [S, 1, D, P]
    else:
        # Per-unit Gram matrices as one batched GEMM over the flattened outer products
        # phi_m phi_m^T (about 3x faster forward+backward than a three-operand einsum).
        S = tf.shape(Phi_u)[0]
        M = tf.shape(Phi_u)[1]
        outer = tf.reshape(Phi_u[..., :, None] * Phi_u[..., None, :], tf.stack([S, M, D * D]))
        lam = tf.broadcast_to(precision, tf.concat([[S], tf.shape(precision)], 0))  # [S, P, M]
        G = tf.reshape(tf.linalg.matmul(lam, outer), tf.stack([S, -1, D, D]))  # [S, P, D, D]
        LamV = tf.transpose(precision) * V  # [M, P]
        rhs = tf.einsum("smd,mk->skd", Phi_u, LamV)[..., None]  # [S, P, D, 1]
    prec = p * eye + G
    L = safe_cholesky(prec, name="weight posterior precision")
    m = tf.linalg.cholesky_solve(L, rhs)
    return L, m


def _units_first(x: tf.Tensor, K: int) -> tf.Tensor:
    """``[S, D, P] -> [S, K, D, C]`` in the layout of :func:`weight_posterior_factor`."""
    if K == 1:
        return x[:, None]
    return tf.transpose(x, [0, 2, 1])[..., None]


def _units_last(x: tf.Tensor, K: int) -> tf.Tensor:
    """Inverse of :func:`_units_first`: ``[S, K, D, C] -> [S, D, P]``."""
    if K == 1:
        return x[:, 0]
    return tf.transpose(x[..., 0], [0, 2, 1])


@check_shapes(
    "L: [S, K, D, D]",
    "m: [S, K, D, C]",
    "z: [S, D, P]",
    "prior_precision: [S]",
    "return[0]: [S, D, P]",
    "return[1]: [S]",
)
def sample_weights(L: tf.Tensor, m: tf.Tensor, z: tf.Tensor, prior_precision: tf.Tensor):
    """``W = m + L^{-T} z`` and the sampled log-ratio ``log q(W) - log p(W)`` per sample.

    ``log q(W) = sum_lambda (-1/2 |z_lambda|^2 + sum log diag L_lambda)`` and
    ``log p(W) = sum_lambda (-p/2 |w_lambda|^2 + D/2 log p)``; the ``2 pi`` constants cancel.

    :param L: Cholesky factors of the posterior precisions (from :func:`weight_posterior_factor`).
    :param m: posterior means in the same layout.
    :param z: standard normals ``[S, D, P]``.
    :param prior_precision: ``p`` per sample ``[S]``.
    """
    K = L.shape[1]
    P = z.shape[-1] if z.shape[-1] is not None else tf.shape(z)[-1]
    zk = _units_first(z, K)
    dW = tf.linalg.triangular_solve(L, zk, lower=True, adjoint=True)
    W = _units_last(m + dW, K)
    dtype = z.dtype
    units_per_factor = tf.cast(P, dtype) if K == 1 else tf.constant(1.0, dtype)
    logdet_half = tf.reduce_sum(tf.math.log(tf.abs(tf.linalg.diag_part(L))), axis=[-2, -1])  # [S]
    log_q = -0.5 * tf.reduce_sum(tf.square(z), axis=[-2, -1]) + units_per_factor * logdet_half
    D = tf.cast(tf.shape(z)[-2], dtype)
    numel = D * tf.cast(P, dtype)
    log_p = -0.5 * prior_precision * tf.reduce_sum(tf.square(W), axis=[-2, -1]) + 0.5 * numel * tf.math.log(
        prior_precision
    )
    return W, log_q - log_p


@check_shapes(
    "L: [S, K, D, D]",
    "m: [S, K, D, C]",
    "prior_precision: [S]",
    "return: [S]",
)
def gaussian_weight_kl(L: tf.Tensor, m: tf.Tensor, prior_precision: tf.Tensor, num_units: int) -> tf.Tensor:
    """Analytic ``KL(q(W) || N(0, p^{-1} I))`` for ``q(w_lambda) = N(m_lambda, (L L^T)^{-1})``.

    Per unit: ``0.5 * (p tr(Sigma) + p |m|^2 - D - log det Sigma - D log p)`` with
    ``tr(Sigma) = |L^{-1}|_F^2`` and ``log det Sigma = -2 sum log diag L``.
    """
    K = L.shape[1]
    dtype = L.dtype
    D = tf.cast(tf.shape(L)[-1], dtype)
    eye = tf.eye(tf.shape(L)[-1], batch_shape=tf.shape(L)[:-2], dtype=dtype)
    Linv = tf.linalg.triangular_solve(L, eye, lower=True)
    trace = tf.reduce_sum(tf.square(Linv), axis=[-2, -1])  # [S, K]
    logdet_prec = 2.0 * tf.reduce_sum(tf.math.log(tf.abs(tf.linalg.diag_part(L))), axis=-1)  # [S, K]
    per_factor_units = tf.constant(float(num_units), dtype) if K == 1 else tf.constant(1.0, dtype)
    p = prior_precision
    kl = 0.5 * (
        p * per_factor_units * tf.reduce_sum(trace, axis=-1)
        + p * tf.reduce_sum(tf.square(m), axis=[-3, -2, -1])
        + per_factor_units * tf.reduce_sum(logdet_prec, axis=-1)
        - float(num_units) * D * (1.0 + tf.math.log(p))
    )
    return kl


# --------------------------------------------------------------------------------------------
# Shared machinery
# --------------------------------------------------------------------------------------------


def _check_dense_layers(layers) -> None:
    for i, layer in enumerate(layers):
        if not (hasattr(layer, "features") and hasattr(layer, "prior") and hasattr(layer, "fan_in")):
            raise TypeError(
                f"layers[{i}] is a {type(layer).__name__}; weight-space posteriors need DenseLayer "
                "layers (a feature map and a weight prior)"
            )


def _as_list(value, count: int, name: str) -> list:
    if value is None:
        return [None] * count
    value = list(value)
    if len(value) != count:
        raise ValueError(f"{name} needs {count} entries (one per layer), got {len(value)}")
    return value


def _default_log_precisions(depth: int, hidden: float = -4.0, output: float = 0.0) -> List[float]:
    return [hidden] * (depth - 1) + [output]


def _log_precision_parameter(init, rows: int, M: int, multiplier: float, name: str) -> gpflow.Parameter:
    """Stored value ``log Lambda / multiplier``; ``init`` a scalar or a ``[rows, M]`` array."""
    arr = np.asarray(init, dtype=np.float64)
    if arr.ndim == 0:
        arr = np.full((rows, M), float(arr))
    if arr.shape != (rows, M):
        raise ValueError(f"{name} must be a scalar or have shape {(rows, M)}, got {arr.shape}")
    return gpflow.Parameter(arr / multiplier, name=name)


def _broadcast_samples(X: tf.Tensor, S: int) -> tf.Tensor:
    return tf.broadcast_to(X[None], tf.concat([[S], tf.shape(X)], 0))


class _InducingLayerQ(gpflow.Module):
    """Pseudo-data parameters of one layer: pseudo-outputs ``V`` ``[M, P]`` and log-precisions."""

    def __init__(self, V, log_precision, per_unit: bool, multiplier: float):
        super().__init__()
        V = np.asarray(V, dtype=np.float64)
        M, P = V.shape
        self.pseudo_outputs = gpflow.Parameter(V, name="pseudo_outputs")
        rows = P if per_unit else 1
        self.log_precision_scaled = _log_precision_parameter(log_precision, rows, M, multiplier, "log_precision")
        self.multiplier = float(multiplier)

    def precision(self) -> tf.Tensor:
        """``Lambda`` ``[K, M]``."""
        lp = self.log_precision_scaled
        return tf.exp(tf.constant(self.multiplier, lp.dtype) * lp)

    def factor(self, Phi_u, prior_precision):
        return weight_posterior_factor(Phi_u, self.precision(), tf.convert_to_tensor(self.pseudo_outputs), prior_precision)


class _FactorisedLayerQ(gpflow.Module):
    """Factorised Gaussian weights of one layer, stored with App. H scalings."""

    def __init__(self, mean, variance):
        super().__init__()
        mean = np.asarray(mean, dtype=np.float64)
        D = mean.shape[0]
        variance = np.broadcast_to(np.asarray(variance, dtype=np.float64), mean.shape)
        if not np.all(variance > 0):
            raise ValueError("factorised weight variances must be positive")
        self.fan_in = D
        self.mean_scaled = gpflow.Parameter(mean * np.sqrt(D), name="weight_mean_scaled")
        self.log_variance_scaled = gpflow.Parameter(np.log(variance * D), name="weight_log_variance_scaled")

    def moments(self):
        """Mean and variance ``[D, P]`` of the weights."""
        dtype = self.mean_scaled.dtype
        D = tf.constant(float(self.fan_in), dtype)
        return self.mean_scaled / tf.sqrt(D), tf.exp(self.log_variance_scaled) / D

    def sample(self, z):
        mean, var = self.moments()
        return mean + tf.sqrt(var) * z


def _default_factorised_init(layer, rng: np.random.Generator, variance_multiplier: float = 1e-3):
    """Means from NealPrior (``mu~ ~ N(0,1)``), variances ``1e-3 / D`` (O&A code, §5 item 3)."""
    D, P = layer.fan_in, layer.output_dim
    return rng.standard_normal((D, P)) / np.sqrt(D), variance_multiplier / D


class _WeightPosteriorBase(DeepPosterior):
    def __init__(self, layers, name=None):
        super().__init__(layers, name=name)
        _check_dense_layers(self.layers)

    def _prior_precision(self, l: int, S: int, source: NoiseSource, dtype):
        layer = self.layers[l]
        return layer.prior.sample_precision(layer.fan_in, S, source, f"s/{l}", dtype)

    def _weight_noise(self, l: int, S: int, source: NoiseSource, dtype):
        layer = self.layers[l]
        return source.normal(f"w/{l}", [S, layer.fan_in, layer.output_dim], dtype)

    def _start(self, X, num_samples: int, noise, inducing_inputs=None):
        """Common set-up of ``propagate``: the noise source, the dtype, the rows to push through
        (``[S, N, D_0]``, or ``[S, M+N, D_0]`` with ``inducing_inputs`` stacked on top) and a
        zero ``[S]`` regulariser."""
        source = as_noise_source(noise)
        X = tf.convert_to_tensor(X)
        dtype = X.dtype
        if inducing_inputs is not None:
            X = tf.concat([tf.cast(tf.convert_to_tensor(inducing_inputs), dtype), X], axis=0)
        return source, dtype, _broadcast_samples(X, num_samples), tf.zeros([num_samples], dtype)

    def _finish(self, samples, kl) -> Propagation:
        last = samples[-1]
        return Propagation(samples=samples, mean=last, var=tf.zeros_like(last), kl=kl)


# --------------------------------------------------------------------------------------------
# Factorised
# --------------------------------------------------------------------------------------------


class FactorisedWeightPosterior(_WeightPosteriorBase):
    """Mean-field Gaussian weights ``q(W_l) = prod N(mu, sigma^2)`` (fac).

    Stored as ``mu~ = sqrt(D) mu`` and ``rho~ = log(D sigma^2)`` (App. H). The KL is analytic given
    the prior precision (sampled for ScalePrior).

    :param layers: DenseLayers.
    :param means: per-layer initial means ``[D_l, N_l]``; default ``N(0, 1/D_l)`` (NealPrior draws).
    :param variances: per-layer initial variances (scalar or ``[D_l, N_l]``); default ``1e-3/D_l``.
    :param local_reparameterisation: if True, every layer's pre-activations are sampled per data
        point from their Gaussian marginals (mean ``Phi mu``, variance ``Phi^2 sigma^2``, noise
        ``"f/{l}"``) and the last layer's marginals go to the likelihood; if False, weights are
        sampled explicitly (noise ``"w/{l}"``) and shared by all rows of a sample.
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
        super().__init__(layers, name=name)
        rng = np.random.default_rng(seed)
        means = _as_list(means, self.depth, "means")
        variances = _as_list(variances, self.depth, "variances")
        qs = []
        for layer, mean, var in zip(self.layers, means, variances):
            dm, dv = _default_factorised_init(layer, rng)
            mean = dm if mean is None else np.asarray(mean, dtype=np.float64)
            if mean.shape != (layer.fan_in, layer.output_dim):
                raise ValueError(f"means entries must have shape {(layer.fan_in, layer.output_dim)}, got {mean.shape}")
            qs.append(_FactorisedLayerQ(mean, dv if var is None else var))
        self.weights = qs
        self.local_reparameterisation = bool(local_reparameterisation)

    def propagate(self, X, num_samples: int = 1, noise=None) -> Propagation:
        S = num_samples
        source, dtype, F, kl = self._start(X, S, noise)
        samples = []
        for l, (layer, q) in enumerate(zip(self.layers, self.weights)):
            Phi = layer.features(F)
            p, log_ratio = self._prior_precision(l, S, source, dtype)
            mean, var = q.moments()
            kl = kl + factorised_kl(mean, var, p) - log_ratio
            last = l == self.depth - 1
            if self.local_reparameterisation:
                fmean, fvar = local_reparameterisation_moments(Phi, mean, var)
                if last:
                    samples.append(self.sample_last_layer(fmean, fvar, source, dtype))
                    return Propagation(samples=samples, mean=fmean, var=fvar, kl=kl)
                eps = source.normal(f"f/{l}", tf.shape(fmean), dtype)
                F = fmean + tf.sqrt(fvar) * eps
            else:
                W = q.sample(self._weight_noise(l, S, source, dtype))
                F = tf.linalg.matmul(Phi, W)
            samples.append(F)
        return self._finish(samples, kl)


# --------------------------------------------------------------------------------------------
# Local inducing
# --------------------------------------------------------------------------------------------


class LocalInducingWeightPosterior(_WeightPosteriorBase):
    """Local inducing (li): per-layer pseudo-data in feature space.

    ``Q(w_lambda) = N(Sigma_lambda Z^T Lambda_lambda v_lambda, Sigma_lambda)`` with
    ``Sigma_lambda = (P_l + Z^T Lambda_lambda Z)^{-1}``. The inducing features ``Z_l``
    ``[M_l, D_l]`` (bias column included, learned) are the layers' ``inducing_variable``;
    pseudo-outputs ``V_l`` ``[M_l, N_l]`` and log-precisions (stored ``/ rho``) are here.
    Weights are sampled (noise ``"w/{l}"``); layers are independent.

    :param layers: DenseLayers built with ``inducing_features``.
    :param pseudo_outputs: per-layer ``[M_l, N_l]``; default ``N(0, 1)``.
    :param log_precisions: per-layer scalar or ``[K, M_l]`` initial log-precisions; default -4.
    :param per_unit_precision: one precision vector per unit (``K = N_l``) or one shared (``K = 1``).
    :param analytic_kl: use the analytic Gaussian KL given the prior precision (default) instead
        of the sampled log-ratio; both have the same expectation.
    :param log_precision_multiplier: ``rho`` (3).
    :param seed: seed for the default pseudo-outputs.
    """

    def __init__(
        self,
        layers,
        pseudo_outputs: Optional[Sequence] = None,
        log_precisions: Optional[Sequence] = None,
        per_unit_precision: bool = True,
        analytic_kl: bool = True,
        log_precision_multiplier: float = LOG_PRECISION_MULTIPLIER,
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        super().__init__(layers, name=name)
        for i, layer in enumerate(self.layers):
            if layer.inducing_variable is None:
                raise ValueError(
                    f"layers[{i}] has no inducing features; build DenseLayer(..., inducing_features=Z) "
                    "with Z of shape [M, fan_in] for the local-inducing posterior"
                )
        rng = np.random.default_rng(seed)
        pseudo_outputs = _as_list(pseudo_outputs, self.depth, "pseudo_outputs")
        log_precisions = _as_list(log_precisions, self.depth, "log_precisions")
        qs = []
        for layer, V, lp in zip(self.layers, pseudo_outputs, log_precisions):
            M = layer.num_inducing
            V = rng.standard_normal((M, layer.output_dim)) if V is None else np.asarray(V, dtype=np.float64)
            if V.shape != (M, layer.output_dim):
                raise ValueError(f"pseudo_outputs entries must have shape {(M, layer.output_dim)}, got {V.shape}")
            qs.append(_InducingLayerQ(V, -4.0 if lp is None else lp, per_unit_precision, log_precision_multiplier))
        self.inducing = qs
        self.analytic_kl = bool(analytic_kl)

    def propagate(self, X, num_samples: int = 1, noise=None) -> Propagation:
        S = num_samples
        source, dtype, F, kl = self._start(X, S, noise)
        samples = []
        for l, (layer, q) in enumerate(zip(self.layers, self.inducing)):
            Phi = layer.features(F)
            p, log_ratio = self._prior_precision(l, S, source, dtype)
            Z = tf.cast(tf.convert_to_tensor(layer.inducing_variable.Z), dtype)
            if layer.prior.is_random:
                L, m = q.factor(_broadcast_samples(Z, S), p)
                kl_an = gaussian_weight_kl(L, m, p, layer.output_dim) if self.analytic_kl else None
            else:  # the posterior is the same for every sample: factorise once
                L1, m1 = q.factor(Z[None], p[:1])
                L = tf.broadcast_to(L1, tf.concat([[S], tf.shape(L1)[1:]], 0))
                m = tf.broadcast_to(m1, tf.concat([[S], tf.shape(m1)[1:]], 0))
                if self.analytic_kl:
                    kl_an = tf.broadcast_to(gaussian_weight_kl(L1, m1, p[:1], layer.output_dim), [S])
            W, kl_sampled = sample_weights(L, m, self._weight_noise(l, S, source, dtype), p)
            kl_w = kl_an if self.analytic_kl else kl_sampled
            kl = kl + kl_w - log_ratio
            F = tf.linalg.matmul(Phi, W)
            samples.append(F)
        return self._finish(samples, kl)


# --------------------------------------------------------------------------------------------
# Global inducing
# --------------------------------------------------------------------------------------------


def _inducing_inputs_parameter(U0, input_dim: int) -> gpflow.Parameter:
    U0 = np.asarray(U0, dtype=np.float64)
    if U0.ndim != 2 or U0.shape[1] != input_dim:
        raise ValueError(f"inducing_inputs must have shape [M, {input_dim}], got {U0.shape}")
    if not np.all(np.isfinite(U0)):
        raise ValueError("inducing_inputs contains NaN or inf")
    return gpflow.Parameter(U0, name="inducing_inputs")


class GlobalInducingWeightPosterior(_WeightPosteriorBase):
    """Global inducing in weight space (gi; O&A Alg. 1, Eq. 11).

    Learned inducing inputs ``U_0`` ``[M, D_0]`` are stacked on top of the data rows and every row
    is propagated with the same weight sample. At layer ``l`` with features ``Phi = [Phi_u; Phi_f]``:
    ``Prec_lambda = P_l + Phi_u^T Lambda_lambda Phi_u``, ``m_lambda = Prec_lambda^{-1} Phi_u^T
    Lambda_lambda v_lambda``, ``w_lambda = m_lambda + chol(Prec_lambda)^{-T} z_lambda``; the
    regulariser is the sampled ``log q(W) - log p(W)``. Cost ``O(S (D^3 + M D^2 + (M+N) D P))`` per
    layer (times ``P`` for the first two terms with per-unit precisions).

    :param layers: DenseLayers.
    :param inducing_inputs: ``U_0`` ``[M, D_0]``.
    :param pseudo_outputs: per-layer ``[M, N_l]``; default ``N(0, 1)``.
    :param log_precisions: per-layer scalar or ``[K, M]`` initial log-precisions; default -4 for
        hidden layers and 0 for the output layer.
    :param per_unit_precision: one diagonal precision per unit (UCI, ``K = N_l``) or one shared per
        layer (CIFAR, ``K = 1``).
    :param log_precision_multiplier: ``rho``: the stored value is ``log Lambda / rho`` (3).
    :param seed: seed for the default pseudo-outputs.
    """

    def __init__(
        self,
        layers,
        inducing_inputs,
        pseudo_outputs: Optional[Sequence] = None,
        log_precisions: Optional[Sequence] = None,
        per_unit_precision: bool = True,
        log_precision_multiplier: float = LOG_PRECISION_MULTIPLIER,
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        super().__init__(layers, name=name)
        self.inducing_inputs = _inducing_inputs_parameter(inducing_inputs, self.layers[0].input_dim)
        M = int(self.inducing_inputs.shape[0])
        rng = np.random.default_rng(seed)
        pseudo_outputs = _as_list(pseudo_outputs, self.depth, "pseudo_outputs")
        log_precisions = _as_list(log_precisions, self.depth, "log_precisions")
        defaults = _default_log_precisions(self.depth)
        qs = []
        for layer, V, lp, lp0 in zip(self.layers, pseudo_outputs, log_precisions, defaults):
            V = rng.standard_normal((M, layer.output_dim)) if V is None else np.asarray(V, dtype=np.float64)
            if V.shape != (M, layer.output_dim):
                raise ValueError(f"pseudo_outputs entries must have shape {(M, layer.output_dim)}, got {V.shape}")
            qs.append(_InducingLayerQ(V, lp0 if lp is None else lp, per_unit_precision, log_precision_multiplier))
        self.inducing = qs

    @property
    def num_inducing(self) -> int:
        return int(self.inducing_inputs.shape[0])

    def propagate(self, X, num_samples: int = 1, noise=None) -> Propagation:
        S, M = num_samples, self.num_inducing
        source, dtype, H, kl = self._start(X, S, noise, self.inducing_inputs)  # H: [S, M+N, D_0]
        samples = []
        for l, (layer, q) in enumerate(zip(self.layers, self.inducing)):
            Phi = layer.features(H)
            p, log_ratio = self._prior_precision(l, S, source, dtype)
            L, m = q.factor(Phi[:, :M], p)
            W, kl_w = sample_weights(L, m, self._weight_noise(l, S, source, dtype), p)
            kl = kl + kl_w - log_ratio
            H = tf.linalg.matmul(Phi, W)  # [S, M+N, N_l]
            samples.append(H[:, M:])
        return self._finish(samples, kl)


class FactorisedGlobalPosterior(_WeightPosteriorBase):
    """fac->gi: factorised lower layers and a global-inducing last layer (O&A §2.4 "Hybrids").

    The lower layers' weights are sampled explicitly (noise ``"w/{l}"``; no local
    reparameterisation, because the inducing rows must see the same weights as the data rows).
    ``U_0`` is propagated through every layer and the last layer's ``q(W_L)`` is the pseudo-data
    posterior on the propagated inducing features.

    With ``lower="prior"`` (rand->gi) the lower layers' weights are drawn from the prior and
    contribute no log-ratio (ScalePrior scales are still learned with ``q(s)``).

    :param layers: DenseLayers.
    :param inducing_inputs: ``U_0`` ``[M, D_0]``.
    :param pseudo_outputs: the last layer's ``[M, N_L]``; default ``N(0, 1)``.
    :param log_precision: the last layer's scalar or ``[K, M]`` initial log-precision (0).
    :param lower: ``"factorised"`` or ``"prior"``.
    :param means, variances: initial factorised moments of the lower layers (see
        :class:`FactorisedWeightPosterior`).
    """

    LOWER = ("factorised", "prior")

    def __init__(
        self,
        layers,
        inducing_inputs,
        pseudo_outputs=None,
        log_precision=0.0,
        lower: str = "factorised",
        means: Optional[Sequence] = None,
        variances: Optional[Sequence] = None,
        per_unit_precision: bool = True,
        log_precision_multiplier: float = LOG_PRECISION_MULTIPLIER,
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        super().__init__(layers, name=name)
        if lower not in self.LOWER:
            raise ValueError(f"unknown lower {lower!r}; choose one of {', '.join(map(repr, self.LOWER))}")
        self.lower = lower
        self.inducing_inputs = _inducing_inputs_parameter(inducing_inputs, self.layers[0].input_dim)
        M = int(self.inducing_inputs.shape[0])
        rng = np.random.default_rng(seed)
        lower_layers = self.layers[:-1]
        if lower == "factorised":
            means = _as_list(means, len(lower_layers), "means")
            variances = _as_list(variances, len(lower_layers), "variances")
            qs = []
            for layer, mean, var in zip(lower_layers, means, variances):
                dm, dv = _default_factorised_init(layer, rng)
                mean = dm if mean is None else np.asarray(mean, dtype=np.float64)
                if mean.shape != (layer.fan_in, layer.output_dim):
                    raise ValueError(
                        f"means entries must have shape {(layer.fan_in, layer.output_dim)}, got {mean.shape}"
                    )
                qs.append(_FactorisedLayerQ(mean, dv if var is None else var))
            self.weights = qs
        else:
            if means is not None or variances is not None:
                raise ValueError("means/variances are only used with lower='factorised'")
            self.weights = []
        last = self.layers[-1]
        V = rng.standard_normal((M, last.output_dim)) if pseudo_outputs is None else np.asarray(pseudo_outputs)
        if V.shape != (M, last.output_dim):
            raise ValueError(f"pseudo_outputs must have shape {(M, last.output_dim)}, got {V.shape}")
        self.inducing = _InducingLayerQ(V, log_precision, per_unit_precision, log_precision_multiplier)

    @property
    def num_inducing(self) -> int:
        return int(self.inducing_inputs.shape[0])

    def propagate(self, X, num_samples: int = 1, noise=None) -> Propagation:
        S, M = num_samples, self.num_inducing
        source, dtype, H, kl = self._start(X, S, noise, self.inducing_inputs)  # H: [S, M+N, D_0]
        samples = []
        for l, layer in enumerate(self.layers):
            Phi = layer.features(H)
            p, log_ratio = self._prior_precision(l, S, source, dtype)
            kl = kl - log_ratio
            z = self._weight_noise(l, S, source, dtype)
            if l < self.depth - 1:
                if self.lower == "factorised":
                    q = self.weights[l]
                    mean, var = q.moments()
                    W = q.sample(z)
                    kl = kl + factorised_kl(mean, var, p)
                else:
                    W = z / tf.sqrt(p)[:, None, None]
            else:
                L, m = self.inducing.factor(Phi[:, :M], p)
                W, kl_w = sample_weights(L, m, z, p)
                kl = kl + kl_w
            H = tf.linalg.matmul(Phi, W)
            samples.append(H[:, M:])
        return self._finish(samples, kl)


class RandomGlobalPosterior(FactorisedGlobalPosterior):
    """rand->gi: lower-layer weights from the prior (log-ratio 0), global-inducing last layer."""

    def __init__(self, layers, inducing_inputs, pseudo_outputs=None, log_precision=0.0, **kwargs):
        super().__init__(layers, inducing_inputs, pseudo_outputs, log_precision, lower="prior", **kwargs)
