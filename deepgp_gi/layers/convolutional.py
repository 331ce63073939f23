"""Layers of convolutional BNNs seen as deep GPs (docs/algorithms.md, "Convolutional
global inducing"; O&A 2021 §2.2, App. C, O).

Rows are images: a layer maps ``[S, R, H, W, C]`` (S samples, R rows: the data images, and in
the inducing families the inducing images stacked above them) to the next shape. Every layer
has ``input_shape``/``output_shape`` (without the row axis) and, so that a stack of them is a
layer chain like any other, ``input_dim``/``output_dim``: the size of the last axis.

* :class:`Conv2DLayer` is the only layer with weights here: a stride-1 ``k x k`` convolution
  with a bias, a weight prior (:mod:`deepgp_gi.priors`) and, for the local-inducing posterior,
  its own inducing images. Its weights ``W`` ``[S, k*k*C_in + 1, C_out]`` are in the
  offset-major feature order of :mod:`deepgp_gi.autocorrelation`.
* The deterministic layers act on data and inducing rows alike: :class:`Activation`,
  :class:`AveragePool2D`, :class:`GlobalAveragePool2D`, :class:`Flatten`,
  :class:`ResidualBlock` (identity shortcut around a body of layers) and
  :class:`InducingBatchNorm` (normalised with statistics of the inducing rows only, App. O).

A network ends with a :class:`~deepgp_gi.layers.DenseLayer` after :class:`Flatten` or
:class:`GlobalAveragePool2D`; :mod:`deepgp_gi.layers.network` walks and checks such stacks. The
posteriors of such stacks live in :mod:`deepgp_gi.posteriors.convolutional`.
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple, Union

import gpflow
import numpy as np
import tensorflow as tf

from ..autocorrelation import check_padding, output_size, patch_cross, patch_gram
from ..kernels import get_activation
from ..priors import NealPrior, WeightPrior, make_prior
from .base import Layer, WeightedLayer

__all__ = [
    "Conv2DLayer",
    "Activation",
    "AveragePool2D",
    "GlobalAveragePool2D",
    "Flatten",
    "ResidualBlock",
    "InducingBatchNorm",
    "DeterministicLayer",
    "ShapedLayer",
]


def _check_shape(shape, name: str) -> Tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError as err:
        raise TypeError(f"{name} must be a tuple of positive integers, got {shape!r}") from err
    if not shape or any(s < 1 for s in shape):
        raise ValueError(f"{name} must be a non-empty tuple of positive integers, got {shape!r}")
    return shape


def _image_shape(shape, name: str) -> Tuple[int, int, int]:
    shape = _check_shape(shape, name)
    if len(shape) != 3:
        raise ValueError(f"{name} must be (height, width, channels), got {shape!r}")
    return shape


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


class ShapedLayer(Layer):
    """A layer of image rows: ``input_shape``/``output_shape`` without the row axis, and their last
    axis as ``input_dim``/``output_dim``."""

    input_shape: Tuple[int, ...]
    output_shape: Tuple[int, ...]

    @property
    def input_dim(self) -> int:
        return self.input_shape[-1]

    @property
    def output_dim(self) -> int:
        return self.output_shape[-1]


class Conv2DLayer(ShapedLayer, WeightedLayer):
    """A stride-1 ``k x k`` convolution with bias as a deep-GP layer (the convolutional
    weight-induced kernel): ``F_out = conv(F_in, W) + b``.

    :param input_shape: ``(H, W, C_in)`` of the layer's input images.
    :param filters: ``C_out``.
    :param kernel_size: ``k`` (odd for ``"same"``).
    :param padding: ``"same"`` (zero padding; output ``H x W``) or ``"valid"`` (output
        ``(H-k+1) x (W-k+1)``).
    :param prior: a :class:`~deepgp_gi.priors.WeightPrior` or a name (default NealPrior: weights
        ``N(0, 1/D)`` with ``D = k*k*C_in + 1``).
    :param bias: include the bias (one more feature, always 1).
    :param inducing_images: ``[M, H, W, C_in]`` inducing inputs of the local-inducing posterior
        (a ``gpflow.Parameter``); ``None`` for the other families.
    """

    def __init__(
        self,
        input_shape: Sequence[int],
        filters: int,
        kernel_size: int = 3,
        padding: str = "same",
        prior: Union[None, str, WeightPrior] = None,
        bias: bool = True,
        inducing_images=None,
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        H, W, C = _image_shape(input_shape, "input_shape")
        self.filters = _positive_int(filters, "filters")
        self.kernel_size = _positive_int(kernel_size, "kernel_size")
        self.padding = check_padding(padding, self.kernel_size, (H, W))
        self.bias = bool(bias)
        self.prior = NealPrior() if prior is None else make_prior(prior)
        self.input_shape = (H, W, C)
        self.output_shape = (
            output_size(H, self.kernel_size, padding),
            output_size(W, self.kernel_size, padding),
            self.filters,
        )
        if inducing_images is not None:
            Z = np.asarray(inducing_images, dtype=np.float64)
            if Z.ndim != 4 or Z.shape[1:] != self.input_shape:
                raise ValueError(
                    f"inducing_images must have shape [M, {H}, {W}, {C}], got {Z.shape}"
                )
            if not np.all(np.isfinite(Z)):
                raise ValueError("inducing_images contains NaN or inf")
            self.inducing_images = gpflow.Parameter(
                Z.astype(gpflow.default_float()), name="inducing_images"
            )
        else:
            self.inducing_images = None

    @property
    def fan_in(self) -> int:
        """``D = k*k*C_in (+1)``: the number of features of a patch row, bias included."""
        return self.kernel_size**2 * self.input_shape[-1] + int(self.bias)

    @property
    def spatial_dim(self) -> int:
        """``k*k``: the size of the spatial (inverse-Wishart) prior's matrix."""
        return self.kernel_size**2

    @property
    def num_inducing(self) -> Optional[int]:
        return None if self.inducing_images is None else int(self.inducing_images.shape[0])

    def features(self, F: tf.Tensor) -> tf.Tensor:
        """The layer's input features are its inputs (activations are layers of their own)."""
        return F

    def gram(self, U: tf.Tensor, precision: tf.Tensor) -> tf.Tensor:
        """``X'^T Lambda X'`` ``[S, D, D]`` on inducing images ``U`` ``[S, M, H, W, C_in]``."""
        return patch_gram(U, precision, self.kernel_size, self.padding, self.bias)

    def cross(self, U: tf.Tensor, V: tf.Tensor, precision: tf.Tensor) -> tf.Tensor:
        """``X'^T Lambda V`` ``[S, D, C_out]`` for pseudo-outputs ``V`` ``[M, H', W', C_out]``."""
        return patch_cross(U, V, precision, self.kernel_size, self.padding, self.bias)

    def apply(self, F: tf.Tensor, W: tf.Tensor) -> tf.Tensor:
        """Convolve rows ``F`` ``[S, R, H, W, C_in]`` with sample ``s``'s filter ``W[s]``
        (``W`` ``[S, D, C_out]``), zero padding: ``[S, R, H', W', C_out]``."""
        S = F.shape[0]
        k, C, P = self.kernel_size, self.input_shape[-1], self.filters
        filt = tf.reshape(W[:, : k * k * C], [-1 if S is None else S, k, k, C, P])

        def convolve(F_s, filt_s, W_s):
            out = tf.nn.conv2d(F_s, filt_s, strides=1, padding=self.padding.upper())
            return out + W_s[-1] if self.bias else out

        if S is None:  # a sample count known only at run time (a saved model's input): a loop op
            return tf.map_fn(
                lambda args: convolve(*args), (F, filt, W), fn_output_signature=F.dtype
            )
        return tf.stack([convolve(F[s], filt[s], W[s]) for s in range(S)])


class DeterministicLayer(ShapedLayer):
    """A layer without weights: ``apply(F, num_inducing)`` maps every row the same way (only
    :class:`InducingBatchNorm` reads ``num_inducing``, the number of inducing rows on top)."""

    def apply(self, F: tf.Tensor, num_inducing: int = 0) -> tf.Tensor:  # pragma: no cover
        raise NotImplementedError


class Activation(DeterministicLayer):
    """An elementwise nonlinearity (a name in :data:`deepgp_gi.kernels.ACTIVATIONS` or a
    callable)."""

    def __init__(
        self,
        input_shape: Sequence[int],
        activation: Union[str, Callable] = "relu",
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        self.input_shape = self.output_shape = _check_shape(input_shape, "input_shape")
        self.activation_name = (
            activation if isinstance(activation, str) else getattr(activation, "__name__", "custom")
        )
        self.activation = get_activation(activation)

    def apply(self, F, num_inducing=0):
        return self.activation(F)


def _fold_rows(F: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
    """``[S, R, H, W, C]`` -> ``[S*R, H, W, C]`` and the ``[S, R]`` shape to unfold."""
    lead = tf.shape(F)[:2]
    return tf.reshape(F, tf.concat([[-1], tf.shape(F)[2:]], 0)), lead


class AveragePool2D(DeterministicLayer):
    """Non-overlapping ``pool x pool`` average pooling (the spatial size must divide)."""

    def __init__(self, input_shape: Sequence[int], pool: int = 2, name: Optional[str] = None):
        super().__init__(name=name)
        H, W, C = _image_shape(input_shape, "input_shape")
        self.pool = _positive_int(pool, "pool")
        if H % self.pool or W % self.pool:
            raise ValueError(f"pool={pool} must divide the image size {(H, W)}")
        self.input_shape = (H, W, C)
        self.output_shape = (H // self.pool, W // self.pool, C)

    def apply(self, F, num_inducing=0):
        flat, lead = _fold_rows(F)
        out = tf.nn.avg_pool2d(flat, self.pool, self.pool, "VALID")
        return tf.reshape(out, tf.concat([lead, tf.shape(out)[1:]], 0))


class GlobalAveragePool2D(DeterministicLayer):
    """The mean over the spatial axes: ``[S, R, H, W, C]`` -> ``[S, R, C]``."""

    def __init__(self, input_shape: Sequence[int], name: Optional[str] = None):
        super().__init__(name=name)
        H, W, C = _image_shape(input_shape, "input_shape")
        self.input_shape = (H, W, C)
        self.output_shape = (C,)

    def apply(self, F, num_inducing=0):
        return tf.reduce_mean(F, axis=[-3, -2])


class Flatten(DeterministicLayer):
    """``[S, R, H, W, C]`` -> ``[S, R, H*W*C]`` (row-major, as ``numpy.reshape``)."""

    def __init__(self, input_shape: Sequence[int], name: Optional[str] = None):
        super().__init__(name=name)
        self.input_shape = _check_shape(input_shape, "input_shape")
        self.output_shape = (int(np.prod(self.input_shape)),)

    def apply(self, F, num_inducing=0):
        return tf.reshape(F, tf.concat([tf.shape(F)[:2], [self.output_shape[0]]], 0))


class InducingBatchNorm(DeterministicLayer):
    """Batch normalisation whose statistics come from the inducing rows only (O&A App. O).

    Per sample and channel, the mean and variance over the first ``num_inducing`` rows and the
    spatial positions normalise every row, so a data row's output does not depend on the other
    data rows of its minibatch (predictions are per point). No learned scale or shift (the next
    weighted layer's weights absorb them). Only the families that propagate inducing rows
    (global, factorised_global) can use it.

    :param epsilon: added to the variance.
    """

    def __init__(
        self, input_shape: Sequence[int], epsilon: float = 1e-5, name: Optional[str] = None
    ):
        super().__init__(name=name)
        self.input_shape = self.output_shape = _check_shape(input_shape, "input_shape")
        if not (np.isfinite(epsilon) and epsilon > 0):
            raise ValueError(f"epsilon must be a positive number, got {epsilon!r}")
        self.epsilon = float(epsilon)

    def apply(self, F, num_inducing=0):
        if num_inducing < 1:
            raise ValueError(
                "InducingBatchNorm needs inducing rows (num_inducing >= 1): use it with the "
                "global or factorised_global posterior"
            )
        axes = [1] + list(range(2, F.shape.rank - 1))
        mean, var = tf.nn.moments(F[:, :num_inducing], axes=axes, keepdims=True)
        return (F - mean) * tf.math.rsqrt(var + tf.constant(self.epsilon, F.dtype))


class ResidualBlock(ShapedLayer):
    """``F + body(F)`` with an identity shortcut; ``body`` is a list of layers with the same
    output shape as input shape (e.g. conv-relu-conv-relu, App. O)."""

    def __init__(self, body: Sequence, name: Optional[str] = None):
        super().__init__(name=name)
        body = list(body)
        if not body:
            raise ValueError("body must contain at least one layer")
        for i in range(1, len(body)):
            if tuple(body[i].input_shape) != tuple(body[i - 1].output_shape):
                raise ValueError(
                    f"body[{i}].input_shape {body[i].input_shape} != body[{i - 1}].output_shape "
                    f"{body[i - 1].output_shape}"
                )
        if tuple(body[0].input_shape) != tuple(body[-1].output_shape):
            raise ValueError(
                f"a residual body must keep the shape: input {body[0].input_shape}, output "
                f"{body[-1].output_shape}"
            )
        self.body = body
        self.input_shape = self.output_shape = tuple(body[0].input_shape)
