"""Toy problems: the 1D "gap" regression data and Bayesian linear regression with a known evidence.

:func:`gap_regression` is the toy of Ober & Aitchison (2021); :func:`deep_linear` draws
linear-regression data whose exact log evidence is :func:`deep_linear_log_evidence`, for
checking evidence bounds.

Plain NumPy (float64); nothing here touches TensorFlow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg

__all__ = ["gap_regression", "DeepLinearData", "deep_linear", "deep_linear_log_evidence"]


def gap_regression(num_data: int = 40, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The 1D toy of Ober & Aitchison (2021): a cubic with a gap in the inputs.

    Half the inputs are uniform on [-4, -2], the other half on [2, 4]; the outputs are
    ``y = x**3 + e`` with ``e ~ N(0, 3**2)``. Not standardised.

    :returns: ``(X, Y)``, both [num_data, 1] float64.
    """
    rng = np.random.default_rng(seed)
    n_left = num_data // 2
    x = np.concatenate([rng.uniform(-4.0, -2.0, n_left), rng.uniform(2.0, 4.0, num_data - n_left)])
    y = x**3 + 3.0 * rng.standard_normal(num_data)
    return x[:, None], y[:, None]


@dataclass(frozen=True, eq=False)
class DeepLinearData:
    """Data from :func:`deep_linear`: X_* [N, input_dim], Y_* [N, 1], w [input_dim, 1]."""

    X_train: np.ndarray
    Y_train: np.ndarray
    X_test: np.ndarray
    Y_test: np.ndarray
    w: np.ndarray
    noise_variance: float


def deep_linear(
    num_train: int = 1000,
    num_test: int = 100,
    input_dim: int = 5,
    noise_variance: float = 0.1,
    seed: int = 0,
) -> DeepLinearData:
    """Linear-regression data with a known prior, for checking evidence bounds.

    ``x ~ N(0, I)``, ``w ~ N(0, I / input_dim)`` (drawn once), ``y = x^T w + e`` with
    ``e ~ N(0, noise_variance)``. Under this prior the exact log evidence is
    :func:`deep_linear_log_evidence`.

    :returns: A :class:`DeepLinearData` with X_train [num_train, input_dim], Y_train [num_train, 1],
        X_test [num_test, input_dim], Y_test [num_test, 1], w [input_dim, 1].
    """
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((input_dim, 1)) / np.sqrt(input_dim)
    X = rng.standard_normal((num_train + num_test, input_dim))
    Y = X @ w + np.sqrt(noise_variance) * rng.standard_normal((num_train + num_test, 1))
    return DeepLinearData(
        X_train=X[:num_train],
        Y_train=Y[:num_train],
        X_test=X[num_train:],
        Y_test=Y[num_train:],
        w=w,
        noise_variance=float(noise_variance),
    )


def deep_linear_log_evidence(
    X: np.ndarray, Y: np.ndarray, input_dim: int, noise_variance: float
) -> float:
    """Exact log marginal likelihood of Bayesian linear regression.

    ``log N(Y; 0, X X^T / input_dim + noise_variance I)``, i.e. the evidence under
    ``w ~ N(0, I / input_dim)``; columns of Y are independent and their log densities summed.

    :param X: [N, input_dim] inputs.
    :param Y: [N, P] outputs (P = 1 usually).
    :param input_dim: prior precision scale of w (normally ``X.shape[1]``).
    :param noise_variance: observation noise variance.
    :returns: The log evidence, a float.
    """
    X = np.asarray(X, dtype=np.float64)
    Y = np.asarray(Y, dtype=np.float64).reshape(X.shape[0], -1)
    n, p = Y.shape
    K = X @ X.T / input_dim + noise_variance * np.eye(n)
    L = np.linalg.cholesky(K)
    alpha = scipy.linalg.solve_triangular(L, Y, lower=True)
    return float(
        -0.5 * np.sum(alpha**2) - p * np.sum(np.log(np.diag(L))) - 0.5 * n * p * np.log(2 * np.pi)
    )
