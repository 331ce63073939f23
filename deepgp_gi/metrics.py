"""Test metrics in the papers' protocol: targets are standardised for training; the metrics are
reported in the original units (``y_std`` undoes the scaling)."""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from .validation import check_positive_int

__all__ = ["test_log_likelihood", "rmse", "predict_in_chunks", "evaluate_dataset"]


def predict_in_chunks(fn, X, chunk_size: int = 1000):
    """Apply ``fn`` to row chunks of ``X`` and concatenate along the point axis.

    Each chunk is a fresh Monte Carlo estimate; for the per-point metrics below this is exactly
    as valid as one pass (every point's predictive mixture has the same distribution).
    """
    outs = [fn(slice(i, min(i + chunk_size, len(X)))) for i in range(0, len(X), chunk_size)]
    return np.concatenate(outs, axis=-1 if np.ndim(outs[0]) == 1 else -2)


def test_log_likelihood(model, X_test, Y_test, y_std: float = 1.0, num_samples: int = 100, chunk_size: int = 1000):
    """Mean log predictive density per test point, in the original units of Y.

    ``log p(y_raw) = log p(y) - log y_std`` for targets standardised as ``(y_raw - m) / y_std``.
    """
    num_samples = check_positive_int(num_samples, "num_samples")
    _check_scale(y_std)
    X, Y = model.check_data((X_test, Y_test), names=("X_test", "Y_test"))
    X, Y = X.numpy(), Y.numpy()
    lpd = predict_in_chunks(lambda s: model.predict_log_density((X[s], Y[s]), num_samples).numpy(), X, chunk_size)
    return float(np.mean(lpd) - np.log(y_std))


def rmse(model, X_test, Y_test, y_std: float = 1.0, num_samples: int = 100, chunk_size: int = 1000):
    """Root-mean-square error of the predictive mixture mean, in the original units of Y."""
    num_samples = check_positive_int(num_samples, "num_samples")
    _check_scale(y_std)
    X, Y = model.check_data((X_test, Y_test), names=("X_test", "Y_test"))
    X, Y = X.numpy(), Y.numpy()
    mean = predict_in_chunks(lambda s: model.predict_y(X[s], num_samples)[0].numpy(), X, chunk_size)
    return float(y_std * np.sqrt(np.mean(np.square(Y - mean))))


def evaluate_dataset(model, dataset, y_std: float = 1.0, num_samples: int = 100, progress: bool = True):
    """Test log-likelihood and RMSE over a ``tf.data.Dataset`` of ``(X, Y)`` batches (e.g.
    :func:`deepgp_gi.datasets.read_shards` with ``shuffle=False``), in original units, without
    holding the data in memory: per-point sums are accumulated batch by batch, with a tqdm bar.

    :return: ``{"test_ll": mean log predictive density, "rmse": ..., "num_points": N}``; equal to
        :func:`test_log_likelihood` / :func:`rmse` on the concatenated data up to Monte Carlo
        error (each batch draws its own samples).
    """
    from tqdm.auto import tqdm

    num_samples = check_positive_int(num_samples, "num_samples")
    _check_scale(y_std)
    if not isinstance(dataset, tf.data.Dataset):
        raise TypeError(f"dataset must be a tf.data.Dataset of (X, Y) batches, got {type(dataset).__name__}")
    total_lpd, total_sq, count = 0.0, 0.0, 0
    with tqdm(desc="evaluate", unit="pt", disable=not progress, dynamic_ncols=True) as bar:
        for X_b, Y_b in dataset:
            X_b, Y_b = model.check_data((X_b, Y_b), names=("X (batch)", "Y (batch)"))
            total_lpd += float(tf.reduce_sum(model.predict_log_density((X_b, Y_b), num_samples)))
            mean = model.predict_y(X_b, num_samples)[0]
            total_sq += float(tf.reduce_sum(tf.square(Y_b - mean)))
            count += int(X_b.shape[0])
            bar.update(int(X_b.shape[0]))
    if count == 0:
        raise ValueError("dataset yielded no rows")
    return {
        "test_ll": total_lpd / count - float(np.log(y_std)),
        "rmse": float(y_std * np.sqrt(total_sq / count)),
        "num_points": count,
    }


def _check_scale(y_std):
    if not (np.ndim(y_std) == 0 and np.isfinite(y_std) and y_std > 0):
        raise ValueError(f"y_std must be a positive finite number, got {y_std!r}")
