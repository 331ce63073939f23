"""A layer of a deep GP: the prior of that layer (a kernel, a mean function and a width).

:class:`GPLayer` holds no variational parameters; those belong to the posterior object
(:mod:`deepgp_gi.posteriors`). For the families with per-layer ("local") inducing inputs the
layer carries them as ``inducing_variable`` (a GPflow ``InducingPoints``), as GPflow's SVGP does.
"""

from __future__ import annotations

from typing import Optional

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

from ..kernels import batched_K, batched_K_diag, batched_K_sym, check_kernel_supported
from .base import Layer

__all__ = ["GPLayer"]


class GPLayer(Layer):
    """One layer of a deep GP: ``output_dim`` independent GPs sharing ``kernel`` and a mean
    function.

    :param kernel: a GPflow kernel on ``input_dim`` inputs (see :mod:`deepgp_gi.kernels` for the
        kernels with a sample-batched evaluation).
    :param output_dim: the width of the layer (number of GPs), ``N_l``.
    :param input_dim: the width of the layer's input, ``N_{l-1}``.
    :param mean_function: a GPflow mean function mapping ``[..., input_dim]`` to
        ``[..., output_dim]``; ``None`` means zero mean. It is applied to outputs only (the
        residual form of docs/algorithms.md, "Mean-field deep GPs (DSVI)").
    :param inducing_inputs: ``[M, input_dim]`` inducing inputs Z for the local families
        (mean-field, fully-coupled, STAR, local inducing); ``None`` for global inducing.
    """

    def __init__(
        self,
        kernel: gpflow.kernels.Kernel,
        output_dim: int,
        input_dim: int,
        mean_function: Optional[gpflow.mean_functions.MeanFunction] = None,
        inducing_inputs=None,
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        if not isinstance(kernel, gpflow.kernels.Kernel):
            raise TypeError(f"kernel must be a gpflow.kernels.Kernel, got {type(kernel).__name__}")
        check_kernel_supported(kernel)
        if int(output_dim) < 1:
            raise ValueError(f"output_dim must be at least 1, got {output_dim}")
        if int(input_dim) < 1:
            raise ValueError(f"input_dim must be at least 1, got {input_dim}")
        self.kernel = kernel
        self.output_dim = int(output_dim)
        self.input_dim = int(input_dim)
        self.mean_function = mean_function
        if inducing_inputs is not None:
            Z = np.asarray(inducing_inputs)
            if Z.ndim != 2 or Z.shape[1] != self.input_dim:
                raise ValueError(
                    f"inducing_inputs must have shape [M, {self.input_dim}], got {Z.shape}"
                )
            if not np.all(np.isfinite(Z)):
                raise ValueError("inducing_inputs contains NaN or inf")
            self.inducing_variable = gpflow.inducing_variables.InducingPoints(Z)
        else:
            self.inducing_variable = None

    @property
    def num_inducing(self) -> Optional[int]:
        """M for a layer with local inducing inputs, else None."""
        if self.inducing_variable is None:
            return None
        return int(self.inducing_variable.Z.shape[0])

    @property
    def Z(self) -> tf.Tensor:
        """The local inducing inputs ``[M, input_dim]``."""
        if self.inducing_variable is None:
            raise AttributeError("this layer has no local inducing inputs (global inducing family)")
        return self.inducing_variable.Z

    @check_shapes("F: [batch..., D_in]", "return: [batch..., D_out]")
    def mean(self, F: tf.Tensor) -> tf.Tensor:
        """The mean function applied to layer inputs; zeros of width ``output_dim`` if none."""
        if self.mean_function is None or isinstance(self.mean_function, gpflow.mean_functions.Zero):
            shape = tf.concat([tf.shape(F)[:-1], [self.output_dim]], axis=0)
            return tf.zeros(shape, dtype=F.dtype)
        return self.mean_function(F)

    def K(self, X, Z=None):
        """Covariance with the sample axis paired: ``K(X)`` is ``[S,N,N]``, ``K(X, Z)``
        ``[S,N,M]``."""
        if Z is None:
            return batched_K_sym(self.kernel, X)
        return batched_K(self.kernel, X, Z)

    def K_diag(self, X):
        """Marginal prior variances ``[S, N]``."""
        return batched_K_diag(self.kernel, X)
