"""Posteriors of convolutional BNNs (docs/algorithms.md, "Convolutional global inducing";
O&A 2021 §2.2, App. C, N, O).

A convolutional network is a stack of :mod:`deepgp_gi.layers` layers ending in a
:class:`~deepgp_gi.layers.DenseLayer`. Its weighted layers (convolutions and dense layers) each
get one of three weight posteriors, with the maths of the fully-connected families:

* ``"factorised"``: ``q(W) = prod N(mu, sigma^2)`` (:class:`~.weight_space.FactorisedWeights`,
  :func:`~.weight_space.factorised_kl`). Convolutions sample their filter explicitly (pixels of one
  image share it, so per-pixel local reparameterisation would be wrong); dense layers use the
  local reparameterisation when no inducing rows are propagated (it is exact per data row).
* ``"global"``: the pseudo-data posterior of the weights given the layer's input on the
  propagated inducing rows: the Bayesian linear regression of :mod:`.pseudo_data`, whose
  sufficient statistics ``G = X'^T Lambda X'`` and ``R = X'^T Lambda V`` a convolution builds by
  autocorrelation (:mod:`deepgp_gi.autocorrelation`, no patch matrix).
* ``"local"``: the same regression on the layer's own learned inducing inputs
  (``Conv2DLayer.inducing_images``, ``DenseLayer.inducing_features``).

Families (:data:`CONV_FAMILIES`): ``"factorised"``, ``"local"``, ``"global"`` (every layer of
that kind) and ``"factorised_global"`` (factorised layers below a global-inducing last layer;
the inducing images ``U_0`` are propagated through the factorised layers with the same sampled
weights as the data).

Pseudo-data (``posterior.pseudo_data[j]``, j over the weighted layers): a convolution's
``V_j`` is ``[M, H', W', C_out]`` (stored flattened as ``[M, H'*W'*C_out]``) with one precision
per inducing image (``"shared_diagonal"``, the paper's setting for images); a dense layer's is
``[M, N_out]`` with any :data:`~.pseudo_data.PRECISIONS` kind (default ``"shared_diagonal"``).

Noise names: ``"w/{j}"`` ``[S, D_j, N_j]`` for the weights of weighted layer ``j``, ``"f/{j}"``
for locally reparameterised dense pre-activations, and the prior's own draws (``"s/{j}"`` for a
Scale prior, ``"L/{j}/..."`` for a spatial inverse-Wishart prior).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Union

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import inherit_check_shapes

from ..initialisation import global_inducing_rows, local_inducing_images
from ..layers import apply_weights, check_network, is_convolution, run_layers, weighted_layers
from ..noise import NoiseLike, NoiseSource
from ..validation import (
    check_choice,
    check_finite_array,
    check_positive_float,
    per_layer_floats,
    per_layer_list,
)
from .base import DeepPosterior, Propagation
from .prior_scales import PriorPrecisions
from .pseudo_data import KL_MODES, PRECISIONS, PseudoData, draw_weights, gram_posterior, regulariser
from .weight_space import factorised_kl, factorised_weights, local_reparameterisation_moments

__all__ = [
    "ConvNetPosterior",
    "FactorisedConvPosterior",
    "LocalConvPosterior",
    "GlobalConvPosterior",
    "FactorisedGlobalConvPosterior",
    "CONV_FAMILIES",
    "LAYER_POSTERIORS",
]

#: Weight posteriors of one weighted layer.
LAYER_POSTERIORS = ("factorised", "local", "global")

#: Family name -> the posterior of every weighted layer (``None``: factorised below, global last).
CONV_FAMILIES = {
    "factorised": "factorised",
    "local": "local",
    "global": "global",
    "factorised_global": None,
}


class _RunState:
    """What the forward pass accumulates: the regulariser and the weighted layers' outputs."""

    def __init__(self, S: int, dtype: tf.DType):
        self.kl = tf.zeros([S], dtype)
        self.samples: List[tf.Tensor] = []
        self.index = 0
        self.mean = None
        self.var = None


class ConvNetPosterior(DeepPosterior, PriorPrecisions):
    """The weight posterior of a convolutional BNN (see the module docs).

    :param layers: the network: conv layers, deterministic layers, residual blocks, and a
        DenseLayer last.
    :param family: a name in :data:`CONV_FAMILIES`.
    :param inducing_inputs: ``U_0`` ``[M, H, W, C]`` inducing images (global, factorised_global).
    :param pseudo_outputs: per weighted layer the initial ``V_j`` (``[M, H', W', C_out]`` for a
        convolution, ``[M, N_out]`` for a dense layer) or None (``N(0, 1)``); only the
        inducing layers' entries are used.
    :param log_precision_init: a number or one per weighted layer (default -4, and 0 for the last
        layer, O&A App. O).
    :param dense_precision: the ``Lambda`` kind of inducing dense layers (default
        ``"shared_diagonal"``; convolutions always have one precision per inducing image).
    :param kl: ``"sampled"`` (the per-sample log-ratio) or ``"analytic"`` (the conditional KL
        given the inducing inputs) for the inducing layers.
    :param means: initial factorised means per weighted layer (see
        :class:`~.factorised.FactorisedWeightPosterior`).
    :param variances: their initial variances.
    :param rho: the optimiser sees ``log Lambda / rho`` (3).
    :param seed: seed of the default random initial values.
    """

    def __init__(
        self,
        layers: Sequence,
        family: str = "global",
        inducing_inputs=None,
        *,
        pseudo_outputs: Optional[Sequence] = None,
        log_precision_init: Union[None, float, Sequence] = None,
        dense_precision: str = "shared_diagonal",
        kl: str = "sampled",
        means: Optional[Sequence] = None,
        variances: Optional[Sequence] = None,
        rho: float = 3.0,
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        DeepPosterior.__init__(self, layers, name=name)
        check_choice(family, "family", tuple(CONV_FAMILIES))
        self.family = family
        self.kl_mode = check_choice(kl, "kl", KL_MODES)
        self.rho = check_positive_float(rho, "rho")
        check_choice(dense_precision, "dense_precision", PRECISIONS)
        self.propagates_inducing = family in ("global", "factorised_global")
        weighted = check_network(self.layers, family, inducing_rows=self.propagates_inducing)
        J = len(weighted)
        kind = CONV_FAMILIES[family]
        self.kinds = [kind] * J if kind else ["factorised"] * (J - 1) + ["global"]
        rng = np.random.default_rng(seed)

        if self.propagates_inducing:
            if inducing_inputs is None:
                raise ValueError(f"family {family!r} needs inducing_inputs [M, H, W, C] (U_0)")
            shape = tuple(self.layers[0].input_shape)
            U0 = check_finite_array(inducing_inputs, "inducing_inputs", ndim=1 + len(shape))
            if tuple(U0.shape[1:]) != shape or U0.shape[0] < 1:
                raise ValueError(
                    f"inducing_inputs must have shape [M, {', '.join(map(str, shape))}], "
                    f"got {list(U0.shape)}"
                )
            self.inducing_inputs = gpflow.Parameter(
                U0.astype(gpflow.default_float()), name="inducing_inputs"
            )
        else:
            if inducing_inputs is not None:
                raise ValueError(
                    f"family {family!r} has no global inducing inputs; leave inducing_inputs None"
                )
            self.inducing_inputs = None
        for j, (layer, k) in enumerate(zip(weighted, self.kinds)):
            has_local = (
                getattr(layer, "inducing_images", None) is not None
                or getattr(layer, "inducing_features", None) is not None
            )
            if k == "local" and not has_local:
                raise ValueError(
                    f"weighted layer {j} ({layer.name}) has no inducing inputs; the local family "
                    "needs Conv2DLayer(inducing_images=...) / DenseLayer(inducing_features=...)"
                )
            if k != "local" and has_local:
                raise ValueError(
                    f"weighted layer {j} ({layer.name}) has local inducing inputs, which the "
                    f"{family!r} family does not use"
                )

        # Factorised weights (the defaults of the dense factorised family).
        self.weights = [None] * J
        fac = [j for j, k in enumerate(self.kinds) if k == "factorised"]
        means = per_layer_list(means, "means", J)
        variances = per_layer_list(variances, "variances", J)
        built = factorised_weights(
            [weighted[j] for j in fac], [means[j] for j in fac], [variances[j] for j in fac], rng
        )
        for j, q in zip(fac, built):
            self.weights[j] = q

        # Pseudo-data of the inducing layers.
        V_init = per_layer_list(pseudo_outputs, "pseudo_outputs", J)
        log_prec = per_layer_floats(
            log_precision_init, "log_precision_init", J, [-4.0] * (J - 1) + [0.0]
        )
        self.pseudo_data = [None] * J
        for j, (layer, k) in enumerate(zip(weighted, self.kinds)):
            if k == "factorised":
                continue
            M = self.num_inducing if k == "global" else layer.num_inducing
            out_shape = tuple(getattr(layer, "output_shape", (layer.output_dim,)))
            V = rng.standard_normal((M,) + out_shape) if V_init[j] is None else V_init[j]
            V = check_finite_array(V, f"pseudo_outputs[{j}]", shape=(M,) + out_shape)
            precision = "shared_diagonal" if is_convolution(layer) else dense_precision
            self.pseudo_data[j] = PseudoData(
                V.reshape(M, -1), precision, log_prec[j], self.rho, name=f"pseudo_data_{j}"
            )
        self._init_prior_precisions(
            weighted, seed=None if seed is None else int(rng.integers(2**31 - 1))
        )

    # -------------------------------------------------------------- structure
    @property
    def num_inducing(self) -> int:
        """M, the number of global inducing images (0 if none are propagated)."""
        return 0 if self.inducing_inputs is None else int(self.inducing_inputs.shape[0])

    # -------------------------------------------------------------- forward pass
    @inherit_check_shapes
    def propagate(self, X, num_samples: int = 1, seed: NoiseLike = None) -> Propagation:
        S = int(num_samples)
        top = self.inducing_inputs if self.propagates_inducing else None
        source, H = self._start(X, S, seed, top_rows=top)  # [S, M + N, H, W, C]
        state = _RunState(S, H.dtype)
        H = self._run(self.layers, H, S, source, state)
        M = self.num_inducing
        if state.var is None:  # the last layer sampled its weights: a point mass per sample
            mean = H[:, M:]
            return Propagation(
                samples=state.samples, mean=mean, var=tf.zeros_like(mean), kl=state.kl
            )
        state.samples.append(self.sample_last_layer(state.mean, state.var, source))
        return Propagation(samples=state.samples, mean=state.mean, var=state.var, kl=state.kl)

    @property
    def _num_noise_layers(self) -> int:
        """Noise names count the weighted layers."""
        return len(self._weighted)

    def _run(self, layers, H, S: int, source: NoiseSource, state: _RunState):
        M = self.num_inducing

        def step(layer, H):
            H = self._weighted_step(state.index, layer, H, S, source, state)
            state.index += 1
            if state.var is None:
                state.samples.append(H[:, M:])
            return H

        return run_layers(layers, H, step, M)

    def _weighted_step(self, j: int, layer, H, S: int, source: NoiseSource, state: _RunState):
        dtype = H.dtype
        M = self.num_inducing
        last = j == len(self._weighted) - 1
        p, prior_log_ratio = self.prior_precision(j, S, source, dtype)
        state.kl = state.kl - prior_log_ratio
        Phi = layer.features(H)
        kind = self.kinds[j]
        if kind == "factorised":
            q = self.weights[j]
            mean, var = q.moments()
            state.kl = state.kl + factorised_kl(mean, var, p)
            if not is_convolution(layer) and not self.propagates_inducing:
                fmean, fvar = local_reparameterisation_moments(Phi, mean, var)
                if last:
                    state.mean, state.var = fmean, fvar
                    return fmean
                return fmean + tf.sqrt(fvar) * source.normal(f"f/{j}", tf.shape(fmean), dtype)
            W = q.sample(source.normal(f"w/{j}", [S, layer.fan_in, layer.output_dim], dtype))
            return apply_weights(layer, Phi, W)
        # Inducing layers: the regression on the inducing rows (propagated or the layer's own).
        if kind == "global":
            U = Phi[:, :M]
        else:
            own = layer.inducing_images if is_convolution(layer) else layer.inducing_features
            U = tf.broadcast_to(tf.convert_to_tensor(own)[None], tf.concat([[S], tf.shape(own)], 0))
        pseudo = self.pseudo_data[j]
        if is_convolution(layer):
            lam = pseudo.diagonal()[0]  # [M]
            V = tf.reshape(
                tf.convert_to_tensor(pseudo.pseudo_outputs), (-1,) + tuple(layer.output_shape)
            )
            L, w_mean = gram_posterior(layer.gram(U, lam), layer.cross(U, V, lam), p)
        else:
            if len(p.shape) != 1:
                raise ValueError("a dense layer's prior precision must be a scalar per sample")
            L, w_mean = pseudo.posterior(U, p)
        z = source.normal(f"w/{j}", [S, layer.fan_in, layer.output_dim], dtype)
        W, lr, kl = draw_weights(L, w_mean, z, p, analytic=self.kl_mode == "analytic")
        state.kl = state.kl + regulariser(lr, kl)
        return apply_weights(layer, Phi, W)


class _ConvFamily(ConvNetPosterior):
    """A :class:`ConvNetPosterior` of one fixed family (``network_family``), built from data
    as O&A (App. O) initialise it."""

    network_family = "global"
    options = ("log_precision_init", "dense_precision", "kl", "rho")

    @classmethod
    def from_data(cls, layers, X, Y, *, num_inducing, seed, **options):
        """Global rows by :func:`~deepgp_gi.initialisation.global_inducing_rows` (their
        pseudo-outputs the one-hot labels ``Y``) for the families that propagate inducing
        images; ``N(0, 1)`` local inducing images and features on the layers for ``"local"``
        (:func:`~deepgp_gi.initialisation.local_inducing_images`)."""
        rng = np.random.default_rng(seed)
        U0 = pseudo = None
        if cls.propagates_inducing_rows:
            U0, V_top = global_inducing_rows(np.asarray(X), np.asarray(Y), num_inducing, rng)
            pseudo = [None] * (len(weighted_layers(layers)) - 1) + [V_top]
        cls.place_layer_inducing(layers, rng)
        return cls(
            layers,
            cls.network_family,
            U0,
            pseudo_outputs=pseudo,
            seed=int(rng.integers(2**31 - 1)),
            **options,
        )

    @classmethod
    def place_layer_inducing(cls, layers, rng: np.random.Generator) -> None:
        """Put the family's local inducing inputs on the layers (none by default)."""


class FactorisedConvPosterior(_ConvFamily):
    """Factorised Gaussian weights in every layer of a convolutional network."""

    network_family = "factorised"
    summary = "factorised Gaussian weights in every layer"


class LocalConvPosterior(_ConvFamily):
    """Local inducing images and features in every layer of a convolutional network."""

    network_family = "local"
    summary = "local inducing images and features in every layer"

    @classmethod
    def place_layer_inducing(cls, layers, rng):
        """``N(0, 1)`` inducing images on every convolution and features on every dense layer."""
        local_inducing_images(layers, rng)


class GlobalConvPosterior(_ConvFamily):
    """Global inducing images, propagated through every layer of a convolutional network."""

    network_family = "global"
    summary = "global inducing images, propagated through every layer (gi)"
    propagates_inducing_rows = True


class FactorisedGlobalConvPosterior(_ConvFamily):
    """Factorised lower layers and a global-inducing last layer of a convolutional network."""

    network_family = "factorised_global"
    summary = "factorised lower layers, global-inducing last layer (fac->gi)"
    propagates_inducing_rows = True
