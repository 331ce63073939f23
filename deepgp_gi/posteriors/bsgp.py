"""BSGP: SGHMC samples of a deep GP's inducing outputs, inducing inputs and kernel hyperparameters
(Rossi, Heinonen, Bonilla, Shen & Filippone 2021, "Sparse Gaussian processes revisited").

SGHMC (:mod:`deepgp_gi.posteriors.sghmc`) samples every layer's whitened inducing outputs ``V_l``
and hands the inducing inputs ``Z_l`` and the kernel hyperparameters to Adam. BSGP puts priors on
those too and samples all of them with the same chain: the state of layer ``l`` is

* ``V_l`` ``[M, D_l]``, prior ``N(0, I)`` (``U_l = L_K V_l``, so ``p(U_l | Z_l, theta_l)``);
* ``Z_l`` ``[M, D_{l-1}]``, prior ``inducing_prior``: ``"normal"`` (default), every entry
  ``N(0, 1)``; ``"uniform"``, the improper flat prior (``log p = 0``); ``"determinantal"``,
  ``log p(Z | theta) = log det K(Z, Z)`` up to its (unknown) normaliser;
* the log lengthscales ``log ell_l`` (the kernel's shape: one per input, or one), prior
  ``N(log_lengthscale_prior[0], log_lengthscale_prior[1]^2)``, default ``N(0, 1)`` (a log-normal
  with median 1);
* the log kernel variance ``log sigma^2_l``, prior ``N(log 0.05, 1)`` (``log_variance_prior``).

The target is ``log p(V, Z, theta) + (N / B) sum_batch log p(y | V, Z, theta)``, with the same
likelihood term as SGHMC (the last layer's ``f`` integrated out, the hidden layers sampled). Each
of the ``4 L`` state variables moves by the scale-adapted update
of :func:`~.sghmc.scale_adapted_sghmc` with its own segment of the flat momentum and adaptation
statistics (:meth:`~.sghmc.SGHMCPosterior.sghmc_step`; the update is SGHMC's, not a copy). Only what
is left, the likelihood's parameters (and any trainable mean-function parameters; the builders' are
fixed), goes through Adam, with the whole state set to a uniformly drawn window member
(moving-window MCEM, as SGHMC).

**Where the state lives.** The chain moves the layers' own GPflow parameters: ``Z_l`` is
``layer.inducing_variable.Z`` and the log hyperparameters are the unconstrained variables of
``layer.kernel``'s ``lengthscales`` and ``variance`` under the ``exp`` transform (the family's
default ``positive_transform``; another transform is refused, since the priors are on the logs).
So ``print_summary`` and ``layer.Z`` show the chain's current state, a checkpoint holds it once,
and ``gpflow.set_trainable(layer.kernel, False)`` (or the layer, or ``layer.inducing_variable``)
holds that part fixed: it is neither sampled nor trained. ``V_l`` is always sampled. Adam never
sees a chain variable (:meth:`sampler_variables` lists them).

**Kernels.** One isotropic stationary kernel per layer whose shape in the scaled distance is
known here (SquaredExponential, Matern12/32/52), optionally plus ``White`` terms (the builders'
small nugget on the hidden layers: on the diagonal of ``K(Z, Z)`` and in ``k(x, x)`` as in every
other family; the posterior sets them non-trainable, so they are neither sampled nor trained).
Predictions mix over samples with different hyperparameters, so the covariances are evaluated from
the sampled values, one kernel per sample (``[S, M, M]`` factorisations). A pass factorises every
layer's ``K_uu`` at once (they depend on the state only, not on the rows): one batched factorisation
of the ``[L, (S,) M, M]`` stack with its inverse (:func:`~deepgp_gi.linalg.cholesky_with_inverse`),
which the gradients of the factorisation and of the layers' projections use instead of solves.

**Where the paper and the code differ, and what is followed here.**

* Hyperparameter priors: the paper places log-normal priors "with unit variance and means 1 and
  0.05" on the lengthscales and the variance; the code puts ``N(0, 1)`` on the log lengthscales
  and ``N(log 0.05, 1)`` on the log variance (medians 1 and 0.05). The code's reading is followed.
* Inducing-input prior: the paper compares normal, uniform, determinantal and Strauss priors and
  keeps the normal one, as the code's experiments do; normal is the default here. The Strauss
  prior counts close pairs, a piecewise-constant log density whose gradient is zero almost
  everywhere, so under SGHMC it acts as the uniform prior; it is not offered.
* Normalisers: the code drops the priors' constants; here they are kept (they do not change the
  chain, only the reported log joint), except for the determinantal prior's, which is unknown.
* Chain steps per hyperparameter step: the code runs 21 SGHMC steps (11 of them adapting) between
  two window entries and Adam steps; the paper counts iterations of one sampler step and one Adam
  step. By default one ``fit`` step is one chain step, one window entry and one Adam step, as for
  SGHMC, so the two families' steps cost and mean the same; ``chain_steps=21``
  (``sghmc.ROSSI_CHAIN_STEPS``) runs the code's schedule, each chain step on its own minibatch, so
  ``fit(steps=21 * T)`` is the code's ``T`` iterations (:func:`~.sghmc.chain_step_roles`).
* Window: the code keeps the last 64 states (``WINDOW_SIZE``; SGHMC's code 100). The code adapts at
  every training step and not while collecting, as SGHMC's; :func:`~deepgp_gi.collect_samples`
  does the same. The paper collects 256 samples; the code's script 512, 32 steps apart.
* Start: ``V = 0`` and k-means inducing inputs (both codes); the hyperparameters start where the
  builders start them (the code starts lengthscales at ``sqrt(D)`` and the variance at 0.1).

**Prediction.** As SGHMC's: :meth:`BSGPPosterior.propagate` draws ``S`` members of the sample
set (stored samples, else the window, else the current state), now each with its own ``Z`` and
hyperparameters; ``Propagation.kl`` is ``-log p(V, Z, theta)`` of each member.
:meth:`sampled_state` returns the stored samples by name.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf

from ..kernels import batched_square_distance
from ..linalg import add_jitter, cholesky_with_inverse, safe_cholesky
from ..validation import check_choice
from .base import Propagation
from .conditionals import whitened_projection
from .sghmc import (
    CHAIN_STEPS,
    MOMENTUM_DECAY,
    STEP_SIZE,
    FixedTerms,
    FlatGaussianPrior,
    SGHMCPosterior,
)

__all__ = ["BSGPPosterior", "INDUCING_PRIORS"]

#: Priors on the inducing inputs (module docs).
INDUCING_PRIORS = ("normal", "uniform", "determinantal")
#: ``(mean, sd)`` of the normal priors on the log lengthscales and the log kernel variance
#: (Rossi et al.'s code) and their window size.
LOG_LENGTHSCALE_PRIOR = (0.0, 1.0)
LOG_VARIANCE_PRIOR = (math.log(0.05), 1.0)
WINDOW_SIZE = 64

_SQRT3, _SQRT5 = math.sqrt(3.0), math.sqrt(5.0)


def _unit_profile(kernel, r2: tf.Tensor) -> tf.Tensor:
    """``k(r) / sigma^2`` of a stationary kernel at scaled squared distances ``r2``."""
    if isinstance(kernel, gpflow.kernels.SquaredExponential):
        return tf.exp(-0.5 * r2)
    r = tf.sqrt(tf.maximum(r2, 1e-36))
    if isinstance(kernel, gpflow.kernels.Matern12):
        return tf.exp(-r)
    if isinstance(kernel, gpflow.kernels.Matern32):
        return (1.0 + _SQRT3 * r) * tf.exp(-_SQRT3 * r)
    if isinstance(kernel, gpflow.kernels.Matern52):
        return (1.0 + _SQRT5 * r + 5.0 / 3.0 * r2) * tf.exp(-_SQRT5 * r)
    raise TypeError(f"no unit profile for {type(kernel).__name__}")  # refused in _split_kernel


_PROFILED = (
    gpflow.kernels.SquaredExponential,
    gpflow.kernels.Matern12,
    gpflow.kernels.Matern32,
    gpflow.kernels.Matern52,
)


def _split_kernel(kernel, where: str) -> Tuple[gpflow.kernels.Kernel, List[gpflow.kernels.White]]:
    """The sampled stationary kernel of a layer and its fixed ``White`` terms; raise otherwise."""
    parts = list(kernel.kernels) if isinstance(kernel, gpflow.kernels.Sum) else [kernel]
    stationary = [k for k in parts if isinstance(k, _PROFILED)]
    whites = [k for k in parts if isinstance(k, gpflow.kernels.White)]
    if len(stationary) != 1 or len(stationary) + len(whites) != len(parts):
        raise TypeError(
            f"{where}.kernel is {type(kernel).__name__}"
            f"{'(' + ', '.join(type(k).__name__ for k in parts) + ')' if len(parts) > 1 else ''}; "
            "BSGP samples the lengthscales and variance of one SquaredExponential, Matern12, "
            "Matern32 or Matern52 kernel per layer (optionally plus White terms, kept fixed)"
        )
    k = stationary[0]
    for name in ("lengthscales", "variance"):
        transform = getattr(k, name).transform
        if type(transform).__name__ != "Exp":
            raise ValueError(
                f"{where}.kernel.{name} has the transform {type(transform).__name__}; BSGP samples "
                "log hyperparameters and needs the exp transform (build with "
                "positive_transform='exp', the family's default)"
            )
    return k, whites


def _normal_log_density(x: tf.Tensor, loc: float, scale: float, event_rank: int) -> tf.Tensor:
    """``sum log N(x | loc, scale^2)`` over the last ``event_rank`` axes of ``x``."""
    z = (x - loc) / scale
    terms = -0.5 * tf.square(z) - math.log(scale) - 0.5 * math.log(2.0 * math.pi)
    return tf.reduce_sum(terms, axis=list(range(-event_rank, 0))) if event_rank else terms


def _check_prior(value, name: str) -> Tuple[float, float]:
    try:
        loc, scale = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (mean, sd) pair of numbers, got {value!r}") from None
    if not (math.isfinite(loc) and math.isfinite(scale) and scale > 0.0):
        raise ValueError(
            f"{name} must be a (mean, sd) pair with a finite mean and a positive sd, got {value!r}"
        )
    return loc, scale


class BSGPPosterior(SGHMCPosterior):
    """A chain and samples over every layer's ``V_l``, ``Z_l``, log lengthscales and log kernel
    variance (module docs). The chain state is ordered ``[V_0..V_{L-1}, Z_0.., log ell_0..,
    log sigma^2_0..]`` (:meth:`chain_variables`).

    :param layers: GP layers, each with ``inducing_inputs`` and a kernel as in the module docs.
    :param step_size: ``eps`` (default 0.01, as SGHMC).
    :param momentum_decay: ``alpha`` in ``(0, 1]`` (default 0.05).
    :param window_size: states kept for the likelihood's Adam steps (default 64, Rossi et al.'s
        code).
    :param inducing_prior: ``"normal"`` (default), ``"uniform"`` or ``"determinantal"``.
    :param log_lengthscale_prior: ``(mean, sd)`` of the normal prior on every log lengthscale.
    :param log_variance_prior: ``(mean, sd)`` of the normal prior on the log kernel variance.
    """

    options = SGHMCPosterior.options + (
        "inducing_prior",
        "log_lengthscale_prior",
        "log_variance_prior",
    )
    summary = (
        "BSGP: SGHMC samples of the inducing outputs, inducing inputs and kernel hyperparameters "
        "(Rossi et al. 2021)"
    )

    def __init__(
        self,
        layers: Sequence,
        step_size: float = STEP_SIZE,
        momentum_decay: float = MOMENTUM_DECAY,
        window_size: int = WINDOW_SIZE,
        chain_steps: int = CHAIN_STEPS,
        inducing_prior: str = "normal",
        log_lengthscale_prior: Sequence[float] = LOG_LENGTHSCALE_PRIOR,
        log_variance_prior: Sequence[float] = LOG_VARIANCE_PRIOR,
        name: Optional[str] = None,
    ):
        self.inducing_prior = check_choice(inducing_prior, "inducing_prior", INDUCING_PRIORS)
        self.log_lengthscale_prior = _check_prior(log_lengthscale_prior, "log_lengthscale_prior")
        self.log_variance_prior = _check_prior(log_variance_prior, "log_variance_prior")
        for l, layer in enumerate(layers):
            for white in _split_kernel(layer.kernel, f"layers[{l}]")[1]:
                gpflow.set_trainable(white, False)  # a fixed nugget: neither sampled nor Adam's
        super().__init__(
            layers,
            step_size=step_size,
            momentum_decay=momentum_decay,
            window_size=window_size,
            chain_steps=chain_steps,
            name=name,
        )

    # ------------------------------------------------------------------ the state
    def _kernel_parts(self, l: int) -> Tuple[gpflow.kernels.Kernel, List[gpflow.kernels.White]]:
        return _split_kernel(self.layers[l].kernel, f"layers[{l}]")

    def _stationary(self, l: int):
        return self._kernel_parts(l)[0]

    def chain_variables(self) -> List[tf.Variable]:
        """``[V_0..V_{L-1}, Z_0..Z_{L-1}, log ell_0.., log sigma^2_0..]``: the inducing outputs and
        the layers' own variables of the inducing inputs and of the kernel's log hyperparameters."""
        L = self.depth
        return (
            list(self.inducing_outputs)
            + [self.layers[l].inducing_variable.Z.unconstrained_variable for l in range(L)]
            + [self._stationary(l).lengthscales.unconstrained_variable for l in range(L)]
            + [self._stationary(l).variance.unconstrained_variable for l in range(L)]
        )

    def chain_parameters(self) -> List[gpflow.Parameter]:
        """The GPflow parameters behind the chain's ``Z``, lengthscale and variance variables."""
        L = self.depth
        return (
            [self.layers[l].inducing_variable.Z for l in range(L)]
            + [self._stationary(l).lengthscales for l in range(L)]
            + [self._stationary(l).variance for l in range(L)]
        )

    def chain_moves(self) -> List[bool]:
        """``V`` always moves; a ``Z`` or hyperparameter that ``gpflow.set_trainable(..., False)``
        froze is held (read when the step is traced)."""
        return [True] * self.depth + [bool(p.trainable) for p in self.chain_parameters()]

    def split_state(self, state: Sequence) -> Tuple[List, List, List, List]:
        """``(V, Z, log lengthscales, log variances)``, one list of ``L`` values each, of a chain
        state in :meth:`chain_variables`' order."""
        L = self.depth
        if len(state) != 4 * L:
            raise ValueError(f"a BSGP state has 4 * depth = {4 * L} entries, got {len(state)}")
        state = list(state)
        return state[:L], state[L : 2 * L], state[2 * L : 3 * L], state[3 * L :]

    def sampled_state(self) -> Dict[str, List[tf.Tensor]]:
        """The stored samples by name: ``inducing_outputs`` ``[S, M, D_l]``, ``inducing_inputs``
        ``[S, M, D_{l-1}]``, ``lengthscales`` (the kernel's shape with a leading ``S``) and
        ``variances`` ``[S]``, one entry per layer (constrained values; empty before
        :func:`~deepgp_gi.collect_samples`)."""
        V, Z, log_ell, log_var = self.split_state([tf.convert_to_tensor(s) for s in self.samples])
        return {
            "inducing_outputs": V,
            "inducing_inputs": Z,
            "lengthscales": [tf.exp(x) for x in log_ell],
            "variances": [tf.exp(x) for x in log_var],
        }

    # ------------------------------------------------------------------ densities and propagation
    def _layer_gram(self, l: int, Z, log_ell, log_var, batched: bool):
        """``(lengthscales, variance, white, Z / lengthscales, K_uu)`` of layer ``l`` at one state:
        shaped to broadcast against ``[S, N, D]`` rows when ``batched`` (``[S, 1, D or 1]``,
        ``[S, 1, 1]``), plain otherwise; ``K_uu = sigma^2 k(Z, Z) + (white + jitter) I``,
        ``[S, M, M]`` or ``[M, M]``; the scaled ``Z`` serves ``K(Z, F)`` too (one division and
        one gradient of it)."""
        stationary, whites = self._kernel_parts(l)
        ell, var = tf.exp(log_ell), tf.exp(log_var)
        if batched:
            ell = tf.reshape(ell, [tf.shape(ell)[0], 1, -1])
            var = tf.reshape(var, [-1, 1, 1])
        Zs = Z / ell
        Kzz = var * _unit_profile(stationary, batched_square_distance(Zs, Zs))
        white = tf.add_n([tf.convert_to_tensor(w.variance) for w in whites]) if whites else 0.0
        return ell, var, white, Zs, add_jitter(Kzz, white + gpflow.config.default_jitter())

    def _layer_kernel(self, l: int, Z, log_ell, log_var, batched: bool):
        """:meth:`_layer_gram` with ``L_K = chol(K_uu)`` in place of ``K_uu``."""
        *terms, Kuu = self._layer_gram(l, Z, log_ell, log_var, batched)
        return (*terms, safe_cholesky(Kuu, name=f"K_uu of layer {self.layers[l].name}"))

    def _factorised(self, grams: Sequence[tf.Tensor]) -> List[Tuple[tf.Tensor, tf.Tensor]]:
        """``(L_K, L_K^{-1})`` of every layer's ``K_uu`` (:meth:`_layer_gram`), the layers of one
        static shape (the usual equal ``M``) as one stack: one factorisation, one jitter ladder,
        one triangular solve for the inverses (:func:`~deepgp_gi.linalg.cholesky_with_inverse`);
        each member keeps its own jitter escalation."""
        groups = {}
        for l, K in enumerate(grams):
            shape = tuple(K.shape.as_list()) if K.shape.rank is not None else ("run-time", l)
            groups.setdefault(shape, []).append(l)
        out: List[Tuple[tf.Tensor, tf.Tensor]] = [None] * len(grams)  # type: ignore[list-item]
        for members in groups.values():
            names = ", ".join(self.layers[l].name for l in members)
            if len(members) == 1:
                (l,) = members
                L, T = cholesky_with_inverse(grams[l], name=f"K_uu of layer {names}")
                out[l] = (L, T)
                continue
            L, T = cholesky_with_inverse(
                tf.stack([grams[l] for l in members]), name=f"K_uu of layers {names}"
            )
            for l, L_l, T_l in zip(
                members, tf.unstack(L, num=len(members)), tf.unstack(T, num=len(members))
            ):
                out[l] = (L_l, T_l)
        return out

    def flat_gaussian_prior(self) -> FlatGaussianPrior:
        """The prior's Gaussian factors over the flat state: ``N(0, 1)`` on every entry of ``V``
        (and of ``Z`` under the normal inducing prior; the uniform and determinantal priors have
        none there), the normal priors on the log lengthscales and log variances."""
        V, Z, log_ell, log_var = self.split_state(self.chain_variables())
        normal_Z = self.inducing_prior == "normal"
        segments = (
            [(v, 0.0, 1.0) for v in V]
            + [(z, 0.0, 1.0 if normal_Z else None) for z in Z]
            + [(x, *self.log_lengthscale_prior) for x in log_ell]
            + [(x, *self.log_variance_prior) for x in log_var]
        )
        loc, precision, constant = [], [], 0.0
        for v, mean, sd in segments:
            n = v.shape.num_elements()
            loc.append(np.full(n, mean))
            precision.append(np.full(n, 0.0 if sd is None else sd**-2.0))
            if sd is not None:
                constant -= n * (math.log(sd) + 0.5 * math.log(2.0 * math.pi))
        loc, precision = np.concatenate(loc), np.concatenate(precision)
        return FlatGaussianPrior(
            None if not loc.any() else loc,
            None if np.all(precision == 1.0) else precision,
            constant,
        )

    def fixed_terms(self, X, num_samples: int = 1) -> Optional[FixedTerms]:
        """None: every term of a pass depends on the state (``Z`` and the hyperparameters are
        sampled)."""
        return None

    def _determinantal_log_prior(
        self, Z, log_ell, log_var, batched: bool, choleskies: Optional[Sequence[tf.Tensor]]
    ) -> tf.Tensor:
        """``sum_l log det K(Z_l, Z_l)`` (with the white terms and jitter) of the determinantal
        inducing prior, from the states' ``L_K`` (``choleskies``) when given."""
        terms = []
        for l in range(self.depth):
            L_K = (
                choleskies[l]
                if choleskies is not None
                else self._layer_kernel(l, Z[l], log_ell[l], log_var[l], batched)[-1]
            )
            terms.append(2.0 * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(L_K)), axis=-1))
        return tf.add_n(terms)

    def log_prior(
        self, state: Sequence, choleskies: Optional[Sequence[tf.Tensor]] = None
    ) -> tf.Tensor:
        """``log p(V, Z, theta)`` of a chain state (module docs): a scalar for one state, ``[S]``
        for per-sample values with a leading axis. ``choleskies`` (the states' ``L_K``) saves their
        recomputation for the determinantal prior."""
        V, Z, log_ell, log_var = self.split_state([tf.convert_to_tensor(s) for s in state])
        batched = V[0].shape.rank == 3
        lp = super().log_prior(V)
        ell_loc, ell_scale = self.log_lengthscale_prior
        var_loc, var_scale = self.log_variance_prior
        for l in range(self.depth):
            base_rank = self.layers[l].inducing_variable.Z.shape.rank
            if self.inducing_prior == "normal":
                lp += _normal_log_density(Z[l], 0.0, 1.0, base_rank)
            lp += _normal_log_density(
                log_ell[l], ell_loc, ell_scale, log_ell[l].shape.rank - int(batched)
            )
            lp += _normal_log_density(log_var[l], var_loc, var_scale, 0)
        if self.inducing_prior == "determinantal":
            lp += self._determinantal_log_prior(Z, log_ell, log_var, batched, choleskies)
        return lp

    def propagate_given(
        self,
        X,
        state: Sequence,
        num_samples: int = 1,
        seed=None,
        fixed: Optional[FixedTerms] = None,
        gaussian_prior: bool = True,
    ) -> Propagation:
        """Push ``X`` through the layers at the chain state ``state`` (:meth:`chain_variables`'
        order; one value shared by the samples, or ``[S, ...]`` per sample): hidden layers sampled
        (noise ``"f/{l}"``), the last layer's conditional marginals returned with a sample; ``kl``
        is ``-log p(V, Z, theta)`` per sample. ``fixed`` must be None (:meth:`fixed_terms`);
        ``gaussian_prior=False`` leaves the prior's Gaussian factors (:meth:`flat_gaussian_prior`)
        out of ``kl``: what is left is the determinantal prior's, or nothing."""
        if fixed is not None:
            raise ValueError("BSGP has no state-free terms to share (fixed_terms is None)")
        V, Z, log_ell, log_var = self.split_state(state)
        batched = tf.convert_to_tensor(V[0]).shape.rank == 3
        source, F = self._start(X, num_samples, seed)
        grams = [
            self._layer_gram(l, Z[l], log_ell[l], log_var[l], batched) for l in range(self.depth)
        ]
        factors = self._factorised([g[-1] for g in grams])
        choleskies = [L_K for L_K, _ in factors]

        def projection(l, F):  # with the state's own kernel: k(x, x) is [S, 1] or a scalar
            ell, var, white, Zs, _ = grams[l]
            L_K, T_K = factors[l]
            Kzf = var * _unit_profile(self._stationary(l), batched_square_distance(Zs, F / ell))
            A = whitened_projection(L_K, Kzf, inverse=T_K)
            prior_var = (tf.squeeze(var, -1) if batched else var) + white
            return A, self.layers[l].mean(F), prior_var - tf.reduce_sum(tf.square(A), axis=-2)

        samples, mean, var_rows = self.pass_through_layers(F, V, projection, source)
        if gaussian_prior:
            kl = tf.broadcast_to(-self.log_prior(state, choleskies), [num_samples])
        elif self.inducing_prior == "determinantal":
            kl = tf.broadcast_to(
                -self._determinantal_log_prior(Z, log_ell, log_var, batched, choleskies),
                [num_samples],
            )
        else:
            kl = tf.zeros([num_samples], mean.dtype)
        return Propagation(samples=samples, mean=mean, var=var_rows, kl=kl)
