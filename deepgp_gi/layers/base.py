"""The base classes of the layers: what the model, the posteriors and the network walk recognise.

* :class:`Layer`: every layer (a deep-GP layer, a BNN layer, a layer of a convolutional network).
  A stack of them is a layer chain: each has ``input_dim`` and ``output_dim``, the width of the
  last axis of its input and output.
* :class:`WeightedLayer`: a layer with weights under a weight prior, i.e. with a finite feature
  map: ``features(F)`` of width ``fan_in`` (bias included), weights ``W`` ``[fan_in, width]`` and
  ``prior``, a :class:`~deepgp_gi.priors.WeightPrior`. Its weights are what a weight-space
  posterior infers; :class:`~deepgp_gi.layers.DenseLayer` and
  :class:`~deepgp_gi.layers.Conv2DLayer` are the weighted layers.

Code that must tell layer kinds apart tests ``isinstance`` against these classes (or the concrete
layer classes), not the presence of attributes.
"""

from __future__ import annotations

import gpflow
import tensorflow as tf

from ..priors import WeightPrior

__all__ = ["Layer", "WeightedLayer", "check_layer_chain"]


class Layer(gpflow.Module):
    """The base of every layer of :mod:`deepgp_gi`: it has ``input_dim`` and ``output_dim``, the
    size of the last axis of its input and of its output (attributes or properties of the
    subclass)."""

    input_dim: int
    output_dim: int


class WeightedLayer(Layer):
    """A layer with weights ``W`` ``[fan_in, output_dim]`` under a weight prior: its output is
    ``features(F) W`` (a dense layer) or the convolution of ``features(F)`` with ``W``.

    A subclass sets ``prior`` (a :class:`~deepgp_gi.priors.WeightPrior`) and defines ``fan_in``
    and ``features``.
    """

    prior: WeightPrior

    @property
    def fan_in(self) -> int:
        """``D``: the number of features the weights multiply, bias included."""
        raise NotImplementedError

    def features(self, F: tf.Tensor) -> tf.Tensor:
        """The features ``Phi`` of inputs ``F`` that the weights act on."""
        raise NotImplementedError


def check_layer_chain(layers) -> list:
    """At least one layer, each a deepgp_gi layer (:class:`~deepgp_gi.layers.Layer`), each input
    width the previous output width."""
    layers = list(layers)
    if len(layers) < 1:
        raise ValueError("layers must contain at least one layer (depth >= 1)")
    for i, layer in enumerate(layers):
        if not isinstance(layer, Layer):
            raise TypeError(f"layers[{i}] is a {type(layer).__name__}, not a deepgp_gi layer")
        if i and layer.input_dim != layers[i - 1].output_dim:
            raise ValueError(
                f"layers[{i}].input_dim is {layer.input_dim} but layers[{i - 1}].output_dim "
                f"is {layers[i - 1].output_dim}"
            )
    return layers
