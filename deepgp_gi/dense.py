"""Fully-connected BNN layers seen as deep-GP layers (ALGORITHMS.md §2.4, "Model").

Layer ``l`` maps the previous layer's pre-activations ``F_{l-1}`` ``[..., N, N_{l-1}]`` to
``F_l = Phi_{l-1} W_l`` with features ``Phi_{l-1} = [phi(F_{l-1}), 1]`` ``[..., N, D_l]``
(``D_l = N_{l-1} + 1`` with the bias column) and weight columns ``w_lambda ~ N(0, S_l/D_l)``.
As a deep GP this is a layer of ``N_l`` independent GPs with the weight-induced kernel
``K(F) = Phi S_l Phi^T / D_l`` (:class:`WeightKernel`), zero mean and rank ``<= D_l``.

The nonlinearity belongs to the layer that *reads* the activations: the first layer uses the
identity, every later layer applies ``phi`` to its inputs. Samples of every layer are therefore
pre-activations, like the function values of a deep GP.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

from .layers import GPLayer
from .priors import NealPrior, WeightPrior, make_prior

__all__ = ["WeightKernel", "DenseLayer", "ACTIVATIONS", "get_activation"]


def _identity(x):
    return x


#: Names accepted for ``activation`` (a callable mapping tensors elementwise is accepted too).
ACTIVATIONS = {
    "identity": _identity,
    "linear": _identity,
    "relu": tf.nn.relu,
    "tanh": tf.math.tanh,
    "sigmoid": tf.math.sigmoid,
    "elu": tf.nn.elu,
    "softplus": tf.math.softplus,
    "swish": tf.nn.silu,
    "leaky_relu": tf.nn.leaky_relu,
}


def get_activation(activation: Union[None, str, Callable]) -> Callable:
    """The elementwise function for a name in :data:`ACTIVATIONS`, ``None`` (identity) or a callable."""
    if activation is None:
        return _identity
    if callable(activation):
        return activation
    if isinstance(activation, str) and activation in ACTIVATIONS:
        return ACTIVATIONS[activation]
    raise ValueError(f"unknown activation {activation!r}; choose one of {', '.join(map(repr, ACTIVATIONS))}")


class WeightKernel(gpflow.kernels.Kernel):
    """The kernel induced by random linear weights on a finite feature map.

    ``k(f, f') = weight_variance * phi_b(f)^T phi_b(f')`` with ``phi_b(f) = [phi(f), 1]`` (the
    bias column when ``bias``), i.e. ``K(F) = Phi S Phi^T / D`` with ``S/D = weight_variance``.

    :param input_dim: width of the inputs (``N_{l-1}``).
    :param activation: ``phi``, a name in :data:`ACTIVATIONS` or a callable.
    :param bias: append a column of ones to the features.
    :param weight_variance: the prior variance of one weight, ``E[P^{-1}]``; default ``1/D``
        (NealPrior). It is a fixed number, not a parameter: the prior's randomness (if any) is
        handled by the posterior with the layer's :class:`~deepgp_gi.priors.WeightPrior`.
    """

    def __init__(
        self,
        input_dim: int,
        activation: Union[None, str, Callable] = "identity",
        bias: bool = True,
        weight_variance: Optional[float] = None,
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        self.input_dim = int(input_dim)
        self.activation_name = activation if isinstance(activation, str) else getattr(activation, "__name__", "custom")
        self.activation = get_activation(activation)
        self.bias = bool(bias)
        self.num_features = self.input_dim + int(self.bias)
        if weight_variance is None:
            weight_variance = 1.0 / self.num_features
        if not weight_variance > 0:
            raise ValueError(f"weight_variance must be positive, got {weight_variance}")
        self.weight_variance = float(weight_variance)

    @check_shapes("F: [batch..., N, D_in]", "return: [batch..., N, D]")
    def features(self, F: tf.Tensor) -> tf.Tensor:
        """The feature map ``Phi = [phi(F), 1]``: ``[..., N, input_dim] -> [..., N, D]``."""
        F = tf.convert_to_tensor(F)
        if F.shape[-1] is not None and F.shape[-1] != self.input_dim:
            raise ValueError(
                f"WeightKernel expects inputs with {self.input_dim} columns, got shape {F.shape}"
            )
        Phi = self.activation(F)
        if self.bias:
            ones = tf.ones(tf.concat([tf.shape(F)[:-1], [1]], 0), dtype=Phi.dtype)
            Phi = tf.concat([Phi, ones], axis=-1)
        return Phi

    def _scale(self, dtype):
        return tf.constant(self.weight_variance, dtype)

    @check_shapes("X: [batch..., N, D_in]", "Z: [batch..., M, D_in]", "return: [batch..., N, M]")
    def batched_cross(self, X: tf.Tensor, Z: tf.Tensor) -> tf.Tensor:
        """Paired-batch covariance ``[..., N, M]`` (sample ``s`` of X against sample ``s`` of Z)."""
        PX, PZ = self.features(X), self.features(Z)
        return self._scale(PX.dtype) * tf.linalg.matmul(PX, PZ, transpose_b=True)

    def K(self, X, X2=None):
        """GPflow semantics: ``[..., N, D] x [..., M, D] -> [..., N, ..., M]`` (outer over batches)."""
        PX = self.features(X)
        PZ = PX if X2 is None else self.features(X2)
        if PX.shape.rank == 2 and PZ.shape.rank == 2:
            out = tf.linalg.matmul(PX, PZ, transpose_b=True)
        else:
            out = tf.tensordot(PX, PZ, [[-1], [-1]])
        return self._scale(PX.dtype) * out

    def K_diag(self, X):
        """Marginal variances ``[..., N]``."""
        PX = self.features(X)
        return self._scale(PX.dtype) * tf.reduce_sum(tf.square(PX), axis=-1)


class DenseLayer(GPLayer):
    """A fully-connected BNN layer as a deep-GP layer: width, activation and weight prior.

    ``F_out = [phi(F_in), 1] W`` with ``W`` ``[D, output_dim]``, ``D = input_dim + bias``. The
    layer is the prior only; the weights' approximate posterior lives in a posterior object from
    :mod:`deepgp_gi.posteriors.weights`.

    :param input_dim: ``N_{l-1}``.
    :param output_dim: ``N_l`` (the number of units).
    :param activation: ``phi`` applied to this layer's *inputs* (use ``"identity"`` for the first
        layer); a name in :data:`ACTIVATIONS` or a callable.
    :param prior: a :class:`~deepgp_gi.priors.WeightPrior` or one of ``"standard"``, ``"neal"``,
        ``"scale"``; default NealPrior.
    :param bias: append a column of ones to the features (``D = input_dim + 1``).
    :param inducing_features: ``[M, D]`` inducing *features* for the local-inducing posterior.
        They live in feature space (rows of ``Phi``, bias column included and learned), not in
        input space; ``None`` for the other families.
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
        kernel = WeightKernel(int(input_dim), activation, bias, weight_variance=prior.weight_variance(fan_in))
        super().__init__(kernel, int(output_dim), int(input_dim), mean_function=None, inducing_inputs=None, name=name)
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
            self.inducing_variable = gpflow.inducing_variables.InducingPoints(Z)

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
