"""Walking a stack of layers: its weighted layers in forward order, rows pushed through it with
sampled weights, and the check that it forms a convolutional network a posterior can run.

The stack is a fully-connected network (:class:`~deepgp_gi.layers.DenseLayer` only) or a
convolutional one (:mod:`deepgp_gi.layers.convolutional`: convolutions, deterministic layers,
residual blocks, a DenseLayer last). The weight-space posteriors
(:mod:`deepgp_gi.posteriors.convolutional`, :mod:`deepgp_gi.posteriors.inducing_weights`) walk
it with :func:`run_layers` and index its :func:`weighted_layers`.
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import tensorflow as tf

from .base import WeightedLayer
from .convolutional import Conv2DLayer, DeterministicLayer, InducingBatchNorm, ResidualBlock

__all__ = [
    "is_weighted",
    "weighted_layers",
    "is_convolution",
    "apply_weights",
    "run_layers",
    "check_network",
]


def is_weighted(layer) -> bool:
    """Whether the layer has weights (a posterior over them): a :class:`WeightedLayer`
    (Conv2DLayer or DenseLayer)."""
    return isinstance(layer, WeightedLayer)


def weighted_layers(layers: Sequence) -> List:
    """The weighted layers of a stack in the order the forward pass meets them (residual bodies
    included)."""
    out = []
    for layer in layers:
        if isinstance(layer, ResidualBlock):
            out.extend(weighted_layers(layer.body))
        elif is_weighted(layer):
            out.append(layer)
    return out


def is_convolution(layer) -> bool:
    """Whether the layer is a convolution (a weighted layer acting on images by ``apply``)."""
    return isinstance(layer, Conv2DLayer)


def apply_weights(layer, Phi: tf.Tensor, W: tf.Tensor, transpose: bool = False) -> tf.Tensor:
    """A weighted layer's output for sampled weights: a convolution's ``apply(Phi, W)``
    (``[S, R, H', W', C_out]``) or a dense layer's ``Phi @ W`` (``[S, R, P]``).

    :param Phi: the layer's features (``layer.features(F)``).
    :param W: ``[S, D, P]`` (library layout; ``D`` = fan-in with the bias row), or ``[S, P, D]``
        (paper layout, rows are units) if ``transpose``.
    """
    if is_convolution(layer):
        return layer.apply(Phi, tf.linalg.matrix_transpose(W) if transpose else W)
    return tf.linalg.matmul(Phi, W, transpose_b=transpose)


def run_layers(
    layers: Sequence, H: tf.Tensor, weighted_step: Callable, num_inducing: int = 0
) -> tf.Tensor:
    """Push rows ``H`` ``[S, R, ...]`` through a stack in forward order: a weighted layer maps
    ``H`` by ``weighted_step(layer, H)`` (the posterior samples its weights there), a residual
    block adds its body's output to its input, and a deterministic layer applies itself
    (``num_inducing`` inducing rows on top, for :class:`InducingBatchNorm`). Weighted layers are
    met in the order of :func:`weighted_layers`."""
    for layer in layers:
        if isinstance(layer, ResidualBlock):
            H = H + run_layers(layer.body, H, weighted_step, num_inducing)
        elif is_weighted(layer):
            H = weighted_step(layer, H)
        else:
            H = layer.apply(H, num_inducing)
    return H


def check_network(layers: Sequence, family: str, inducing_rows: bool = False) -> List:
    """Check that ``layers`` form a convolutional network a posterior ``family`` can run and
    return its weighted layers: at least one weighted layer, a DenseLayer last, and otherwise
    only deterministic layers and residual blocks of them; :class:`InducingBatchNorm` only when
    the family propagates inducing rows (``inducing_rows``)."""

    def check(layer):
        if isinstance(layer, ResidualBlock):
            for inner in layer.body:
                check(inner)
        elif not is_weighted(layer) and not isinstance(layer, DeterministicLayer):
            raise TypeError(f"{type(layer).__name__} is not a layer of a convolutional network")
        elif isinstance(layer, InducingBatchNorm) and not inducing_rows:
            raise ValueError(
                f"InducingBatchNorm needs propagated inducing rows; the {family!r} family "
                "has none (use global or factorised_global, or drop the batch norm)"
            )

    layers = list(layers)
    weighted = weighted_layers(layers)
    if not weighted:
        raise ValueError("the network has no weighted layer")
    if is_convolution(layers[-1]) or not is_weighted(layers[-1]):
        raise ValueError("the last layer of a convolutional network must be a DenseLayer")
    for layer in layers:
        check(layer)
    return weighted
