"""A latent-variable input layer: ``p(w) = N(0, I)`` and an amortised ``q(w | x, y)``.

A latent-variable deep GP (Salimbeni et al. 2019) feeds ``[x, w]`` to its first GP layer, with
one latent vector ``w_n`` ``[D_w]`` per data point. The prior is ``N(0, I)``; the approximate
posterior is a diagonal Gaussian whose mean and standard deviation an *encoder* computes from the
data point, ``q(w_n | x_n, y_n) = N(mu(x_n, y_n), diag sigma^2(x_n, y_n))``.

The encoder contract: any ``tf.Module`` called on ``[N, D + P_y]`` rows (``x_n`` and ``y_n``
side by side) that returns a pair ``(mean, scale)``, both ``[N, D_w]``, with ``scale > 0`` the
standard deviations. :class:`Encoder` is the default, the paper's MLP with two hidden layers of 20
tanh units. :class:`LatentVariableLayer` checks a custom encoder's output shapes once, when the
layer is built, and again (statically) wherever it is traced.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

from ..validation import check_positive_int
from .base import Layer

__all__ = ["Encoder", "LatentVariableLayer", "DEFAULT_ENCODER_HIDDEN"]

#: Hidden widths of the default encoder (Salimbeni et al. 2019: two layers of 20 tanh units).
DEFAULT_ENCODER_HIDDEN = (20, 20)

#: The default encoder's pre-softplus shift of the scale output: the scales start near
#: ``softplus(-3)`` = 0.05, so q(w) starts narrow and the first steps see informative draws.
SCALE_SHIFT = 3.0


class Encoder(gpflow.Module):
    """An MLP ``[x, y] -> (mean, scale)`` of a diagonal Gaussian ``q(w | x, y)``.

    Layers ``input_dim -> hidden[0] -> ... -> 2 latent_dim`` with ``activation`` between them
    (none after the last); the last layer's output is split into the mean and a raw scale,
    ``scale = softplus(raw - 3) + 1e-6`` (the floor keeps ``log q`` finite).

    :param input_dim: ``D + P_y``, the width of ``[x, y]``.
    :param latent_dim: ``D_w``.
    :param hidden: hidden widths (default two layers of 20).
    :param activation: the nonlinearity (default ``tf.tanh``).
    :param seed: seeds the initial weights (Glorot normal, zero biases).
    """

    def __init__(
        self,
        input_dim: int,
        latent_dim: int,
        hidden: Sequence[int] = DEFAULT_ENCODER_HIDDEN,
        activation=tf.tanh,
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        self.input_dim = check_positive_int(input_dim, "input_dim")
        self.latent_dim = check_positive_int(latent_dim, "latent_dim")
        hidden = [check_positive_int(h, "hidden width") for h in hidden]
        self.activation = activation
        rng = np.random.default_rng(seed)
        dims = [self.input_dim] + hidden + [2 * self.latent_dim]
        dtype = gpflow.default_float()
        self.weights = [
            gpflow.Parameter(
                rng.standard_normal((a, b)) * math.sqrt(2.0 / (a + b)), dtype=dtype, name=f"W_{i}"
            )
            for i, (a, b) in enumerate(zip(dims[:-1], dims[1:]))
        ]
        self.biases = [
            gpflow.Parameter(np.zeros(b), dtype=dtype, name=f"b_{i}")
            for i, b in enumerate(dims[1:])
        ]

    @check_shapes("inputs: [batch..., D]", "return[0]: [batch..., W]", "return[1]: [batch..., W]")
    def __call__(self, inputs: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(mean, scale)`` ``[..., D_w]`` each."""
        h = inputs
        last = len(self.weights) - 1
        for i, (W, b) in enumerate(zip(self.weights, self.biases)):
            h = tf.linalg.matmul(h, W) + b if h.shape.rank == 2 else tf.tensordot(h, W, 1) + b
            if i < last:
                h = self.activation(h)
        mean, raw = tf.split(h, 2, axis=-1)
        return mean, tf.nn.softplus(raw - SCALE_SHIFT) + 1e-6


class LatentVariableLayer(Layer):
    """The latent input ``w`` of a deep GP: ``p(w) = N(0, I)``, ``q(w | x, y)`` from an encoder.

    It is not one of the model's GP layers (it has no kernel); it sits in front of them:
    ``input_dim = D`` (the data's inputs) and ``output_dim = D + D_w`` (what the first GP layer
    sees).

    :param input_dim: ``D``.
    :param target_dim: ``P_y``, the number of target columns the encoder reads.
    :param latent_dim: ``D_w >= 1``.
    :param encoder: a ``tf.Module`` with the contract of the module docs; default
        :class:`Encoder` (``D + P_y -> 20 -> 20 -> 2 D_w``, tanh).
    :param seed: seeds the default encoder's initial weights.
    """

    def __init__(
        self,
        input_dim: int,
        target_dim: int,
        latent_dim: int,
        encoder: Optional[tf.Module] = None,
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        self.latent_dim = check_positive_int(latent_dim, "latent_dim")
        self.data_dim = check_positive_int(input_dim, "input_dim")
        self.target_dim = check_positive_int(target_dim, "target_dim")
        if encoder is None:
            encoder = Encoder(
                self.data_dim + self.target_dim, self.latent_dim, seed=seed, name="encoder"
            )
        elif not isinstance(encoder, tf.Module) or not callable(encoder):
            raise TypeError(
                "encoder must be a callable tf.Module (e.g. a gpflow.Module), got "
                f"{type(encoder).__name__}"
            )
        self.encoder = encoder
        self._check_encoder()

    @property
    def input_dim(self) -> int:
        return self.data_dim

    @property
    def output_dim(self) -> int:
        return self.data_dim + self.latent_dim

    def _check_encoder(self) -> None:
        """Call the encoder on two rows of zeros and check the contract, naming ``encoder``."""
        probe = tf.zeros([2, self.data_dim + self.target_dim], gpflow.default_float())
        self._encode(probe, rows=2)

    def _encode(self, inputs: tf.Tensor, rows=None) -> Tuple[tf.Tensor, tf.Tensor]:
        out = self.encoder(inputs)
        expected = (
            f"a pair (mean, scale) of shape [N, {self.latent_dim}] each "
            f"(latent_dim={self.latent_dim})"
        )
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise ValueError(f"encoder must return {expected}, got {type(out).__name__}")
        mean, scale = (tf.convert_to_tensor(t) for t in out)
        for what, t in (("mean", mean), ("scale", scale)):
            shape = t.shape
            if (
                shape.rank != 2
                or (shape[-1] is not None and shape[-1] != self.latent_dim)
                or (rows is not None and shape[0] is not None and shape[0] != rows)
            ):
                got = shape.as_list() if shape.rank is not None else shape
                raise ValueError(
                    f"encoder must return {expected}; its {what} has shape {got} "
                    f"for inputs of shape {inputs.shape.as_list()}"
                )
            if t.dtype != inputs.dtype:
                raise ValueError(
                    f"encoder returned a {what} of dtype {t.dtype.name} for {inputs.dtype.name} "
                    "inputs"
                )
        return mean, scale

    @check_shapes("X: [N, D]", "Y: [N, P]", "return[0]: [N, W]", "return[1]: [N, W]")
    def posterior(self, X: tf.Tensor, Y: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(mean, scale)`` ``[N, D_w]`` of ``q(w_n | x_n, y_n)``."""
        return self._encode(tf.concat([X, tf.cast(Y, X.dtype)], axis=-1))

    @staticmethod
    @check_shapes(
        "w: [batch..., W]",
        "mean: [broadcast batch..., W]",
        "scale: [broadcast batch..., W]",
        "return: [batch...]",
    )
    def log_ratio(w: tf.Tensor, mean: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
        """``log p(w) - log q(w)`` summed over the latent dimensions, ``[...]``.

        Written so that ``q = p`` (mean 0, scale 1) gives exactly 0: the ``2 pi`` terms cancel and
        ``(w - 0) / 1`` is ``w`` to the bit."""
        z = (w - mean) / scale
        per_dim = 0.5 * tf.square(z) - 0.5 * tf.square(w) + tf.math.log(scale)
        return tf.reduce_sum(per_dim, axis=-1)
