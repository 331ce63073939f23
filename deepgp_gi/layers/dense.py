"""A fully-connected BNN layer seen as a deep-GP layer with the weight-induced kernel
(docs/algorithms.md, "BNNs as deep GPs")."""

from __future__ import annotations

from typing import Callable, Optional, Union

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

from ..kernels import WeightKernel
from ..priors import NealPrior, WeightPrior, make_prior
from .base import WeightedLayer
from .gp import GPLayer

__all__ = ["DenseLayer"]


class DenseLayer(GPLayer, WeightedLayer):
    """A fully-connected BNN layer as a deep-GP layer: width, activation and weight prior.

    ``F_out = [phi(F_in), 1] W`` with ``W`` ``[D, output_dim]``, ``D = input_dim + bias``. The
    layer is the prior only; the weights' approximate posterior lives in a posterior object from
    :mod:`deepgp_gi.posteriors` (factorised, inducing, inducing_weights).

    :param input_dim: ``N_{l-1}``.
    :param output_dim: ``N_l`` (the number of units).
    :param activation: ``phi`` applied to this layer's *inputs* (use ``"identity"`` for the first
        layer); a name in :data:`ACTIVATIONS` or a callable.
    :param prior: a :class:`~deepgp_gi.priors.WeightPrior` or one of ``"standard"``, ``"neal"``,
        ``"scale"``, ``"spatial_iw"``; default NealPrior.
    :param bias: append a column of ones to the features (``D = input_dim + 1``).
    :param inducing_features: ``[M, D]`` inducing *features* for the local-inducing posterior.
        They live in feature space (rows of ``Phi``, bias column included and learned), not in
        the layer's input space, so they are ``layer.inducing_features`` (a ``gpflow.Parameter``)
        and not ``inducing_variable``/``Z`` (which are ``[M, input_dim]`` inputs for GP layers);
        ``None`` for the other families.
    """

    def __init__(
        self,
        input_dim: int,
        output_dim: int,
        activation: Union[None, str, Callable] = "identity",
        prior: Union[None, str, WeightPrior] = None,
        bias: bool = True,
        inducing_features=None,
        name: Optional[str] = None,
    ):
        prior = NealPrior() if prior is None else make_prior(prior)
        if isinstance(input_dim, bool) or int(input_dim) != input_dim or int(input_dim) < 1:
            raise ValueError(f"input_dim must be a positive integer, got {input_dim!r}")
        if isinstance(output_dim, bool) or int(output_dim) != output_dim or int(output_dim) < 1:
            raise ValueError(f"output_dim must be a positive integer, got {output_dim!r}")
        fan_in = int(input_dim) + int(bool(bias))
        kernel = WeightKernel(
            int(input_dim), activation, bias, weight_variance=prior.weight_variance(fan_in)
        )
        super().__init__(
            kernel,
            int(output_dim),
            int(input_dim),
            mean_function=None,
            inducing_inputs=None,
            name=name,
        )
        self.prior = prior
        if inducing_features is not None:
            Z = np.asarray(inducing_features)
            if Z.ndim != 2 or Z.shape[1] != fan_in:
                raise ValueError(
                    f"inducing_features must have shape [M, {fan_in}] (feature space: input_dim "
                    f"{input_dim} + bias {int(bool(bias))}), got {Z.shape}"
                )
            if not np.all(np.isfinite(Z)):
                raise ValueError("inducing_features contains NaN or inf")
            self.inducing_features = gpflow.Parameter(
                Z.astype(gpflow.default_float()), name="inducing_features"
            )
        else:
            self.inducing_features = None

    @property
    def num_inducing(self) -> Optional[int]:
        """M, the number of inducing features (local inducing), else None."""
        return None if self.inducing_features is None else int(self.inducing_features.shape[0])

    @property
    def Z(self) -> tf.Tensor:
        raise AttributeError(
            "a DenseLayer has no inducing inputs Z; its local-inducing rows live in feature space "
            "as inducing_features [M, fan_in]"
        )

    @property
    def fan_in(self) -> int:
        """``D_l``: the number of features, bias column included."""
        return self.kernel.num_features

    @property
    def bias(self) -> bool:
        return self.kernel.bias

    @property
    def activation(self) -> Callable:
        return self.kernel.activation

    @check_shapes("F: [batch..., N, D_in]", "return: [batch..., N, D]")
    def features(self, F: tf.Tensor) -> tf.Tensor:
        """``Phi = [phi(F), 1]`` ``[..., N, fan_in]``."""
        return self.kernel.features(F)
