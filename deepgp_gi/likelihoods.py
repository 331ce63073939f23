"""GPflow likelihoods over the leading sample axis, checks that targets suit them, and a Student-t
likelihood whose predictive density is exact where GPflow's quadrature is not."""

from __future__ import annotations

import math

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import inherit_check_shapes

from .validation import check_float_above

__all__ = [
    "StudentT",
    "expected_log_likelihood",
    "predict_mean_and_var",
    "check_targets",
    "mixture_log_density",
    "predictive_log_density",
]


def _over_samples(method, X, mean, var, Y=None):
    """Call a GPflow likelihood ``method`` on ``[S, N, P]`` moments by folding S into the point
    axis (``[S*N, P]``, X and Y repeated S times), then unfold: every likelihood, including the
    Monte Carlo and multi-class ones whose shape checks reject an extra batch axis, sees the plain
    ``[points, latent]`` layout it was written for."""
    S, N = tf.shape(mean)[0], tf.shape(mean)[1]

    # Static trailing sizes are kept (a dynamic reshape would lose them, and GPflow's Monte Carlo
    # quadrature reads ``Y.shape[1]`` statically).
    def fold(T):
        out = tf.reshape(T, tf.concat([[S * N], tf.shape(T)[2:]], 0))
        return tf.ensure_shape(out, [None] + T.shape[2:].as_list())

    def tile(T):
        out = tf.reshape(
            tf.tile(T[None], tf.concat([[S], tf.ones([tf.rank(T)], tf.int32)], 0)),
            tf.concat([[S * N], tf.shape(T)[1:]], 0),
        )
        return tf.ensure_shape(out, [None] + T.shape[1:].as_list())

    if Y is not None and isinstance(getattr(method, "__self__", None), gpflow.likelihoods.Softmax):
        Y = tf.cast(Y, tf.int64)  # GPflow's Softmax takes integer class labels
    args = [tile(X), fold(mean), fold(var)] + ([tile(Y)] if Y is not None else [])
    out = method(*args)

    def unfold(T):
        return tf.reshape(T, tf.concat([[S, N], tf.shape(T)[1:]], 0))

    return tf.nest.map_structure(unfold, out)


def expected_log_likelihood(likelihood, X, mean, var, Y) -> tf.Tensor:
    """``E_{N(f; mean, var)}[log p(Y | f)]`` per sample and point, ``[S, N]``.

    Analytic for the Gaussian likelihood; GPflow's quadrature (or its own closed form) otherwise.
    ``mean``/``var`` are ``[S, N, P]``; ``X`` ``[N, D]`` and ``Y`` ``[N, P_y]`` are shared by the
    samples.
    """
    return _over_samples(likelihood.variational_expectations, X, mean, var, Y)


def predict_mean_and_var(likelihood, X, mean, var):
    """Predictive mean and variance of Y per sample, each ``[S, N, P_y]``."""
    return _over_samples(likelihood.predict_mean_and_var, X, mean, var)


def predictive_log_density(likelihood, X, mean, var, Y) -> tf.Tensor:
    """``log int p(y_n | f) N(f; mean_s, var_s) df`` per sample and point, ``[S, N]`` (GPflow's
    ``predict_log_density``: closed form for the Gaussian likelihood, quadrature or Monte Carlo
    otherwise)."""
    return _over_samples(likelihood.predict_log_density, X, mean, var, Y)


def mixture_log_density(likelihood, X, mean, var, Y, log_weights=None) -> tf.Tensor:
    """``log sum_s w_s p(y_n | N(f; mean_s, var_s))`` per point, ``[N]``: equal weights
    ``w_s = 1/S``, or ``exp(log_weights)`` (``[S]``, normalised)."""
    logp = _over_samples(likelihood.predict_log_density, X, mean, var, Y)  # [S, N]
    return log_mean_exp(logp, log_weights)


def log_mean_exp(logp: tf.Tensor, log_weights=None) -> tf.Tensor:
    """``log sum_s w_s exp(logp_s)`` over the leading axis of ``logp`` ``[S, ...]``: equal weights
    ``1/S``, or ``exp(log_weights)`` (``[S]``, normalised)."""
    if log_weights is None:
        S = tf.cast(tf.shape(logp)[0], logp.dtype)
        return tf.reduce_logsumexp(logp, axis=0) - tf.math.log(S)
    return tf.reduce_logsumexp(logp + _along_samples(log_weights, logp), axis=0)


def mixture_mean(values: tf.Tensor, log_weights=None) -> tf.Tensor:
    """``sum_s w_s values_s`` over the leading axis of ``values`` ``[S, ...]``: equal weights
    ``1/S``, or ``exp(log_weights)`` (``[S]``, normalised)."""
    if log_weights is None:
        return tf.reduce_mean(values, axis=0)
    return tf.reduce_sum(tf.exp(_along_samples(log_weights, values)) * values, axis=0)


def _along_samples(log_weights, like: tf.Tensor) -> tf.Tensor:
    """``log_weights`` ``[S]`` in ``like``'s dtype, shaped ``[S, 1, ...]`` to broadcast over it."""
    shape = tf.concat([[-1], tf.ones([tf.rank(like) - 1], tf.int32)], 0)
    return tf.reshape(tf.cast(log_weights, like.dtype), shape)


def check_targets(likelihood, Y: np.ndarray, name: str = "Y") -> None:
    """Reject targets that the likelihood cannot have produced (eager data only)."""
    if isinstance(likelihood, gpflow.likelihoods.Bernoulli):
        bad = ~np.isin(Y, (0.0, 1.0))
        if bad.any():
            row = int(np.nonzero(bad.any(axis=-1))[0][0])
            raise ValueError(
                f"{name} must hold 0/1 labels for a Bernoulli likelihood; row {row} has "
                f"{Y[row].tolist()}"
            )
    elif isinstance(likelihood, (gpflow.likelihoods.Softmax, gpflow.likelihoods.MultiClass)):
        C = likelihood.num_classes
        bad = (Y < 0) | (Y >= C) | (np.round(Y) != Y)
        if bad.any():
            row = int(np.nonzero(bad.any(axis=-1))[0][0])
            raise ValueError(
                f"{name} must hold class labels 0..{C - 1} for a {C}-class likelihood; row {row} "
                f"has {Y[row].tolist()}"
            )
    elif isinstance(likelihood, gpflow.likelihoods.Poisson):
        if (Y < 0).any() or (np.round(Y) != Y).any():
            raise ValueError(
                f"{name} must hold non-negative integer counts for a Poisson likelihood"
            )
    elif isinstance(likelihood, gpflow.likelihoods.Beta):
        if ((Y <= 0) | (Y >= 1)).any():
            raise ValueError(f"{name} must lie strictly inside (0, 1) for a Beta likelihood")
    elif isinstance(likelihood, (gpflow.likelihoods.Exponential, gpflow.likelihoods.Gamma)):
        if (Y < 0).any():
            raise ValueError(
                f"{name} must be non-negative for a {type(likelihood).__name__} likelihood"
            )


class StudentT(gpflow.likelihoods.StudentT):
    """GPflow's Student-t likelihood (location ``f``, learned ``scale``, fixed ``df``) with a
    predictive density that holds whatever the latent variance.

    GPflow integrates ``p(y | f)`` against ``N(f; mu, var)`` by 20-point Gauss-Hermite quadrature
    in ``f``; when ``var`` is much larger than ``scale**2`` the peaked density falls between the
    nodes and the result can be off by tenths of a nat or more. Here the t is a scale mixture of
    Gaussians, ``t(y; f, s, nu) = int Gamma(lam; nu/2, nu/2) N(y; f, s^2/lam) dlam``, so that the
    integral over ``f`` is closed-form and one smooth integral over ``u = log lam`` is left::

        log p(y) = log int Gamma(e^u; nu/2, nu/2) e^u N(y; mu, var + s^2 e^-u) du

    done by the trapezoid rule on a fixed grid of ``u`` (the attribute ``log_precision_grid``,
    spacing at most a fifth of the mixing density's width, covering targets up to about ``10**6``
    scales from the mean). For a smooth integrand decaying at both ends that rule converges faster
    than any power of the spacing. The variational expectations stay GPflow's quadrature of
    ``log p(y | f)``, a smooth function of ``f``.

    :param scale: the initial scale ``s`` (positive).
    :param df: degrees of freedom ``nu``, a finite number above 0 (above 2 for a finite variance,
        which :meth:`predict_mean_and_var` needs).
    """

    #: The ``u = log lam`` range of the grid: above ``U_MAX`` the Gamma density has no mass left
    #: (``nu/2 e^5 >= 74`` for ``nu >= 1``); ``U_MIN`` lies 2.4 units of ``u`` below where a
    #: target ``10**6`` scales from the mean puts the mass.
    U_MIN, U_MAX = -30.0, 5.0

    def __init__(self, scale=1.0, df: float = 3.0, **kwargs) -> None:
        df = check_float_above(df, "df", 0.0)
        super().__init__(scale=scale, df=df, **kwargs)
        a = 0.5 * self.df
        # the Gamma(a, a) density in u = log lam has width about 1 / sqrt(a) near u = 0
        spacing = min(0.1, 0.2 / math.sqrt(a))
        count = int(math.ceil((self.U_MAX - self.U_MIN) / spacing)) + 1
        self.log_precision_grid = np.linspace(self.U_MIN, self.U_MAX, count)
        self._log_grid_spacing = math.log(self.log_precision_grid[1] - self.log_precision_grid[0])
        # log Gamma(e^u; a, a) + u at each grid point
        u = self.log_precision_grid
        self._log_mixing = a * math.log(a) - math.lgamma(a) + a * u - a * np.exp(u)

    @inherit_check_shapes
    def _predict_log_density(self, X, Fmu, Fvar, Y) -> tf.Tensor:
        dtype = Fmu.dtype
        u = tf.constant(self.log_precision_grid, dtype)
        log_mixing = tf.constant(self._log_mixing, dtype)
        scale2 = tf.cast(tf.square(self._scale(X)), dtype)[..., None]
        var = Fvar[..., None] + scale2 * tf.exp(-u)  # [..., N, P, grid]
        sq = tf.square(tf.cast(Y, dtype) - Fmu)[..., None]
        log_terms = log_mixing - 0.5 * tf.math.log(2.0 * np.pi * var) - 0.5 * sq / var
        log_density = tf.reduce_logsumexp(log_terms, axis=-1) + self._log_grid_spacing
        return tf.reduce_sum(log_density, axis=-1)
