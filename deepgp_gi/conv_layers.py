"""Compatibility aliases: the convolutional layers live in :mod:`deepgp_gi.layers.convolutional`
and the walk over a stack of layers in :mod:`deepgp_gi.layers.network` (both re-exported by
:mod:`deepgp_gi.layers`)."""
from .layers.convolutional import (
    Activation,
    AveragePool2D,
    Conv2DLayer,
    DeterministicLayer,
    Flatten,
    GlobalAveragePool2D,
    InducingBatchNorm,
    ResidualBlock,
)
from .layers.network import apply_weights, check_network, is_convolution, is_weighted, run_layers, weighted_layers

__all__ = [
    "Conv2DLayer",
    "Activation",
    "AveragePool2D",
    "GlobalAveragePool2D",
    "Flatten",
    "ResidualBlock",
    "InducingBatchNorm",
    "DeterministicLayer",
    "is_weighted",
    "weighted_layers",
    "is_convolution",
    "apply_weights",
    "run_layers",
    "check_network",
]
