"""Layers are the prior: :mod:`~deepgp_gi.layers.gp` (GPLayer, DenseLayer) and
:mod:`~deepgp_gi.layers.convolutional` (the layers of convolutional BNNs)."""
from .convolutional import (
    Activation,
    AveragePool2D,
    Conv2DLayer,
    DeterministicLayer,
    Flatten,
    GlobalAveragePool2D,
    InducingBatchNorm,
    ResidualBlock,
    apply_weights,
    check_network,
    is_convolution,
    is_weighted,
    run_layers,
    weighted_layers,
)
from .gp import DenseLayer, GPLayer

__all__ = ["GPLayer", "DenseLayer", "Conv2DLayer", "Activation", "AveragePool2D", "GlobalAveragePool2D", "Flatten", "ResidualBlock", "InducingBatchNorm", "DeterministicLayer", "is_weighted", "weighted_layers", "is_convolution", "apply_weights", "run_layers", "check_network"]
