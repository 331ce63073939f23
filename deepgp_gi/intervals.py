"""Quantiles and central intervals of a predictive Gaussian mixture.

A deep GP's predictive distribution at a point is the mixture ``sum_s w_s N(y; m_s, v_s)`` over its
Monte Carlo samples (equal weights ``w_s = 1/S`` unless the family weights its samples). Its
quantiles have no closed form; :func:`mixture_quantile` solves ``F(y) = q`` for the mixture's CDF
``F(y) = sum_s w_s Phi((y - m_s) / sqrt(v_s))`` by bisection, started from the bracket
``[min_s Q_s(q), max_s Q_s(q)]`` of the components' own quantiles (every component's CDF is at
most ``q`` below it and at least ``q`` above it, so the mixture's is too). A component of
variance 0 is a point mass (a step in ``F``).
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
from scipy.special import ndtr, ndtri

__all__ = ["mixture_cdf", "mixture_quantile", "central_interval"]

#: Bisection halvings at most: from any bracket of finite floats to adjacent float64 values.
MAX_HALVINGS = 2200


def _check(mean, var, log_weights) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    mean = np.asarray(mean, dtype=np.float64)
    var = np.asarray(var, dtype=np.float64)
    if mean.ndim < 1 or mean.shape[0] == 0:
        raise ValueError(
            f"mean must be [S, ...] with S >= 1 components, got shape {list(mean.shape)}"
        )
    if var.shape != mean.shape:
        raise ValueError(f"var has shape {list(var.shape)} but mean has {list(mean.shape)}")
    if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(var))):
        raise ValueError("mean and var must be finite")
    if np.any(var < 0):
        raise ValueError("var must be non-negative")
    S = mean.shape[0]
    if log_weights is None:
        weights = np.full(S, 1.0 / S)
    else:
        log_weights = np.asarray(log_weights, dtype=np.float64)
        if log_weights.shape != (S,):
            raise ValueError(f"log_weights must have shape [{S}], got {list(log_weights.shape)}")
        weights = np.exp(log_weights - np.max(log_weights))
        weights = weights / weights.sum()
    return mean, var, weights.reshape((S,) + (1,) * (mean.ndim - 1))


def _cdf(y, mean, sd, weights):
    z = np.where(
        sd > 0, (y - mean) / np.where(sd > 0, sd, 1.0), np.where(y >= mean, np.inf, -np.inf)
    )
    return np.sum(weights * ndtr(z), axis=0)


def mixture_cdf(y, mean, var, log_weights=None) -> np.ndarray:
    """The mixture's CDF at ``y`` ``[...]``, components ``mean``, ``var`` ``[S, ...]`` and
    ``log_weights`` ``[S]`` (``None``: equal weights).

    :raises ValueError: shapes that do not match, non-finite values or a negative variance.
    """
    mean, var, weights = _check(mean, var, log_weights)
    return _cdf(np.asarray(y, dtype=np.float64), mean, np.sqrt(var), weights)


def mixture_quantile(q: float, mean, var, log_weights=None) -> np.ndarray:
    """The ``q``-quantile ``[...]`` of each mixture (components ``mean``, ``var`` ``[S, ...]``,
    ``log_weights`` ``[S]`` or ``None``): the smallest ``y`` with ``F(y) >= q``, to adjacent
    floats.

    :raises ValueError: ``q`` outside ``(0, 1)``, or bad components (:func:`mixture_cdf`).
    """
    if (
        isinstance(q, bool)
        or not isinstance(q, (int, float, np.floating))
        or not 0.0 < float(q) < 1.0
    ):
        raise ValueError(f"q must be a probability in (0, 1), got {q!r}")
    mean, var, weights = _check(mean, var, log_weights)
    sd = np.sqrt(var)
    own = mean + sd * ndtri(float(q))  # each component's quantile (a point mass's is its location)
    lo, hi = own.min(axis=0), own.max(axis=0)
    at_lower_end = _cdf(lo, mean, sd, weights) >= q  # a point mass at the bracket's lower end
    hi = np.where(at_lower_end, lo, hi)
    for _ in range(MAX_HALVINGS):
        mid = lo + 0.5 * (hi - lo)
        open_ = (mid > lo) & (mid < hi)
        if not open_.any():
            break
        below = _cdf(mid, mean, sd, weights) < q
        lo = np.where(open_ & below, mid, lo)
        hi = np.where(open_ & ~below, mid, hi)
    return hi


def central_interval(level: float, mean, var, log_weights=None) -> Tuple[np.ndarray, np.ndarray]:
    """The central ``level`` interval of each mixture: its ``(1 - level) / 2`` and
    ``(1 + level) / 2`` quantiles (:func:`mixture_quantile`), ``(lower, upper)`` ``[...]``.

    :raises ValueError: ``level`` outside ``(0, 1)``, or bad components.
    """
    if (
        isinstance(level, bool)
        or not isinstance(level, (int, float, np.floating))
        or not 0.0 < float(level) < 1.0
    ):
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    level = float(level)
    return (
        mixture_quantile(0.5 * (1.0 - level), mean, var, log_weights),
        mixture_quantile(0.5 * (1.0 + level), mean, var, log_weights),
    )
