"""Compatibility aliases: ``DenseLayer`` lives in :mod:`deepgp_gi.layers` and ``WeightKernel`` in
:mod:`deepgp_gi.kernels`."""
from .kernels import ACTIVATIONS, WeightKernel, get_activation
from .layers import DenseLayer

__all__ = ["WeightKernel", "DenseLayer", "ACTIVATIONS", "get_activation"]
