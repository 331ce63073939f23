"""Layers are the prior: a kernel, a mean function and a width per layer.

* :mod:`~deepgp_gi.layers.gp`: :class:`GPLayer`, a layer of a deep GP.
* :mod:`~deepgp_gi.layers.dense`: :class:`DenseLayer`, a fully-connected BNN layer seen as a
  deep-GP layer with the weight-induced kernel (docs/algorithms.md, "BNNs as deep GPs").
* :mod:`~deepgp_gi.layers.convolutional`: the layers of convolutional BNNs
  (:class:`Conv2DLayer`, pooling, :class:`Flatten`, :class:`Activation`, :class:`ResidualBlock`,
  :class:`InducingBatchNorm`).
* :mod:`~deepgp_gi.layers.network`: walking a stack of layers (:func:`weighted_layers`,
  :func:`run_layers`, :func:`check_network`).
* :mod:`~deepgp_gi.layers.base`: :class:`Layer`, the base of every layer, and
  :class:`WeightedLayer`, the base of the layers with weights under a weight prior (DenseLayer,
  Conv2DLayer), which the posteriors recognise by ``isinstance``.

A layer holds no variational parameters; those belong to the posterior object
(:mod:`deepgp_gi.posteriors`).
"""

from . import convolutional as _convolutional
from . import network as _network
from .base import Layer, WeightedLayer, check_layer_chain
from .convolutional import (  # noqa: F401 (re-exported: __all__ takes convolutional.__all__)
    Activation,
    AveragePool2D,
    Conv2DLayer,
    DeterministicLayer,
    Flatten,
    GlobalAveragePool2D,
    InducingBatchNorm,
    ResidualBlock,
    ShapedLayer,
)
from .dense import DenseLayer
from .gp import GPLayer
from .network import (  # noqa: F401 (re-exported: __all__ takes network.__all__)
    apply_weights,
    check_network,
    is_convolution,
    is_weighted,
    run_layers,
    weighted_layers,
)

#: The base classes, the GP and dense layers, then every public name of
#: :mod:`~deepgp_gi.layers.convolutional` and :mod:`~deepgp_gi.layers.network`.
__all__ = [
    "Layer",
    "WeightedLayer",
    "check_layer_chain",
    "GPLayer",
    "DenseLayer",
    *_convolutional.__all__,
    *_network.__all__,
]
