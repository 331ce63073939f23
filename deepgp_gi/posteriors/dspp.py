"""Deep sigma point processes (Jankowiak, Pleiss & Gardner 2020).

A DSPP keeps DSVI's mean-field ``q(U)`` and the per-layer Gaussian marginals of a data row given
the layer below, ``N(mu_l(f), sigma_l^2(f))``, but replaces the sampled propagation by ``Q``
learned *sigma points*: hidden layer ``l``'s output on path ``j`` is

    f_l^(j) = mu_l(f_{l-1}^(j)) + sigma_l(f_{l-1}^(j)) * xi_l^(j),    xi_l^(j) in R^{D_l} (learned),

and the predictive distribution is the finite mixture
``p(y | x) = sum_j omega_j N(y; mu_L^(j), sigma_L^2(j) + noise)`` with learned weights
``omega = softmax(logits)``. The model is trained on the predictive objective
(``fit(..., objective="predictive")``): the log of that mixture density at each training point
minus the (weighted) KL of ``q(U)``.

In this library the ``Q`` paths are the propagation's sample axis: ``propagate`` returns
``[Q, N, D_l]`` samples whatever ``num_samples`` asks for, and
:meth:`DSPPPosterior.mixture_log_weights` gives the paths' log-weights, which the model's
predictions and objectives use instead of equal weights. With one sigma point at zero the hidden
layers are deterministic (their means): the deterministic-hidden-layer model.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import gpflow
import numpy as np
import tensorflow as tf

from ..noise import NoiseLike, NoiseSource, as_noise_source
from ..validation import check_positive_int
from .base import DeepPosterior, Propagation
from .mean_field import MeanFieldPosterior

__all__ = ["DSPPPosterior", "SigmaPointSource", "DEFAULT_SIGMA_POINTS"]

#: Q, the paper's number of learned sigma points (10).
DEFAULT_SIGMA_POINTS = 10


class SigmaPointSource(NoiseSource):
    """The draws of a DSPP's propagation: hidden layer ``l``'s data-row draw (name ``"f/l"``,
    shape ``[Q, N, D_l]``) is its sigma points ``[Q, D_l]`` broadcast over the rows; every other
    draw (the last layer's sample) comes from ``fallback``."""

    def __init__(self, points: Sequence[tf.Tensor], fallback: NoiseSource):
        self.points = list(points)
        self.fallback = fallback

    def normal(self, name, shape, dtype):
        if name.startswith("f/") and int(name[2:]) < len(self.points):
            point = tf.cast(self.points[int(name[2:])], dtype)  # [Q, D_l]
            return tf.broadcast_to(tf.expand_dims(point, 1), shape)
        return self.fallback.normal(name, shape, dtype)

    def gamma(self, name, shape, alpha, dtype):
        return self.fallback.gamma(name, shape, alpha, dtype)


class DSPPPosterior(MeanFieldPosterior):
    """A deep sigma point process (module docs): mean-field ``q(U)`` on GP layers with local
    inducing inputs, ``Q`` learned sigma points per hidden layer and learned mixture weights.

    Parameters: those of :class:`~deepgp_gi.posteriors.MeanFieldPosterior`; ``sigma_points[l]``
    ``[Q, D_l]`` for each hidden layer ``l``; ``sigma_logits`` ``[Q]`` (``omega =
    softmax(sigma_logits)``).

    :param layers: GP layers, each with ``inducing_inputs``.
    :param num_sigma_points: Q (default 10). With ``Q = 1`` the one sigma point starts at zero.
    :param whiten: as for mean-field.
    :param q_sqrt_scales: as for mean-field.
    :param seed: seeds the initial sigma points (``N(0, 1)`` draws for ``Q > 1``).
    """

    options = MeanFieldPosterior.options + ("num_sigma_points",)
    summary = "deep sigma point process (Jankowiak et al. 2020)"

    def __init__(
        self,
        layers,
        num_sigma_points: int = DEFAULT_SIGMA_POINTS,
        whiten: bool = False,
        q_sqrt_scales: Optional[Sequence[float]] = None,
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        super().__init__(layers, whiten=whiten, q_sqrt_scales=q_sqrt_scales, name=name)
        Q = check_positive_int(num_sigma_points, "num_sigma_points")
        self.num_sigma_points = Q
        dtype = gpflow.default_float()
        rng = np.random.default_rng(seed)
        points: List[gpflow.Parameter] = []
        for l, layer in enumerate(self.layers[:-1]):
            init = (
                np.zeros((Q, layer.output_dim))
                if Q == 1
                else rng.standard_normal((Q, layer.output_dim))
            )
            points.append(gpflow.Parameter(init.astype(dtype), name=f"sigma_points_{l}"))
        self.sigma_points = points
        self.sigma_logits = gpflow.Parameter(np.zeros(Q, dtype), name="sigma_logits")

    @classmethod
    def from_data(cls, layers, X, Y, *, num_inducing, seed, **options):
        """The mean-field family's initialisation (the inducing inputs are on the layers), with
        the sigma points drawn from ``seed``."""
        return cls(layers, seed=seed, **options)

    # a latent input would be propagated through sampled inducing outputs, not the sigma points
    inducing_draw = DeepPosterior.inducing_draw

    def mixture_log_weights(self) -> tf.Tensor:
        """``[Q]``: ``log omega``, the log-weights of the sigma-point paths."""
        return tf.nn.log_softmax(self.sigma_logits)

    def propagate(self, X, num_samples: int = 1, seed: NoiseLike = None) -> Propagation:
        """The ``Q`` sigma-point paths (``num_samples`` is not used: the paths are the samples);
        ``seed`` draws the last layer's sample only."""
        source = SigmaPointSource(self.sigma_points, as_noise_source(seed))
        return super().propagate(X, self.num_sigma_points, source)
