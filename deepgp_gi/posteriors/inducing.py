"""Global-inducing and local-inducing posteriors (Ober & Aitchison 2021); docs/algorithms.md,
"Global inducing points" and "BNNs as deep GPs".

Both families write the inducing posterior of layer ``l`` as pseudo-data (:mod:`.pseudo_data`):

    Q(U_l | inputs) = prod_lambda N(u_lambda | Sigma_l Lambda_l v_lambda, Sigma_l),
    Sigma_l = (K^{-1} + Lambda_l)^{-1},

the GP posterior after observing pseudo-outputs ``V_l`` ``[M, N_l]`` with noise precision
``Lambda_l`` at the layer's inducing inputs. In the **global** family the inducing inputs of layer
1 are learned (``U_0`` ``[M, D]``) and those of every later layer are the sampled inducing outputs
of the layer below, propagated with the data rows (``H_l = [U_l; F_l]``, ``[S, M + N, N_l]``);
every Monte Carlo sample draws its own chain ``U_1 .. U_L``. In the **local** family each layer
has its own learned inducing inputs and only the data rows are propagated.

Each layer takes one of two paths, with the same pseudo-data parameters and the same Bayesian
linear regression:

* **function space** (any kernel): whitened inducing outputs ``a`` with ``U - m(U_prev) = L_K a``
  are the regression weights on the features ``L_K = chol(K_uu)`` under ``N(0, I)``; the data rows
  get the GP conditional given ``U`` (noise names ``"u/{l}"`` ``[S, M, N_l]`` and ``"f/{l}"``
  ``[S, N, N_l]``).
* **weight space** (a layer with a finite feature map, i.e. a
  BNN :class:`~deepgp_gi.layers.DenseLayer`): the layer's weights ``W`` ``[D_l, N_l]`` are the
  regression weights on the features ``Phi(U_prev)`` under the weight prior, and every row, inducing
  or data, is ``Phi W`` (noise ``"w/{l}"`` ``[S, D_l, N_l]``, and ``"s/{l}"`` for a random-scale
  prior). This is the same distribution over the inducing outputs as function space with the
  weight-induced kernel, the exact BNN joint over the data rows, and costs ``O(D_l^3)`` instead of
  ``O(M^3)``.

``space="auto"`` (default) takes weight space exactly for the layers with a finite feature map;
``"function"`` forces function space (for a BNN layer this treats the network as the deep GP
with its weight-induced kernel; a random-scale prior cannot be expressed that way).

Options, the same for both families and both paths: ``precision`` (``"full"``, ``"diagonal"``,
``"shared_diagonal"``; default ``"full"`` in function space and ``"diagonal"`` — per unit — in
weight space, the papers' settings), ``kl`` (``"sampled"``: the per-sample log-ratio;
``"analytic"``: the conditional KL given the layer's inducing inputs), ``rho`` (the optimiser sees
``log Lambda / rho``), ``log_precision_init``, ``pseudo_outputs``, ``residual_mean``, ``seed``.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Union

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import inherit_check_shapes

from ..initialisation import LOG_PRECISION_HIDDEN, LOG_PRECISION_OUTPUT, global_inducing_rows
from ..linalg import add_jitter, cholesky_and_solve
from ..noise import NoiseLike, NoiseSource
from ..validation import (
    check_bool,
    check_choice,
    check_finite_array,
    check_float,
    check_positive_float,
    check_positive_int,
    per_layer_floats,
    per_layer_list,
)
from .base import DeepPosterior, Propagation
from .conditionals import (
    conditional_mean,
    inducing_cholesky,
    inducing_factors,
    layer_mean,
    residual_variance,
    sample_rows,
    whitened_projection,
)
from .draws import InducingDraw, pseudo_data_draw
from .prior_scales import PriorPrecisions
from .pseudo_data import (
    KL_MODES,
    LAST_LAYER_MODES,
    PRECISIONS,
    PseudoData,
    StackedPosterior,
    analytic_kl,
    draw_weights,
    log_ratio,
    marginal_variance,
    regulariser,
    stacked_analytic_kl,
    stacked_factors,
    stacked_posterior,
)
from .weight_space import WeightSpaceStep, has_feature_map, weight_space_layer

__all__ = [
    "GlobalInducingPosterior",
    "LocalInducingPosterior",
    "GlobalInducingBNNPosterior",
    "LocalInducingBNNPosterior",
    "GlobalInducingPropagation",
    "SPACES",
    "DEFAULT_NUM_INDUCING",
]

SPACES = ("auto", "function", "weight")
DEFAULT_NUM_INDUCING = 100  # O&A App. O, UCI deep GPs


class _InducingPosterior(DeepPosterior, PriorPrecisions):
    """What the global and local families share: per-layer paths, pseudo-data, options."""

    _default_log_precision: Sequence[float] = ()

    def _init_common(self, precision, kl, residual_mean, rho, space, seed=None):
        self.kl_mode = check_choice(kl, "kl", KL_MODES)
        self.residual_mean = check_bool(residual_mean, "residual_mean")
        space = check_choice(space, "space", SPACES)
        if precision is not None:
            check_choice(precision, "precision", PRECISIONS)
        self.weight_space = []
        for i, layer in enumerate(self.layers):
            weights = has_feature_map(layer) and space != "function"
            if space == "weight" and not has_feature_map(layer):
                raise ValueError(
                    f"space='weight' needs a finite feature map, but layers[{i}] is a "
                    f"{type(layer).__name__}"
                )
            if not weights and getattr(getattr(layer, "prior", None), "is_random", False):
                raise ValueError(
                    f"layers[{i}] has a random-scale prior, which only the weight-space path "
                    "can express; use space='auto'"
                )
            self.weight_space.append(weights)
        self.precision = [precision or ("diagonal" if w else "full") for w in self.weight_space]
        self.rho = rho
        self._init_prior_precisions(self.layers, seed)

    def _init_pseudo_data(self, V_init, log_precision_init):
        self.pseudo_data = [
            PseudoData(V, kind, lp, self.rho, name=f"pseudo_data_{l}")
            for l, (V, kind, lp) in enumerate(zip(V_init, self.precision, log_precision_init))
        ]

    def _full_factors(self) -> List[Optional[tf.Tensor]]:
        """Per layer, the factor ``R`` of a function-space layer with ``precision="full"``, from one
        :func:`stacked_factors` over the layers that share their ``M`` (the normalisation and its
        gradient once per stack, not per layer); None for the other layers (and for a lone one,
        which :meth:`PseudoData.posterior` factors itself)."""
        groups = {}
        for l, pd in enumerate(self.pseudo_data):
            if not self.weight_space[l] and pd.kind == "full":
                groups.setdefault(pd.num_inducing, []).append(l)
        factors: List[Optional[tf.Tensor]] = [None] * self.depth
        for members in groups.values():
            if len(members) > 1:
                stack = stacked_factors([self.pseudo_data[l] for l in members])
                for l, R in zip(members, tf.unstack(stack, num=len(members))):
                    factors[l] = R
        return factors

    def _weight_step(
        self, l: int, Phi, num_inducing: int, S: int, source: NoiseSource, marginal: bool = False
    ) -> WeightSpaceStep:
        """Weight-space layer ``l`` with the layer's prior precision (:func:`weight_space_layer`),
        the random scale's ``log p(s) - log q(s)`` included in the log-ratio and the KL."""
        layer = self.layers[l]
        dtype = Phi.dtype
        p, scale_log_ratio = self.prior_precision(l, S, source, dtype)
        z = source.normal(f"w/{l}", [S, layer.fan_in, layer.output_dim], dtype)
        step = weight_space_layer(
            self.pseudo_data[l], Phi, num_inducing, p, z, self.kl_mode, marginal
        )
        return step._replace(
            log_ratio=step.log_ratio + scale_log_ratio,
            kl=None if step.kl is None else step.kl - scale_log_ratio,
        )


# ============================================================================ global inducing


class GlobalInducingPropagation(NamedTuple):
    """A :class:`Propagation` plus the global-inducing internals (for tests and diagnostics).

    :ivar samples: ``[S, N, N_l]`` data-row samples per layer (last: sampled from mean/var).
    :ivar mean: ``[S, N, P]`` last-layer mean of the data rows: given the sampled ``U_L``
        (``last_layer="sampled"``), or with ``U_L`` integrated out given ``U_{L-1}``
        (``last_layer="marginal"``).
    :ivar var: ``[S, N, P]`` the matching variance (clamped at 0; 0 in weight space).
    :ivar kl: ``[S]`` the regulariser: ``log q - log p`` summed over layers (sampled), or the sum
        of the analytic conditional KLs; with ``last_layer="marginal"`` the last layer always
        contributes its analytic conditional KL.
    :ivar inducing: ``[S, M, N_l]`` sampled inducing rows ``U_1 .. U_L`` (``inducing[l]`` is
        the output of layer ``l``).
    :ivar log_ratio: ``[L, S]`` per-layer ``log P(U_l|U_{l-1}) - log Q(U_l|U_{l-1})``.
    :ivar conditional_kl: ``[L, S]`` per-layer analytic conditional KL (``kl="analytic"``; else
        None).
    """

    samples: List[tf.Tensor]
    mean: tf.Tensor
    var: tf.Tensor
    kl: tf.Tensor
    inducing: List[tf.Tensor]
    log_ratio: tf.Tensor
    conditional_kl: Optional[tf.Tensor]

    def as_propagation(self) -> Propagation:
        return Propagation(samples=self.samples, mean=self.mean, var=self.var, kl=self.kl)


class GlobalInducingPosterior(_InducingPosterior):
    """Global-inducing posterior (O&A §2.4, Alg. 1 and 2) for deep GPs and BNNs alike.

    Parameters: ``inducing_inputs`` U_0 ``[M, D]``; per layer ``pseudo_data[l]`` (a
    :class:`~deepgp_gi.posteriors.pseudo_data.PseudoData`: ``V_l`` ``[M, N_l]`` and ``Lambda_l``);
    ``scale_posteriors[l]`` ``q(s)`` for layers with a random-scale weight prior.

    :param layers: layers **without** local inducing inputs: GP layers
        (``inducing_variable is None``) or DenseLayers (``inducing_features is None``).
    :param num_inducing: M. Optional if ``inducing_inputs`` is given (must then agree);
        default 100 (O&A's UCI setting).
    :param inducing_inputs: initial U_0 ``[M, D]``; default ``N(0, 1)`` draws.
    :param pseudo_outputs: a sequence of L initial ``V_l`` ``[M, N_l]`` (entries may be None);
        default ``N(0, 1)`` for hidden layers and zeros for the last.
    :param log_precision_init: a number or L entries (numbers, or arrays of the diagonal
        precision's shape), ``log Lambda_l`` at initialisation; default -4 for hidden layers and 0
        for the last (O&A App. O).
    :param precision: ``"full"``, ``"diagonal"`` or ``"shared_diagonal"``; default ``None``:
        full in function space, diagonal (per unit) in weight space.
    :param kl: ``"sampled"`` (default: the per-sample log-ratio, as in the paper) or
        ``"analytic"`` (the conditional KL given ``U_{l-1}``, per sample).
    :param last_layer: ``"marginal"`` or ``"sampled"``. ``"sampled"`` is O&A's Alg. 1. Each Monte
        Carlo sample draws the last layer's inducing outputs ``U_L``, conditions the data rows on
        them and adds their log-ratio. ``"marginal"`` integrates ``U_L`` out of both ELBO terms
        given the sample of the layers below. The data rows get the Gaussian marginal (mean
        ``m(F) + A^T a_mean``, variance ``k_ff - |A|^2 + |L_B^{-1} A|^2``) and the last layer's
        regulariser is its analytic conditional KL. The estimator is then the expectation of the
        sampled one over ``U_L`` (Rao-Blackwellised): the same ELBO, with less noise in the
        training gradient. ``samples[-1]`` is still drawn through a sampled ``U_L``, so that
        sampled functions stay coherent across inputs. In weight space (a BNN's last
        DenseLayer) ``"marginal"`` integrates the last layer's weights out the same way (mean
        ``Phi E[W]``, variance ``diag(Phi Prec^{-1} Phi^T)``, analytic KL: the local
        reparameterisation of the output layer). Default ``"marginal"``; see
        ``docs/global_inducing.md``.
    :param residual_mean: if True (default) the layer's mean function is applied to inducing and
        data rows alike (prior ``N(m_l(U_{l-1}), K)``); if False the mean functions are ignored.
    :param rho: the Adam re-scaling of the log-precisions (default 3).
    :param space: ``"auto"`` (default), ``"function"`` or ``"weight"`` (see the module docs).
    :param seed: seed of the NumPy generator for the default random initial values.
    """

    options = (
        "precision",
        "kl",
        "last_layer",
        "residual_mean",
        "rho",
        "space",
        "log_precision_hidden",
        "log_precision_output",
    )
    summary = "global inducing points (Ober & Aitchison 2021)"
    positive_transform = "exp"
    propagates_inducing_rows = True

    @classmethod
    def from_data(
        cls,
        layers,
        X,
        Y,
        *,
        num_inducing,
        seed,
        log_precision_hidden: float = LOG_PRECISION_HIDDEN,
        log_precision_output: float = LOG_PRECISION_OUTPUT,
        **options,
    ):
        """O&A's initialisation (App. O): ``U_0`` and the last pseudo-outputs from
        :func:`~deepgp_gi.initialisation.global_inducing_rows`, hidden pseudo-outputs ``N(0, 1)``,
        log-precisions ``log_precision_hidden`` on hidden layers and ``log_precision_output`` on
        the last. ``Y`` ``[N, P]`` with ``P = layers[-1].output_dim``."""
        layers = list(layers)
        if not layers:
            raise ValueError("layers must contain at least one layer (depth >= 1)")
        Xa = check_finite_array(X, "X", ndim=2)
        Ya = check_finite_array(Y, "Y", ndim=2)
        if Xa.shape[1] != layers[0].input_dim:
            raise ValueError(f"X must have shape [N, {layers[0].input_dim}], got {list(Xa.shape)}")
        P = layers[-1].output_dim
        if Ya.shape[1] != P or Ya.shape[0] != Xa.shape[0]:
            raise ValueError(
                f"Y must have shape [{Xa.shape[0]}, {P}] (one column per output of the last layer) "
                f"to initialise the last pseudo-outputs, got {list(Ya.shape)}"
            )
        M = check_positive_int(num_inducing, "num_inducing")
        lp_hidden = check_float(log_precision_hidden, "log_precision_hidden")
        lp_out = check_float(log_precision_output, "log_precision_output")
        rng = np.random.default_rng(seed)
        U0, V_top = global_inducing_rows(Xa, Ya, M, rng)
        V = [rng.standard_normal((M, layer.output_dim)) for layer in layers[:-1]] + [V_top]
        return cls(
            layers,
            M,
            inducing_inputs=U0,
            pseudo_outputs=V,
            log_precision_init=[lp_hidden] * (len(layers) - 1) + [lp_out],
            **options,
        )

    def inducing_draw(self, num_samples: int, source: NoiseSource, dtype: tf.DType) -> InducingDraw:
        """The chain ``U_0 -> U_1 -> ...`` per sample, each hidden layer's whitened outputs drawn,
        the last layer's per ``last_layer``."""
        return pseudo_data_draw(self, num_samples, source, dtype, is_global=True)

    def __init__(
        self,
        layers: Sequence,
        num_inducing: Optional[int] = None,
        *,
        inducing_inputs=None,
        pseudo_outputs: Optional[Sequence] = None,
        log_precision_init: Union[None, float, Sequence] = None,
        precision: Optional[str] = None,
        kl: str = "sampled",
        last_layer: str = "marginal",
        residual_mean: bool = True,
        rho: float = 3.0,
        space: str = "auto",
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        DeepPosterior.__init__(self, layers, name=name)
        for i, layer in enumerate(self.layers):
            if (
                getattr(layer, "inducing_variable", None) is not None
                or getattr(layer, "inducing_features", None) is not None
            ):
                raise ValueError(
                    f"layers[{i}] has local inducing_inputs; the global-inducing posterior "
                    "propagates its inducing inputs from U_0 and needs layers built without them "
                    "(use LocalInducingPosterior for per-layer inducing inputs)"
                )
        self._init_common(
            precision, kl, residual_mean, check_positive_float(rho, "rho"), space, seed
        )
        self.last_layer = check_choice(last_layer, "last_layer", LAST_LAYER_MODES)
        L = self.depth
        D = self.layers[0].input_dim
        rng = np.random.default_rng(seed)
        if num_inducing is not None:
            num_inducing = check_positive_int(num_inducing, "num_inducing")
        if inducing_inputs is not None:
            U0 = check_finite_array(inducing_inputs, "inducing_inputs", ndim=2)
            if U0.shape[1] != D:
                raise ValueError(f"inducing_inputs must have shape [M, {D}], got {list(U0.shape)}")
            if num_inducing is not None and U0.shape[0] != num_inducing:
                raise ValueError(
                    f"inducing_inputs has {U0.shape[0]} rows but num_inducing is {num_inducing}"
                )
            if U0.shape[0] < 1:
                raise ValueError("inducing_inputs must have at least one row (num_inducing >= 1)")
        else:
            U0 = rng.standard_normal(
                (DEFAULT_NUM_INDUCING if num_inducing is None else num_inducing, D)
            )
        M = U0.shape[0]
        self.inducing_inputs = gpflow.Parameter(
            U0.astype(gpflow.default_float()), name="inducing_inputs"
        )
        V_init = _initial_pseudo_outputs(pseudo_outputs, [M] * L, self.layers, rng, zero_last=True)
        log_prec = per_layer_floats(
            log_precision_init, "log_precision_init", L, [-4.0] * (L - 1) + [0.0]
        )
        self._init_pseudo_data(V_init, log_prec)

    @property
    def num_inducing(self) -> int:
        return int(self.inducing_inputs.shape[0])

    def propagate_full(
        self, X, num_samples: int = 1, seed: NoiseLike = None
    ) -> GlobalInducingPropagation:
        """Like :meth:`propagate`, also returning the sampled inducing rows and per-layer terms."""
        S, M = num_samples, self.num_inducing
        source, F = self._start(X, S, seed)  # [S, N, D]
        dtype = F.dtype
        inducing_inputs = tf.cast(tf.convert_to_tensor(self.inducing_inputs), dtype)
        U = tf.broadcast_to(
            tf.expand_dims(inducing_inputs, 0), tf.concat([[S], tf.shape(inducing_inputs)], 0)
        )  # [S, M, D]
        # the rows [U; F] as one tensor only where a weight-space layer needs them (a GP layer uses
        # U and F apart, and the concatenation, its slices and their gradients would be extra ops)
        H = None
        jitter = gpflow.config.default_jitter()
        samples, inducing, log_ratios, kls = [], [], [], []
        mean = var = None
        factors = self._full_factors()
        for l, layer in enumerate(self.layers):
            last = l == self.depth - 1
            if self.weight_space[l]:
                marginal = last and self.last_layer == "marginal"
                H = tf.concat([U, F], axis=1) if H is None else H  # [S, M + N, D]
                H, lr, kl, rows_mean, rows_var = self._weight_step(
                    l, layer.features(H), M, S, source, marginal
                )
                U, F = H[:, :M], H[:, M:]
                sample = F
                mean, var = (rows_mean, rows_var) if marginal else (F, tf.zeros_like(F))
            else:
                H = None
                # L_K [S, M, M] and A = L_K^{-1} K(U, F) from one triangular solve of [I | K(U, F)];
                # with L_K^{-1}, their gradient solves nothing
                L_K, A = cholesky_and_solve(
                    add_jitter(layer.K(U), jitter),
                    layer.K(U, F),
                    name=f"K_uu (global inducing) of layer {layer.name}",
                )
                eps = source.normal(f"u/{l}", [S, M, layer.output_dim], dtype)
                # the mean only where the analytic KL or the marginal last layer reads it; the draw
                # is the same either way (it shares the mean's first product)
                analytic = self.kl_mode == "analytic"
                L_B, a_mean, a, T_B = self.pseudo_data[l].draw(
                    L_K,
                    eps,
                    with_mean=analytic or (last and self.last_layer == "marginal"),
                    factor=factors[l],
                )
                lr, kl = (
                    log_ratio(L_B, a, eps),
                    analytic_kl(L_B, a_mean, inverse=T_B) if analytic else None,
                )
                prior_mean = layer_mean(layer, F, self.residual_mean)
                mean = conditional_mean(A, a, prior_mean)
                var = tf.expand_dims(residual_variance(layer, F, A), -1)
                U = layer_mean(layer, U, self.residual_mean) + tf.linalg.matmul(L_K, a)
                if not last:
                    F = sample_rows(
                        mean, var, source.normal(f"f/{l}", tf.shape(mean), dtype), jitter
                    )
                elif self.last_layer == "marginal":
                    # a coherent draw through the sampled U_L; the ELBO sees U_L integrated out
                    sample = self.sample_last_layer(mean, tf.maximum(var, 0.0), source)
                    mean = conditional_mean(A, a_mean, prior_mean)
                    var = var + marginal_variance(L_B, A, layer.output_dim, inverse=T_B)
                    if kl is None:
                        kl = analytic_kl(L_B, a_mean, inverse=T_B)
            inducing.append(U)
            log_ratios.append(lr)
            kls.append(kl)
            if not last:
                samples.append(F)
        if self.weight_space[-1]:
            samples.append(sample)
        else:
            var = tf.broadcast_to(tf.maximum(var, 0.0), tf.shape(mean))
            samples.append(
                sample
                if self.last_layer == "marginal"
                else self.sample_last_layer(mean, var, source)
            )
        log_ratio_all = tf.stack(log_ratios)  # [L, S]
        if self.kl_mode == "analytic":
            conditional_kl = tf.stack(kls)
            total = tf.reduce_sum(conditional_kl, axis=0)
        else:
            conditional_kl = None
            total = tf.add_n([regulariser(lr, kl) for lr, kl in zip(log_ratios, kls)])
        return GlobalInducingPropagation(
            samples, mean, var, total, inducing, log_ratio_all, conditional_kl
        )

    @inherit_check_shapes
    def propagate(self, X, num_samples: int = 1, seed: NoiseLike = None) -> Propagation:
        """Push ``X`` ``[N, D]`` and the inducing rows through every layer; see the module docs.

        Returns ``samples`` (data rows only, ``[S, N, N_l]`` per layer), the last layer's
        ``mean``/``var`` ``[S, N, P]`` and ``kl`` ``[S]`` (``log q - log p`` summed over layers,
        or the analytic conditional KLs with ``kl="analytic"``).
        """
        return self.propagate_full(X, num_samples, seed).as_propagation()


# ============================================================================= local inducing


class LocalInducingPosterior(_InducingPosterior):
    """Local-inducing posterior: the global-inducing Q family with per-layer inducing inputs.

    ``q(U_l) = prod_lambda N(u_lambda | Sigma_l Lambda_l v_lambda, Sigma_l)``, independent across
    layers. A GP layer's inducing inputs are its ``inducing_variable`` (function space); a
    DenseLayer's are its ``inducing_features`` (weight space: ``Q(w_lambda) = N(Sigma_lambda Z^T
    Lambda_lambda v_lambda, Sigma_lambda)``, ``Sigma_lambda = (P_l + Z^T Lambda_lambda Z)^{-1}``).
    Only the data rows are propagated.

    :param layers: GP layers with ``inducing_inputs`` or DenseLayers with ``inducing_features``.
    :param pseudo_outputs: a sequence of L initial ``V_l`` ``[M_l, N_l]`` (entries may be None);
        default ``N(0, 1)`` draws (O&A App. O).
    :param log_precision_init: a number or L entries; default 0 for GP layers and -4 for
        DenseLayers (O&A App. O).
    :param precision: ``"full"``, ``"diagonal"`` or ``"shared_diagonal"``; default full for GP
        layers, diagonal (per unit) for DenseLayers.
    :param kl: ``"analytic"`` (default): the KL is analytic; a GP layer's inducing outputs are
        then marginalised (its data rows get the Gaussian marginal, DSVI-style), a DenseLayer's
        weights are still sampled. ``"sampled"``: each MC sample draws ``U_l`` (or ``W_l``) from
        ``q`` and the regulariser is the sampled log-ratio.
    :param residual_mean: apply the layers' mean functions (default) or ignore them.
    :param rho: Adam re-scaling of the log-precisions (default 3).
    :param seed: seed of the NumPy generator for the default ``V``.
    """

    options = ("precision", "kl", "residual_mean", "rho", "log_precision")
    summary = "local inducing with pseudo-data (Ober & Aitchison 2021)"
    positive_transform = "exp"

    @classmethod
    def initial_inducing_inputs(cls, X, num_inducing, seed):
        """O&A's local inducing inputs: ``N(0, 1)`` draws ``[M, D]`` (on standardised data)."""
        return np.random.default_rng(seed).standard_normal((num_inducing, X.shape[1]))

    @classmethod
    def from_data(
        cls, layers, X, Y, *, num_inducing, seed, log_precision: Optional[float] = None, **options
    ):
        """O&A's initialisation (App. O): the inducing inputs are on the layers already;
        pseudo-outputs ``N(0, 1)`` and a uniform log-precision (default 0 for GP layers, -4 for
        DenseLayers). ``X``, ``Y`` and ``num_inducing`` are not used."""
        return cls(layers, log_precision_init=log_precision, seed=seed, **options)

    def inducing_draw(self, num_samples: int, source: NoiseSource, dtype: tf.DType) -> InducingDraw:
        """Each layer's whitened outputs drawn from its own pseudo-data posterior, the last
        layer's integrated out when the KL is analytic."""
        return pseudo_data_draw(self, num_samples, source, dtype, is_global=False)

    def __init__(
        self,
        layers: Sequence,
        *,
        pseudo_outputs: Optional[Sequence] = None,
        log_precision_init: Union[None, float, Sequence] = None,
        precision: Optional[str] = None,
        kl: str = "analytic",
        residual_mean: bool = True,
        rho: float = 3.0,
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        DeepPosterior.__init__(self, layers, name=name)
        for i, layer in enumerate(self.layers):
            if (
                getattr(layer, "inducing_variable", None) is None
                and getattr(layer, "inducing_features", None) is None
            ):
                raise ValueError(
                    f"layers[{i}] has no inducing_inputs; the local-inducing posterior needs local "
                    "inducing inputs on every layer (inducing_inputs on a GPLayer, "
                    "inducing_features on a DenseLayer; use GlobalInducingPosterior for layers "
                    "without)"
                )
        self._init_common(
            precision, kl, residual_mean, check_positive_float(rho, "rho"), "auto", seed
        )
        L = self.depth
        rng = np.random.default_rng(seed)
        Ms = [layer.num_inducing for layer in self.layers]
        V_init = _initial_pseudo_outputs(pseudo_outputs, Ms, self.layers, rng, zero_last=False)
        default = [-4.0 if w else 0.0 for w in self.weight_space]
        if log_precision_init is None:
            log_prec = default
        else:
            log_prec = per_layer_floats(log_precision_init, "log_precision_init", L, None)
        self._init_pseudo_data(V_init, log_prec)

    def inducing_cholesky(self, l: int) -> tf.Tensor:
        """``chol(K(Z_{l-1}) + jitter I)`` ``[M, M]`` of a GP layer."""
        layer = self.layers[l]
        return inducing_cholesky(layer, layer.Z, name="K_uu (local inducing)")

    def q_moments(self, l: int):
        """``(q_mu [M, N_l], q_sqrt [Q, M, M])`` of a GP layer: mean ``Sigma Lambda V`` and
        ``chol(Sigma)`` (``Q = N_l`` for per-unit precisions, else 1). Diagnostic (e.g. SVGP)."""
        L_K = self.inducing_cholesky(l)
        L_B, a_mean = self.pseudo_data[l].posterior(L_K[None])
        q_mu = tf.linalg.matmul(L_K, a_mean[0])
        L_B = L_B[0] if L_B.shape.rank == 4 else L_B  # [Q, M, M]
        eye = tf.broadcast_to(tf.eye(tf.shape(L_K)[0], dtype=L_K.dtype), tf.shape(L_B))
        G = tf.linalg.matmul(L_K, tf.linalg.triangular_solve(L_B, eye, lower=True, adjoint=True))
        return q_mu, tf.linalg.cholesky(tf.linalg.matmul(G, G, transpose_b=True))

    def kl_divergence(self) -> tf.Tensor:
        """Sum over the GP layers of the analytic ``KL(q(U_l) || p(U_l))`` (scalar)."""
        terms = []
        for l in range(self.depth):
            if self.weight_space[l]:
                raise ValueError(
                    "kl_divergence is defined for GP layers only; a DenseLayer's KL depends "
                    "on its sampled prior precision"
                )
            terms.append(
                analytic_kl(*self.pseudo_data[l].posterior(self.inducing_cholesky(l)[None]))[0]
            )
        return tf.add_n(terms)

    def _local_weight_step(self, l: int, F, S: int, source: NoiseSource):
        """A DenseLayer with inducing features: ``(Phi(F) W, regulariser [S])``."""
        layer = self.layers[l]
        dtype = F.dtype
        Z = tf.cast(tf.convert_to_tensor(layer.inducing_features), dtype)
        M = layer.num_inducing
        Z = tf.broadcast_to(tf.expand_dims(Z, 0), tf.concat([[S], tf.shape(Z)], 0))
        Phi = tf.concat([Z, layer.features(F)], axis=1)
        step = self._weight_step(l, Phi, M, S, source)
        return step.H[:, M:], regulariser(step.log_ratio, step.kl)

    @inherit_check_shapes
    def propagate(self, X, num_samples: int = 1, seed: NoiseLike = None) -> Propagation:
        """Push ``X`` ``[N, D]`` through the layers; ``kl`` is ``[S]``.

        GP layer, analytic mode: ``mean = m(F) + A^T a_mean`` and ``var = k_ff - ||A||^2 +
        ||L_B^{-1} A||^2`` (``A = L_K^{-1} K_uf``). Sampled mode: ``U_l`` is drawn per sample
        (``"u/{l}"``) and the data rows are conditioned on it. DenseLayer: weights sampled
        (``"w/{l}"``) from the pseudo-data posterior on the inducing features.
        """
        S = num_samples
        source, F = self._start(X, S, seed)
        dtype = F.dtype
        jitter = gpflow.config.default_jitter()
        samples, regularisers = [], []
        mean = var = None
        gp_layers = [l for l in range(self.depth) if not self.weight_space[l]]
        # every GP layer's chol(K_uu) in one batched factorisation per step, with the inverses for
        # solve-free gradients
        factors, stack = inducing_factors([self.layers[l] for l in gp_layers], stacked=True)
        prior_chols = dict(zip(gp_layers, factors))
        stacked = self._stacked_posterior(stack)
        if stacked is not None:
            inverse_factors = tf.unstack(stacked.inverse_factors, num=self.depth)
            if self.kl_mode == "analytic":
                regularisers.append(tf.broadcast_to(stacked_analytic_kl(stacked), [S]))
        for l, layer in enumerate(self.layers):
            last = l == self.depth - 1
            if self.weight_space[l]:
                F, term = self._local_weight_step(l, F, S, source)
                regularisers.append(term)
                mean, var = F, tf.zeros_like(F)
                samples.append(F)
                continue
            P, M = layer.output_dim, layer.num_inducing
            L_K, T_K = prior_chols[l]  # [M, M] each
            if stacked is None:
                L_B1, a_mean = self.pseudo_data[l].posterior(
                    tf.expand_dims(L_K, 0)
                )  # a sample axis of 1
            else:
                L_B1, a_mean = None, tf.expand_dims(stacked.means[l], 0)  # [1, M, P]
            A = whitened_projection(L_K, layer.K(layer.Z, F), inverse=T_K)
            prior_mean = layer_mean(layer, F, self.residual_mean)
            if self.kl_mode == "analytic":
                mean = conditional_mean(A, a_mean, prior_mean)
                if stacked is None:
                    # the sample axis of 1 broadcasts (no slices, whose gradients would be extra
                    # ops)
                    regularisers.append(tf.broadcast_to(analytic_kl(L_B1, a_mean), [S]))
                    L_B = tf.broadcast_to(L_B1, tf.concat([[S], tf.shape(L_B1)[1:]], 0))
                    var = tf.expand_dims(residual_variance(layer, F, A), -1) + marginal_variance(
                        L_B, A, P
                    )
                else:
                    # |L_B^{-1} A|^2 by a product with the stack's inverse factor; [S, N, 1]
                    # broadcasts over the units (no repeat, whose gradient would be another
                    # reduction)
                    X = tf.linalg.matmul(tf.expand_dims(inverse_factors[l], 0), A)  # [S, M, N]
                    var = tf.expand_dims(
                        residual_variance(layer, F, A) + tf.reduce_sum(tf.square(X), axis=-2), -1
                    )
            else:
                if L_B1 is None:
                    L_B1 = tf.expand_dims(tf.unstack(stacked.factors, num=self.depth)[l], 0)
                L_B = tf.broadcast_to(L_B1, tf.concat([[S], tf.shape(L_B1)[1:]], 0))
                eps = source.normal(f"u/{l}", [S, M, P], dtype)
                a, lr, _ = draw_weights(L_B, tf.broadcast_to(a_mean, [S, M, P]), eps)
                regularisers.append(-lr)
                mean = conditional_mean(A, a, prior_mean)
                var = tf.expand_dims(residual_variance(layer, F, A), -1)
            if last:
                var = tf.broadcast_to(tf.maximum(var, 0.0), tf.shape(mean))
                samples.append(self.sample_last_layer(mean, var, source))
            else:
                F = sample_rows(
                    mean, var, source.normal(f"f/{l}", [S, tf.shape(F)[1], P], dtype), jitter
                )
                samples.append(F)
        return Propagation(samples=samples, mean=mean, var=var, kl=tf.add_n(regularisers))

    def _stacked_posterior(self, stack: Optional[tf.Tensor]) -> Optional[StackedPosterior]:
        """Every layer's pseudo-data posterior as one stack (:func:`stacked_posterior`) when the
        layers allow it: all function-space GP layers, ``precision="full"``, and their ``K_uu``
        factors one stack ``[L, M, M]`` (equal M; ``stack`` from :func:`inducing_choleskies`).
        Else None: each layer's own :meth:`PseudoData.posterior`."""
        if (
            stack is None
            or any(self.weight_space)
            or any(pd.kind != "full" for pd in self.pseudo_data)
        ):
            return None
        return stacked_posterior(self.pseudo_data, stack)


# ============================================================================= initialisers


def _initial_pseudo_outputs(pseudo_outputs, Ms, layers, rng, zero_last):
    L = len(layers)
    out = []
    for l, (V, M, layer) in enumerate(
        zip(per_layer_list(pseudo_outputs, "pseudo_outputs", L), Ms, layers)
    ):
        P = layer.output_dim
        if V is None:
            V = np.zeros((M, P)) if (zero_last and l == L - 1) else rng.standard_normal((M, P))
        out.append(check_finite_array(V, f"pseudo_outputs[{l}]", shape=(M, P)))
    return out


class GlobalInducingBNNPosterior(GlobalInducingPosterior):
    """The global-inducing family of a BNN (``build_bnn(posterior="global")``): the same
    posterior on DenseLayers (the weight-space path), with the BNN options and O&A's BNN
    initialisation."""

    options = ("precision", "kl", "last_layer", "rho", "space")
    summary = "global inducing points (gi)"
    positive_transform = "softplus"

    @classmethod
    def from_data(cls, layers, X, Y, *, num_inducing, seed, **options):
        """``U_0`` and the last pseudo-outputs from
        :func:`~deepgp_gi.initialisation.global_inducing_rows`, hidden pseudo-outputs ``N(0, 1)``,
        the posterior's default precisions."""
        rng = np.random.default_rng(seed)
        U0, V_top = global_inducing_rows(np.asarray(X), np.asarray(Y), num_inducing, rng)
        V = [rng.standard_normal((num_inducing, layer.output_dim)) for layer in layers[:-1]] + [
            V_top
        ]
        return cls(layers, inducing_inputs=U0, pseudo_outputs=V, seed=seed, **options)


class LocalInducingBNNPosterior(LocalInducingPosterior):
    """The local-inducing family of a BNN (``build_bnn(posterior="local")``): inducing features
    ``N(0, 1)`` on every DenseLayer."""

    options = ("precision", "kl", "rho", "log_precision")
    summary = "local inducing features (li)"
    positive_transform = "softplus"

    @classmethod
    def initial_inducing_inputs(cls, X, num_inducing, seed):
        return None

    @classmethod
    def initial_inducing_features(cls, fan_in, rng):
        """``N(0, 1)`` inducing features ``[fan_in, fan_in]`` (O&A App. O)."""
        return rng.standard_normal((fan_in, fan_in))
