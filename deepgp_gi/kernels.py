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

import contextlib
import threading
from typing import Callable, Iterator, Optional, Union

import gpflow
import tensorflow as tf
from check_shapes import check_shapes

__all__ = [
    "batched_K",
    "batched_K_diag",
    "batched_K_sym",
    "constant_diagonal",
    "shared_parameter_reads",
    "SUPPORTED_KERNELS",
    "WeightKernel",
    "ACTIVATIONS",
    "get_activation",
]

SUPPORTED_KERNELS = (
    "gpflow.kernels.IsotropicStationary (SquaredExponential, Matern12/32/52, RationalQuadratic, "
    "...)",
    "gpflow.kernels.White",
    "gpflow.kernels.Constant",
    "gpflow.kernels.Linear",
    "gpflow.kernels.Sum / Product of the above",
)


_READS = threading.local()


@contextlib.contextmanager
def shared_parameter_reads() -> Iterator[None]:
    """Within the block, each kernel parameter this module reads is read (and transformed) once
    per graph, not once per kernel evaluation: a deep GP's forward pass evaluates a layer's kernel
    two or three times (``K_uu``, ``K_uf``, the diagonal), each of which would otherwise read the
    variance and the lengthscales and run their transforms (and their gradients) again. The
    values are those of the block's first read, so no parameter may be assigned inside the block;
    ``DeepGP`` opens one around each ``propagate``. Nested blocks share the outer one's reads."""
    if getattr(_READS, "cache", None) is not None:
        yield
        return
    _READS.cache = {}
    try:
        yield
    finally:
        _READS.cache = None


def _read(parameter) -> tf.Tensor:
    """The (constrained) value of a parameter, shared within :func:`shared_parameter_reads`."""
    cache = getattr(_READS, "cache", None)
    if cache is None:
        return tf.convert_to_tensor(parameter)
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    hit = cache.get((id(parameter), id(graph)))
    if hit is not None and hit[0] is parameter and hit[1] is graph:
        return hit[2]
    value = tf.convert_to_tensor(parameter)
    cache[(id(parameter), id(graph))] = (parameter, graph, value)
    return value


def _lengthscales(kernel) -> tf.Tensor:
    """The kernel's lengthscales, read (and transformed) once per kernel evaluation, or once per
    forward pass within :func:`shared_parameter_reads`."""
    return _read(kernel.lengthscales)


def _K_r2(kernel, r2: tf.Tensor) -> tf.Tensor:
    """``kernel.K_r2(r2)``; for the squared exponential, GPflow's ``variance * exp(-r2 / 2)`` with
    the variance read through :func:`_read`."""
    if type(kernel) is gpflow.kernels.SquaredExponential:
        return _read(kernel.variance) * tf.exp(-0.5 * r2)
    return kernel.K_r2(r2)


def constant_diagonal(kernel) -> Optional[tf.Tensor]:
    """The scalar ``k(x, x)`` of a kernel whose prior variance does not depend on ``x`` (a
    stationary kernel, ``White``, ``Constant``, and sums and products of them), else None."""
    if isinstance(kernel, gpflow.kernels.Sum) or isinstance(kernel, gpflow.kernels.Product):
        parts = [constant_diagonal(k) for k in kernel.kernels]
        if any(p is None for p in parts):
            return None
        out = parts[0]
        for p in parts[1:]:
            out = out + p if isinstance(kernel, gpflow.kernels.Sum) else out * p
        return out
    if hasattr(kernel, "batched_cross"):
        return None
    if isinstance(
        kernel, (gpflow.kernels.Stationary, gpflow.kernels.White, gpflow.kernels.Constant)
    ):
        variance = _read(kernel.variance)
        return variance if variance.shape.rank == 0 else tf.squeeze(variance)
    return None


def batched_square_distance(X: tf.Tensor, Z: tf.Tensor, clamp: bool = True) -> tf.Tensor:
    """||x - z||^2 for paired batches: X [..., N, D], Z [..., M, D] -> [..., N, M].

    Round-off can leave an entry slightly below zero (about -1e-15 relative in float64); with
    ``clamp`` it is set to zero, which a kernel of ``sqrt(r2)`` (the Matern family) needs. The
    squared exponential's ``exp(-r2 / 2)`` takes such an entry as it is (a relative change of the
    same size), and its callers pass ``clamp=False``: the clamp and its gradient's mask are three
    data-sized ops per kernel evaluation (:func:`_needs_clamp`)."""
    Xs = tf.reduce_sum(tf.square(X), axis=-1, keepdims=True)  # [..., N, 1]
    Zs = tf.expand_dims(tf.reduce_sum(tf.square(Z), axis=-1), -2)  # [..., 1, M]
    cross = tf.matmul(X, Z, transpose_b=True)
    dist = Xs + Zs - 2.0 * cross
    return tf.maximum(dist, 0.0) if clamp else dist


def _needs_clamp(kernel) -> bool:
    """Whether ``kernel.K_r2`` needs ``r2 >= 0`` exactly (every kernel but the squared
    exponential, whose ``exp(-r2 / 2)`` is smooth through zero)."""
    return type(kernel) is not gpflow.kernels.SquaredExponential


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
        return tf.fill(_pair_shape(X, Z), tf.cast(_read(kernel.variance), X.dtype))
    if isinstance(kernel, gpflow.kernels.Linear):
        return tf.matmul(X * _read(kernel.variance), Z, transpose_b=True)
    if isinstance(kernel, gpflow.kernels.IsotropicStationary):
        lengthscales = _lengthscales(kernel)
        return _K_r2(
            kernel,
            batched_square_distance(X / lengthscales, Z / lengthscales, _needs_clamp(kernel)),
        )
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
    if not _broadcasts(kernel):
        X, Z = _broadcast_pair(X, Z)
    return _cross(kernel, X, Z)


def _broadcasts(kernel) -> bool:
    """Whether :func:`_cross` broadcasts an input without the sample axis by itself (GPflow's
    kernels here do, through their matrix products; a ``batched_cross`` needs equal batches)."""
    if isinstance(kernel, (gpflow.kernels.Sum, gpflow.kernels.Product)):
        return all(_broadcasts(k) for k in kernel.kernels)
    return not hasattr(kernel, "batched_cross")


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
        return _read(kernel.variance) * eye
    if isinstance(kernel, gpflow.kernels.IsotropicStationary):
        scaled = X / _lengthscales(kernel)  # one read, one scaling, for both sides
        return _K_r2(kernel, batched_square_distance(scaled, scaled, _needs_clamp(kernel)))
    return _cross(kernel, X, X)


@check_shapes("X: [batch..., N, D]", "return: [batch..., N, N]")
def batched_K_sym(kernel: gpflow.kernels.Kernel, X: tf.Tensor) -> tf.Tensor:
    """Covariance of X with itself, ``[S,N,D] -> [S,N,N]``; White components add to the diagonal."""
    return _sym(kernel, X)


@check_shapes("X: [batch..., N, D]", "return: [batch..., N]")
def batched_K_diag(kernel: gpflow.kernels.Kernel, X: tf.Tensor) -> tf.Tensor:
    """Marginal variances ``[S,N,D] -> [S,N]`` (GPflow's ``K_diag`` already batches; a kernel
    with a :func:`constant_diagonal` is one fill of its scalar)."""
    _check_supported(kernel)
    value = constant_diagonal(kernel)
    if value is None:
        return kernel.K_diag(X)
    shape = tf.convert_to_tensor(X).shape[:-1]
    return tf.fill(shape.as_list() if shape.is_fully_defined() else tf.shape(X)[:-1], value)


def _check_supported(kernel):
    if hasattr(kernel, "batched_cross"):
        return
    if isinstance(kernel, (gpflow.kernels.Sum, gpflow.kernels.Product)):
        for k in kernel.kernels:
            _check_supported(k)
        return
    if not isinstance(
        kernel,
        (
            gpflow.kernels.White,
            gpflow.kernels.Constant,
            gpflow.kernels.Linear,
            gpflow.kernels.IsotropicStationary,
        ),
    ):
        raise TypeError(
            f"kernel {type(kernel).__name__} has no sample-batched evaluation; supported: "
            + ", ".join(SUPPORTED_KERNELS)
        )


def check_kernel_supported(kernel: gpflow.kernels.Kernel) -> None:
    """Raise ``TypeError`` naming the kernel if it has no batched evaluation."""
    _check_supported(kernel)


# ----------------------------------------------------------------------------- weight kernel
def _identity(x):
    return x


#: Names accepted for ``activation`` (a callable mapping tensors elementwise is accepted too).
ACTIVATIONS = {
    "identity": _identity,
    "linear": _identity,
    "relu": tf.nn.relu,
    "tanh": tf.math.tanh,
    "sigmoid": tf.math.sigmoid,
    "elu": tf.nn.elu,
    "softplus": tf.math.softplus,
    "swish": tf.nn.silu,
    "leaky_relu": tf.nn.leaky_relu,
}


def get_activation(activation: Union[None, str, Callable]) -> Callable:
    """The elementwise function for a name in :data:`ACTIVATIONS`, ``None`` (identity) or a
    callable."""
    if activation is None:
        return _identity
    if callable(activation):
        return activation
    if isinstance(activation, str) and activation in ACTIVATIONS:
        return ACTIVATIONS[activation]
    raise ValueError(
        f"unknown activation {activation!r}; choose one of {', '.join(map(repr, ACTIVATIONS))}"
    )


class WeightKernel(gpflow.kernels.Kernel):
    """The kernel induced by random linear weights on a finite feature map.

    ``k(f, f') = weight_variance * phi_b(f)^T phi_b(f')`` with ``phi_b(f) = [phi(f), 1]`` (the
    bias column when ``bias``), i.e. ``K(F) = Phi S Phi^T / D`` with ``S/D = weight_variance``.

    :param input_dim: width of the inputs (``N_{l-1}``).
    :param activation: ``phi``, a name in :data:`ACTIVATIONS` or a callable.
    :param bias: append a column of ones to the features.
    :param weight_variance: the prior variance of one weight, ``E[P^{-1}]``; default ``1/D``
        (NealPrior). It is a fixed number, not a parameter: the prior's randomness (if any) is
        handled by the posterior with the layer's :class:`~deepgp_gi.priors.WeightPrior`.
    """

    def __init__(
        self,
        input_dim: int,
        activation: Union[None, str, Callable] = "identity",
        bias: bool = True,
        weight_variance: Optional[float] = None,
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        self.input_dim = int(input_dim)
        self.activation_name = (
            activation if isinstance(activation, str) else getattr(activation, "__name__", "custom")
        )
        self.activation = get_activation(activation)
        self.bias = bool(bias)
        self.num_features = self.input_dim + int(self.bias)
        if weight_variance is None:
            weight_variance = 1.0 / self.num_features
        if not weight_variance > 0:
            raise ValueError(f"weight_variance must be positive, got {weight_variance}")
        self.weight_variance = float(weight_variance)

    @check_shapes("F: [batch..., N, D_in]", "return: [batch..., N, D]")
    def features(self, F: tf.Tensor) -> tf.Tensor:
        """The feature map ``Phi = [phi(F), 1]``: ``[..., N, input_dim] -> [..., N, D]``."""
        F = tf.convert_to_tensor(F)
        if F.shape[-1] is not None and F.shape[-1] != self.input_dim:
            raise ValueError(
                f"WeightKernel expects inputs with {self.input_dim} columns, got shape {F.shape}"
            )
        Phi = self.activation(F)
        if self.bias:
            ones = tf.ones(tf.concat([tf.shape(F)[:-1], [1]], 0), dtype=Phi.dtype)
            Phi = tf.concat([Phi, ones], axis=-1)
        return Phi

    def _scale(self, dtype):
        return tf.constant(self.weight_variance, dtype)

    @check_shapes("X: [batch..., N, D_in]", "Z: [batch..., M, D_in]", "return: [batch..., N, M]")
    def batched_cross(self, X: tf.Tensor, Z: tf.Tensor) -> tf.Tensor:
        """Paired-batch covariance ``[..., N, M]`` (sample ``s`` of X against sample ``s`` of Z)."""
        PX, PZ = self.features(X), self.features(Z)
        return self._scale(PX.dtype) * tf.linalg.matmul(PX, PZ, transpose_b=True)

    def K(self, X, X2=None):
        """GPflow semantics: ``[..., N, D] x [..., M, D] -> [..., N, ..., M]`` (outer over
        batches)."""
        PX = self.features(X)
        PZ = PX if X2 is None else self.features(X2)
        if PX.shape.rank == 2 and PZ.shape.rank == 2:
            out = tf.linalg.matmul(PX, PZ, transpose_b=True)
        else:
            out = tf.tensordot(PX, PZ, [[-1], [-1]])
        return self._scale(PX.dtype) * out

    def K_diag(self, X):
        """Marginal variances ``[..., N]``."""
        PX = self.features(X)
        return self._scale(PX.dtype) * tf.reduce_sum(tf.square(PX), axis=-1)
