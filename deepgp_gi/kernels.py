"""Kernel evaluation batched over a leading sample axis.

GPflow kernels broadcast a batch of inputs against a batch of inputs as an outer product
(``K(X[S,N,D], Z[S,M,D])`` is ``[S,N,S,M]``). Deep GPs need the *paired* batch: sample ``s`` of
``X`` against sample ``s`` of ``Z``, ``[S,N,M]``. This module provides that for GPflow's
isotropic stationary kernels (SquaredExponential, Matern*, RationalQuadratic, ...), ``White``,
``Constant``, ``Linear`` and sums and products of them. Any other kernel joins by defining
``batched_cross(X, Z) -> [..., N, M]`` for inputs with equal batch shapes (used for ``K(X, X)``
too) and a ``K_diag`` that batches. The kernel objects themselves (and so
their parameters, priors and transforms) are ordinary GPflow kernels.

Inputs without a sample axis (``[M, D]``, e.g. fixed inducing inputs) broadcast against every
sample.
"""
from __future__ import annotations

import gpflow
import tensorflow as tf
from check_shapes import check_shapes

__all__ = ["batched_K", "batched_K_diag", "batched_K_sym", "SUPPORTED_KERNELS"]

SUPPORTED_KERNELS = (
    "gpflow.kernels.IsotropicStationary (SquaredExponential, Matern12/32/52, RationalQuadratic, ...)",
    "gpflow.kernels.White",
    "gpflow.kernels.Constant",
    "gpflow.kernels.Linear",
    "gpflow.kernels.Sum / Product of the above",
)


def _scaled(kernel, X):
    return X / kernel.lengthscales


def _batched_square_distance(X: tf.Tensor, Z: tf.Tensor) -> tf.Tensor:
    """||x - z||^2 for paired batches: X [..., N, D], Z [..., M, D] -> [..., N, M]."""
    Xs = tf.reduce_sum(tf.square(X), axis=-1)
    Zs = tf.reduce_sum(tf.square(Z), axis=-1)
    cross = tf.matmul(X, Z, transpose_b=True)
    dist = Xs[..., :, None] + Zs[..., None, :] - 2.0 * cross
    return tf.maximum(dist, 0.0)


def _cross(kernel, X, Z):
    if hasattr(kernel, "batched_cross"):
        return kernel.batched_cross(X, Z)
    if isinstance(kernel, gpflow.kernels.Sum):
        return tf.add_n([_cross(k, X, Z) for k in kernel.kernels])
    if isinstance(kernel, gpflow.kernels.Product):
        out = _cross(kernel.kernels[0], X, Z)
        for k in kernel.kernels[1:]:
            out = out * _cross(k, X, Z)
        return out
    if isinstance(kernel, gpflow.kernels.White):
        return tf.zeros(_pair_shape(X, Z), dtype=X.dtype)
    if isinstance(kernel, gpflow.kernels.Constant):
        return tf.fill(_pair_shape(X, Z), tf.cast(kernel.variance, X.dtype))
    if isinstance(kernel, gpflow.kernels.Linear):
        return tf.matmul(X * kernel.variance, Z, transpose_b=True)
    if isinstance(kernel, gpflow.kernels.IsotropicStationary):
        r2 = _batched_square_distance(_scaled(kernel, X), _scaled(kernel, Z))
        return kernel.K_r2(r2)
    raise TypeError(
        f"kernel {type(kernel).__name__} has no sample-batched evaluation; supported: "
        + ", ".join(SUPPORTED_KERNELS)
    )


def _pair_shape(X, Z):
    batch = tf.broadcast_dynamic_shape(tf.shape(X)[:-2], tf.shape(Z)[:-2])
    return tf.concat([batch, tf.shape(X)[-2:-1], tf.shape(Z)[-2:-1]], axis=0)


def _broadcast_pair(X, Z):
    """Give X and Z the same batch shape (a [M, D] input is shared by every sample)."""
    batch = tf.broadcast_dynamic_shape(tf.shape(X)[:-2], tf.shape(Z)[:-2])
    X = tf.broadcast_to(X, tf.concat([batch, tf.shape(X)[-2:]], 0))
    Z = tf.broadcast_to(Z, tf.concat([batch, tf.shape(Z)[-2:]], 0))
    return X, Z


@check_shapes("X: [batch..., N, D]", "Z: [batch2..., M, D]", "return: [broadcast_batch..., N, M]")
def batched_K(kernel: gpflow.kernels.Kernel, X: tf.Tensor, Z: tf.Tensor) -> tf.Tensor:
    """Cross-covariance with paired batch axes: ``[S,N,D] x [S,M,D] -> [S,N,M]``.

    Either input may lack the sample axis (``[N, D]``), in which case it is shared by every
    sample. White-noise components contribute nothing to a cross-covariance (GPflow's semantics).
    """
    X, Z = _broadcast_pair(X, Z)
    return _cross(kernel, X, Z)


def _sym(kernel, X):
    if hasattr(kernel, "batched_cross"):
        return kernel.batched_cross(X, X)
    if isinstance(kernel, gpflow.kernels.Sum):
        return tf.add_n([_sym(k, X) for k in kernel.kernels])
    if isinstance(kernel, gpflow.kernels.Product):
        out = _sym(kernel.kernels[0], X)
        for k in kernel.kernels[1:]:
            out = out * _sym(k, X)
        return out
    if isinstance(kernel, gpflow.kernels.White):
        eye = tf.eye(tf.shape(X)[-2], batch_shape=tf.shape(X)[:-2], dtype=X.dtype)
        return kernel.variance * eye
    return _cross(kernel, X, X)


@check_shapes("X: [batch..., N, D]", "return: [batch..., N, N]")
def batched_K_sym(kernel: gpflow.kernels.Kernel, X: tf.Tensor) -> tf.Tensor:
    """Covariance of X with itself, ``[S,N,D] -> [S,N,N]``; White components add to the diagonal."""
    return _sym(kernel, X)


@check_shapes("X: [batch..., N, D]", "return: [batch..., N]")
def batched_K_diag(kernel: gpflow.kernels.Kernel, X: tf.Tensor) -> tf.Tensor:
    """Marginal variances ``[S,N,D] -> [S,N]`` (GPflow's ``K_diag`` already batches)."""
    _check_supported(kernel)
    return kernel.K_diag(X)


def _check_supported(kernel):
    if hasattr(kernel, "batched_cross"):
        return
    if isinstance(kernel, (gpflow.kernels.Sum, gpflow.kernels.Product)):
        for k in kernel.kernels:
            _check_supported(k)
        return
    if not isinstance(
        kernel,
        (gpflow.kernels.White, gpflow.kernels.Constant, gpflow.kernels.Linear, gpflow.kernels.IsotropicStationary),
    ):
        raise TypeError(
            f"kernel {type(kernel).__name__} has no sample-batched evaluation; supported: "
            + ", ".join(SUPPORTED_KERNELS)
        )


def check_kernel_supported(kernel: gpflow.kernels.Kernel) -> None:
    """Raise ``TypeError`` naming the kernel if it has no batched evaluation."""
    _check_supported(kernel)
