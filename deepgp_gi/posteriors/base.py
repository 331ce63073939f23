"""The interface every approximate posterior of a deep GP implements.

A posterior owns every variational parameter and knows how to push inputs through the layers:
``posterior.propagate(X, num_samples, noise)`` returns a :class:`Propagation`. ``DeepGP`` builds
its ELBO and predictions from that alone, so a new family is one new subclass.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence

import gpflow
import tensorflow as tf

from ..layers import GPLayer
from ..noise import NoiseLike

__all__ = ["Propagation", "DeepPosterior"]


class Propagation(NamedTuple):
    """The result of pushing a batch of inputs through every layer.

    :ivar samples: one ``[S, N, D_l]`` tensor per layer: the sampled function values (the last
        entry is a sample of the last layer, drawn from ``mean``/``var``).
    :ivar mean: ``[S, N, P]`` mean of the last layer's conditional Gaussian per sample.
    :ivar var: ``[S, N, P]`` marginal variance of the last layer's conditional Gaussian.
    :ivar kl: ``[S]`` the regulariser subtracted in the ELBO for each sample: the analytic KL,
        or the sampled log-ratio ``log q - log p`` summed over layers.
    """

    samples: List[tf.Tensor]
    mean: tf.Tensor
    var: tf.Tensor
    kl: tf.Tensor


class DeepPosterior(gpflow.Module):
    """Base class: an approximate posterior over the functions of a stack of layers.

    The layers are read (kernels, mean functions, widths, local inducing inputs) but not owned:
    they are the model's, and are kept here outside TensorFlow's module tracking so that every
    parameter appears once in ``print_summary(model)``.

    Subclasses implement :meth:`propagate`.
    """

    # Layers belong to the model; do not track them twice.
    _TF_MODULE_IGNORED_PROPERTIES = gpflow.Module._TF_MODULE_IGNORED_PROPERTIES | frozenset({"_layers"})

    def __init__(self, layers: Sequence[GPLayer], name: Optional[str] = None):
        super().__init__(name=name)
        layers = list(layers)
        if len(layers) < 1:
            raise ValueError("layers must contain at least one layer (depth >= 1)")
        for i in range(1, len(layers)):
            if layers[i].input_dim != layers[i - 1].output_dim:
                raise ValueError(
                    f"layers[{i}].input_dim is {layers[i].input_dim} but layers[{i - 1}].output_dim "
                    f"is {layers[i - 1].output_dim}"
                )
        self.__dict__["_layers"] = tuple(layers)

    @property
    def layers(self) -> Sequence[GPLayer]:
        return self._layers

    @property
    def depth(self) -> int:
        return len(self._layers)

    def propagate(self, X: tf.Tensor, num_samples: int = 1, noise: NoiseLike = None) -> Propagation:
        """Push ``X`` [N, D] through every layer for ``num_samples`` joint samples.

        :param X: inputs ``[N, D]``.
        :param num_samples: S, the number of Monte Carlo samples (one sample = one draw of the
            functions of every layer).
        :param noise: ``None`` (fresh random draws), an int or ``[2]`` seed (reproducible draws),
            or a :class:`~deepgp_gi.noise.NoiseSource` (e.g. pre-drawn noise in tests).
        """
        raise NotImplementedError

    def sample_last_layer(self, mean, var, noise_source, dtype):
        """Draw the last layer's sample from its conditional marginals (name ``f/{L-1}``)."""
        eps = noise_source.normal(f"f/{self.depth - 1}", tf.shape(mean), dtype)
        return mean + tf.sqrt(tf.maximum(var, 0.0)) * eps
