"""GPflow likelihoods over the leading sample axis, and checks that targets suit them."""
from __future__ import annotations

import gpflow
import numpy as np
import tensorflow as tf

__all__ = ["expected_log_likelihood", "check_targets", "mixture_log_density"]


def expected_log_likelihood(likelihood, X, mean, var, Y) -> tf.Tensor:
    """``E_{N(f; mean, var)}[log p(Y | f)]`` per sample and point, ``[S, N]``.

    Analytic for the Gaussian likelihood; GPflow's quadrature (or its own closed form) otherwise.
    ``mean``/``var`` are ``[S, N, P]``; ``X`` ``[N, D]`` and ``Y`` ``[N, P_y]`` broadcast over S.
    """
    return likelihood.variational_expectations(X, mean, var, Y)


def mixture_log_density(likelihood, X, mean, var, Y) -> tf.Tensor:
    """``log (1/S) sum_s p(y_n | N(f; mean_s, var_s))`` per point, ``[N]``."""
    logp = likelihood.predict_log_density(X, mean, var, Y)  # [S, N]
    S = tf.cast(tf.shape(logp)[0], logp.dtype)
    return tf.reduce_logsumexp(logp, axis=0) - tf.math.log(S)


def check_targets(likelihood, Y: np.ndarray, name: str = "Y") -> None:
    """Reject targets that the likelihood cannot have produced (eager data only)."""
    if isinstance(likelihood, gpflow.likelihoods.Bernoulli):
        bad = ~np.isin(Y, (0.0, 1.0))
        if bad.any():
            row = int(np.nonzero(bad.any(axis=-1))[0][0])
            raise ValueError(
                f"{name} must hold 0/1 labels for a Bernoulli likelihood; row {row} has {Y[row].tolist()}"
            )
    elif isinstance(likelihood, gpflow.likelihoods.Poisson):
        if (Y < 0).any() or (np.round(Y) != Y).any():
            raise ValueError(f"{name} must hold non-negative integer counts for a Poisson likelihood")
    elif isinstance(likelihood, gpflow.likelihoods.Beta):
        if ((Y <= 0) | (Y >= 1)).any():
            raise ValueError(f"{name} must lie strictly inside (0, 1) for a Beta likelihood")
    elif isinstance(likelihood, (gpflow.likelihoods.Exponential, gpflow.likelihoods.Gamma)):
        if (Y < 0).any():
            raise ValueError(f"{name} must be non-negative for a {type(likelihood).__name__} likelihood")
