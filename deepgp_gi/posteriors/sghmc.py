"""SGHMC samples of a deep GP's inducing outputs (Havasi, Hernandez-Lobato & Murillo-Fuentes 2018).

Not a variational family: the posterior holds a Markov chain over every layer's whitened
inducing outputs ``V_l`` ``[M, D_l]`` (prior ``N(0, I)``, ``U_l = L_K V_l``), moved by scale-adapted
stochastic-gradient Hamiltonian Monte Carlo (Springenberg et al. 2016), and the samples it keeps.

**The target.** ``log p(V) + (N / B) sum_batch log p(y_n | V)``: the last layer's ``f`` is
integrated out by GPflow's ``predict_log_density`` (in closed form for a Gaussian likelihood,
``log N(y | mu, s + sigma^2)``; by its closed form or Gauss-Hermite quadrature for the other
likelihoods), except for Monte Carlo likelihoods (Softmax), which see the last layer's sampled
``f`` (``log p(y | f)``, the model's usual Monte Carlo path); the hidden layers' outputs are sampled
(one draw per step and sample, as in the paper, so for depth > 1 the gradient is that of
``log p(y | V, F_hidden)``, the paper's estimator). The minibatch term is an unbiased estimate of
the full-data sum.

**The update** (:func:`scale_adapted_sghmc`; Springenberg et al. 2016, eqs. 10-13, as the
reference code writes it). For each layer's ``theta = V_l`` with momentum-like ``p``, adaptation
statistics ``xi`` (the averaging window), ``g`` (gradient mean) and ``g2`` (second moment), and
the gradient ``grad`` of the *per-point* loss ``u = -(1/B) sum_batch log p(y | V) - log p(V) / N``
(an unbiased estimate of ``U / N``, ``U`` the full-data negative log target)::

    Minv  = 1 / (sqrt(g2 + 1e-16) + 1e-16)
    p'    = p - eps^2 Minv grad - alpha p + sqrt(2 (eps^2 / N) alpha Minv) z,   z ~ N(0, I)
    theta'= theta + p'
    (adapting only)  r = 1 / (xi + 1);  g' = (1 - r) g + r grad;  g2' = (1 - r) g2 + r grad^2;
                     xi' = 1 + xi (1 - g^2 / (g2 + 1e-16))

with every right-hand side read before the step (the statistics the step uses are the previous
step's). In terms of ``U`` this is Springenberg et al.'s update with preconditioner
``M^-1 = V_hat^-1/2`` of ``grad U`` and ``eps M^-1 C = alpha``: the drift is ``eps^2 M^-1 grad U``
and the injected variance ``2 eps^2 alpha M^-1`` (``Minv`` above is ``N M^-1``), so the chain
samples the target at temperature 1. Feeding the *summed* loss ``U`` with this noise (a known
error of a public port) samples at temperature ``1 / N``; ``tests/posteriors/test_sghmc.py``
checks the temperature against the exact posterior. The term ``-eps^4 I`` of the noise and the
gradient-noise estimate ``B_hat`` are taken as 0, as in the reference code.

**Where the code and the paper differ, and what is followed here.**

* Step-size parameterisation: the paper writes the update in ``U`` with a step ``eps``; the
  reference code feeds the per-point loss and scales the noise by ``eps / sqrt(N)``. The two are
  the same chain (above); this module follows the code, so its defaults (``eps = 0.01``,
  ``alpha = 0.05``, statistics started at 1) mean what they mean there.
* Adaptation: the paper adapts the preconditioner and friction during burn-in. The code adapts
  at every step of training (``fit``) and stops adapting while collecting samples; this module
  does the same (``fit`` adapts, :func:`~deepgp_gi.collect_samples` does not). While the
  statistics adapt, the preconditioner depends on the recent states, and the chain is not exact:
  on a smooth target the gradient barely changes between steps, ``xi`` stays near 1, ``g2``
  follows the last few gradients, and the chain's variance is off while they adapt and right once
  they are fixed (``_quadratic_chain`` in ``tests/posteriors/test_sghmc.py`` checks both).
  So samples come from ``collect_samples``, not from ``fit``'s window. In the code the
  order of the reads and writes of the statistics in one step is left to TensorFlow 1's
  scheduler; here all reads precede the writes (Springenberg's Theano update semantics).
* Start: ``V = 0``, momenta 0 (the code's start; the paper does not state one).
* Hyperparameters (moving-window MCEM): each ``fit`` step takes one SGHMC step, stores the new
  state in a window of the last ``window_size`` (100) states, then takes one Adam step on the
  hyperparameters with ``V`` set to a uniformly drawn window member, as in the code. The code's
  Adam minimises the per-point loss; ``fit`` minimises the summed one (Adam is invariant to the
  scale up to its epsilon), as for every other family. The code draws a second minibatch for the
  Adam step; here both halves of a step use the step's minibatch (``fit``'s one batch stream).

**Prediction.** :meth:`SGHMCPosterior.propagate` draws ``S`` members of the sample set uniformly
(with replacement; noise name ``"sghmc/index"``): the stored samples after
:func:`~deepgp_gi.collect_samples`, else the window, else the chain's current state. The model's
predictions and metrics mix over them (a log density is the logsumexp over the samples' Gaussian
components). ``Propagation.kl`` is ``-log p(V)`` of each sample's ``V`` (so ``model.elbo`` is an
estimate of the log joint with the variational expectation of the likelihood, not a bound).

The chain's state (``inducing_outputs``, ``momenta``, ``adaptation_window``, ``gradient_mean``,
``gradient_square``, ``window``, ``window_count``, ``samples``) is held in non-trainable
``tf.Variable`` s on the posterior: a checkpoint of the model holds it, and ``fit`` never hands it
to Adam (:meth:`SGHMCPosterior.sampler_variables`).
"""

from __future__ import annotations

import math
from typing import List, NamedTuple, Optional, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import inherit_check_shapes

from ..initialisation import kmeans_inducing_inputs
from ..validation import check_positive_float, check_positive_int
from .base import DeepPosterior, Propagation
from .conditionals import (
    conditional_mean,
    inducing_factors,
    require_local_inducing,
    residual_variance,
    sample_rows,
    whitened_projection,
)

__all__ = [
    "SGHMCPosterior",
    "SamplerState",
    "FixedTerms",
    "FlatGaussianPrior",
    "scale_adapted_sghmc",
    "chain_step_roles",
    "uniform_index",
    "ROSSI_CHAIN_STEPS",
]

#: Default step size ``eps`` and momentum decay ``alpha`` (Havasi et al.'s code) and window size.
STEP_SIZE = 0.01
MOMENTUM_DECAY = 0.05
WINDOW_SIZE = 100
#: Chain steps per hyperparameter step: one (Havasi et al.), or Rossi et al.'s BSGP schedule of 21
#: (:func:`chain_step_roles`: 11 of them adapt).
CHAIN_STEPS = 1
ROSSI_CHAIN_STEPS = 21


def chain_step_roles(step: int, chain_steps: int) -> Tuple[bool, bool]:
    """``(adapts, ends_iteration)`` of ``fit`` step ``step`` when one iteration is ``chain_steps``
    chain steps: its position ``i = step mod chain_steps`` adapts the statistics when ``i`` is 0 or
    odd (one step, then pairs of an adapting and a plain step: Rossi et al.'s 21 steps, 11
    adapting), and the iteration's last step (``i = chain_steps - 1``) also enters the window and
    takes the hyperparameter step. With ``chain_steps = 1`` every step does all three."""
    i = int(step) % int(chain_steps)
    return (i == 0 or i % 2 == 1), i == int(chain_steps) - 1


class SamplerState(NamedTuple):
    """One variable's scale-adapted SGHMC state (arrays or tensors of the variable's shape)."""

    theta: object
    p: object
    xi: object
    g: object
    g2: object


class FixedTerms(NamedTuple):
    """What a pass through the layers computes that does not depend on the chain's inducing outputs
    ``V`` (:meth:`SGHMCPosterior.fixed_terms`): a sampler step's two passes share it."""

    #: every layer's ``L_K = chol(K(Z, Z) + jitter I)``, ``[M_l, M_l]``
    choleskies: List[tf.Tensor]
    #: the first layer's ``(A [S, M, N], m(X) [S, N, D_0], k(x, x) - |A|^2 [S, N])`` on the inputs
    first: Tuple[tf.Tensor, tf.Tensor, tf.Tensor]
    #: every layer's ``L_K^{-1}``, for the projections' gradients (None: solved)
    inverses: Optional[List[tf.Tensor]] = None


class FlatGaussianPrior(NamedTuple):
    """The Gaussian factors of a chain's prior over its flat state
    (:meth:`SGHMCPosterior.flat_gaussian_prior`):
    ``log p_G(theta) = constant - 0.5 sum precision (theta - loc)^2``, NumPy ``[n]`` vectors over
    the flat state (``None``: all zeros for ``loc``, all ones for ``precision``; a precision of 0
    marks an entry no Gaussian factor covers)."""

    loc: Optional[np.ndarray]
    precision: Optional[np.ndarray]
    constant: float


def scale_adapted_sghmc(
    state: SamplerState, grad, z, *, step_size: float, momentum_decay: float, num_data, adapt: bool
) -> SamplerState:
    """One scale-adapted SGHMC step (module docs) of one variable: ``grad`` is the gradient of the
    per-point loss, ``z`` standard-normal noise of the variable's shape, ``num_data`` the ``N`` of
    the noise scale. With ``adapt=False`` the statistics are kept as they are."""
    theta, p, xi, g, g2 = state
    eps, alpha = step_size, momentum_decay
    minv = 1.0 / (tf.sqrt(g2 + 1e-16) + 1e-16)
    noise_var = 2.0 * (eps**2 / tf.cast(num_data, theta.dtype)) * alpha * minv
    p_new = p - eps**2 * minv * grad - alpha * p + tf.sqrt(tf.maximum(noise_var, 1e-16)) * z
    theta_new = theta + p_new
    if not adapt:
        return SamplerState(theta_new, p_new, xi, g, g2)
    r = 1.0 / (xi + 1.0)
    g_new = (1.0 - r) * g + r * grad
    g2_new = (1.0 - r) * g2 + r * tf.square(grad)
    xi_new = 1.0 + xi * (1.0 - g * g / (g2 + 1e-16))
    return SamplerState(theta_new, p_new, xi_new, g_new, g2_new)


def check_momentum_decay(value) -> float:
    """``value`` as a momentum decay ``alpha`` in ``(0, 1]``, or a ValueError naming
    ``momentum_decay``."""
    alpha = check_positive_float(value, "momentum_decay")
    if alpha > 1.0:
        raise ValueError(f"momentum_decay must be in (0, 1], got {value!r}")
    return alpha


def uniform_index(z: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
    """Uniform indices in ``0 .. count-1`` from standard-normal draws ``z`` (through the normal
    CDF, so seeded noise sources give them), int32, ``z``'s shape."""
    u = 0.5 * tf.math.erfc(-z / math.sqrt(2.0))
    k = tf.cast(count, z.dtype)
    idx = tf.cast(tf.floor(u * k), tf.int32)
    return tf.clip_by_value(idx, 0, tf.cast(count, tf.int32) - 1)


class SGHMCPosterior(DeepPosterior):
    """A chain and samples over every layer's whitened inducing outputs (module docs).

    :param layers: GP layers, each with ``inducing_inputs`` (k-means, as mean-field).
    :param step_size: ``eps`` (default 0.01, Havasi et al.'s code).
    :param momentum_decay: ``alpha`` in ``(0, 1]`` (default 0.05).
    :param window_size: states kept for the hyperparameter steps (default 100).
    :param chain_steps: chain steps per hyperparameter step (default 1; each ``fit`` step is one
        chain step on its own minibatch, and every ``chain_steps``-th also enters the window and
        takes the Adam step: :func:`chain_step_roles`). Rossi et al.'s schedule is
        ``ROSSI_CHAIN_STEPS = 21``.
    """

    options = ("step_size", "momentum_decay", "window_size", "chain_steps")
    summary = "SGHMC samples of the inducing outputs (Havasi et al. 2018)"
    positive_transform = "exp"

    @classmethod
    def initial_inducing_inputs(cls, X, num_inducing, seed):
        """The inducing inputs of mean-field DSVI: ``num_inducing`` k-means centres of ``X``. The
        chain itself starts where the reference code starts it (:meth:`from_data`, the default:
        every layer's whitened inducing outputs 0, zero momenta, adaptation statistics 1)."""
        return kmeans_inducing_inputs(X, num_inducing, seed)

    #: ``fit`` trains a sampler's hyperparameters with :class:`~deepgp_gi.training.step.SamplerStep`
    is_sampler = True
    #: :func:`~deepgp_gi.parameter_count` counts the state of one sample, ``sum_l M D_l``
    _COUNTED_ATTRIBUTES = ("inducing_outputs",)

    def __init__(
        self,
        layers: Sequence,
        step_size: float = STEP_SIZE,
        momentum_decay: float = MOMENTUM_DECAY,
        window_size: int = WINDOW_SIZE,
        chain_steps: int = CHAIN_STEPS,
        name: Optional[str] = None,
    ):
        super().__init__(layers, name=name)
        require_local_inducing(self)
        self.step_size = check_positive_float(step_size, "step_size")
        self.momentum_decay = check_momentum_decay(momentum_decay)
        self.window_size = check_positive_int(window_size, "window_size")
        self.chain_steps = check_positive_int(chain_steps, "chain_steps")
        dtype = gpflow.default_float()
        shapes = [[layer.num_inducing, layer.output_dim] for layer in self.layers]
        self.inducing_outputs = [
            tf.Variable(tf.zeros(s, dtype), trainable=False, name=f"V_{l}")
            for l, s in enumerate(shapes)
        ]
        self._build_chain_state(dtype)

    def _build_chain_state(self, dtype) -> None:
        """Momenta and adaptation statistics (one flat vector each over every chain variable of
        :meth:`chain_variables`, in its order: the update runs once over all of them), and the
        window and sample store (one per chain variable), as non-trainable variables."""

        def state(value, shapes, name):
            return [
                tf.Variable(
                    tf.fill(s, tf.constant(value, dtype)), trainable=False, name=f"{name}_{k}"
                )
                for k, s in enumerate(shapes)
            ]

        shapes = [v.shape.as_list() for v in self.chain_variables()]
        flat = [[sum(v.shape.num_elements() for v in self.chain_variables())]]
        self.momenta = state(0.0, flat, "momentum")
        self.adaptation_window = state(1.0, flat, "xi")
        self.gradient_mean = state(1.0, flat, "g")
        self.gradient_square = state(1.0, flat, "g2")
        self.window = state(0.0, [[self.window_size] + s for s in shapes], "window")
        self.window_count = tf.Variable(0, dtype=tf.int64, trainable=False, name="window_count")
        self.samples = [
            tf.Variable(
                tf.zeros([0] + s, dtype), trainable=False, shape=[None] + s, name=f"samples_{k}"
            )
            for k, s in enumerate(shapes)
        ]

    # ------------------------------------------------------------------ the state
    def chain_variables(self) -> List[tf.Variable]:
        """The variables the chain moves, in the order of every per-variable list of the state
        (momenta, statistics, window, samples): here every layer's ``V_l``. A subclass that samples
        more (:class:`~deepgp_gi.posteriors.bsgp.BSGPPosterior`) appends its variables."""
        return list(self.inducing_outputs)

    def chain_moves(self) -> List[bool]:
        """Whether each chain variable is moved by :meth:`sghmc_step` (every ``V_l`` always is)."""
        return [True] * len(self.chain_variables())

    def sampler_variables(self) -> List[tf.Variable]:
        """Every variable of the chain and its samples (never an optimiser's)."""
        return (
            self.chain_variables()
            + list(self.momenta)
            + list(self.adaptation_window)
            + list(self.gradient_mean)
            + list(self.gradient_square)
            + list(self.window)
            + [self.window_count]
            + list(self.samples)
        )

    @property
    def dtype(self) -> tf.DType:
        return self.inducing_outputs[0].dtype

    @property
    def num_stored(self) -> int:
        """How many samples :func:`~deepgp_gi.collect_samples` stored (0 before)."""
        return int(tf.shape(self.samples[0])[0])

    def window_filled(self) -> tf.Tensor:
        """How many window slots hold a state, ``min(count, window_size)`` (int32)."""
        return tf.cast(tf.minimum(self.window_count, self.window_size), tf.int32)

    def push_window(self, values: Optional[Sequence[tf.Tensor]] = None) -> None:
        """Store the chain's current state in the window (a ring buffer of the last states):
        ``values`` (one per chain variable, the state just assigned: saves reading it back), or
        the chain variables."""
        values = self.chain_variables() if values is None else values
        slot = tf.cast(self.window_count % self.window_size, tf.int32)
        for W, V in zip(self.window, values):
            W.scatter_nd_update([[slot]], tf.expand_dims(V, 0))
        self.window_count.assign_add(1)

    def window_member(self, z: tf.Tensor) -> List[tf.Tensor]:
        """The window member that the standard-normal draw ``z`` (a scalar) picks uniformly among
        the filled slots, one value per chain variable (``[M, D_l]`` per layer for SGHMC)."""
        i = uniform_index(z, self.window_filled())
        return [tf.gather(W, i) for W in self.window]

    def store_samples(self, samples: Sequence) -> None:
        """Keep ``samples`` (one ``[S, ...]`` per chain variable; SGHMC: ``[S, M, D_l]`` per layer)
        as the sample set predictions use."""
        for var, value in zip(self.samples, samples):
            var.assign(tf.cast(value, var.dtype))

    def clear_samples(self) -> None:
        """Forget the stored samples (predictions then use the window)."""
        for var in self.samples:
            var.assign(tf.zeros([0] + var.shape[1:].as_list(), var.dtype))

    def sample_set(self) -> List[tf.Tensor]:
        """What predictions mix over, one ``[K, ...]`` tensor per chain variable: the stored
        samples, or (before :func:`~deepgp_gi.collect_samples`) the filled window, or the current
        state."""
        if self.num_stored:
            return [tf.convert_to_tensor(s) for s in self.samples]
        filled = int(self.window_filled().numpy()) if tf.executing_eagerly() else None
        if filled:
            return [W[:filled] for W in self.window]
        return [V[None] for V in self.chain_variables()]

    def flat_state(self, values: Sequence) -> tf.Tensor:
        """The chain state ``values`` (one per chain variable, :meth:`chain_variables`' order, no
        sample axis) flattened and concatenated, ``[n]``: the layout of the momenta and
        statistics."""
        return tf.concat([tf.reshape(v, [-1]) for v in values], axis=0)

    def sghmc_step(self, grads: Sequence[tf.Tensor], noise, num_data, adapt: bool) -> None:
        """Move the chain one scale-adapted SGHMC step (:func:`scale_adapted_sghmc`) with the
        per-point-loss gradients ``grads`` (one per chain variable), and push the new state into
        the window (:meth:`sghmc_move` on the flattened variables and gradients)."""
        self.sghmc_move(
            self.flat_state(self.chain_variables()), self.flat_state(grads), noise, num_data, adapt
        )

    def sghmc_move(
        self,
        theta: tf.Tensor,
        grad: tf.Tensor,
        noise,
        num_data,
        adapt: bool,
        push: bool = True,
        step_size: Optional[float] = None,
        momentum_decay: Optional[float] = None,
    ) -> None:
        """:meth:`sghmc_step` on the flat state ``theta`` ``[n]`` (the chain variables' current
        values, :meth:`flat_state`) and its flat per-point-loss gradient ``grad`` ``[n]``. The
        update runs once over every chain variable, with one draw ``"sghmc/move"`` of length ``n``
        from ``noise``; the new values are assigned and pushed into the window as computed (not read
        back; ``push=False``: not pushed). A variable that :meth:`chain_moves` marks as held keeps
        its value and statistics. ``step_size`` and ``momentum_decay`` replace the posterior's own
        for this move (``None``: the posterior's)."""
        variables, moves = self.chain_variables(), self.chain_moves()
        sizes = [v.shape.num_elements() for v in variables]
        state = SamplerState(
            theta,
            *(
                tf.convert_to_tensor(s[0])
                for s in (
                    self.momenta,
                    self.adaptation_window,
                    self.gradient_mean,
                    self.gradient_square,
                )
            ),
        )
        z = noise.normal("sghmc/move", [sum(sizes)], self.dtype)
        new = scale_adapted_sghmc(
            state,
            grad,
            z,
            step_size=self.step_size if step_size is None else step_size,
            momentum_decay=self.momentum_decay if momentum_decay is None else momentum_decay,
            num_data=num_data,
            adapt=adapt,
        )
        if not all(moves):
            held = tf.constant([not m for m, n in zip(moves, sizes) for _ in range(n)])
            new = SamplerState(*(tf.where(held, old, value) for old, value in zip(state, new)))
        values = [
            tf.reshape(value, v.shape) for v, value in zip(variables, tf.split(new.theta, sizes))
        ]
        for theta_var, value, moving in zip(variables, values, moves):
            if moving:
                theta_var.assign(value)
        self.momenta[0].assign(new.p)
        if adapt:
            self.adaptation_window[0].assign(new.xi)
            self.gradient_mean[0].assign(new.g)
            self.gradient_square[0].assign(new.g2)
        if push:
            self.push_window(values)

    def flat_gaussian_prior(self) -> FlatGaussianPrior:
        """The prior's Gaussian factors over the flat state: SGHMC's ``N(0, I)`` on every
        ``V_l``."""
        n = sum(v.shape.num_elements() for v in self.chain_variables())
        return FlatGaussianPrior(None, None, -0.5 * n * math.log(2.0 * math.pi))

    def gaussian_log_prior(self, theta: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(log p_G(theta), precision (theta - loc))`` of the flat state ``theta`` ``[n]``
        (:meth:`flat_gaussian_prior`): the Gaussian factors' log density (a scalar) and minus its
        gradient ``[n]``, in closed form (a sampler step adds it to the likelihood's gradient
        instead of differentiating the factors layer by layer)."""
        loc, precision, constant = self.flat_gaussian_prior()
        d = theta if loc is None else theta - tf.constant(loc, theta.dtype)
        r = d if precision is None else d * tf.constant(precision, theta.dtype)
        return constant - 0.5 * tf.reduce_sum(d * r), r

    # ------------------------------------------------------------------ densities and propagation
    def log_prior(self, V: Sequence[tf.Tensor]) -> tf.Tensor:
        """``log p(V) = sum_l log N(V_l | 0, I)``: a scalar for ``[M, D_l]`` values, ``[S]`` for
        per-sample ``[S, M, D_l]`` values."""
        terms = []
        for v in V:
            v = tf.convert_to_tensor(v)
            size = float(v.shape[-1] * v.shape[-2])
            terms.append(
                -0.5 * tf.reduce_sum(tf.square(v), axis=[-2, -1])
                - 0.5 * size * math.log(2.0 * math.pi)
            )
        return tf.add_n(terms)

    def fixed_terms(self, X, num_samples: int = 1) -> Optional[FixedTerms]:
        """The terms of :meth:`propagate_given` on ``X`` that do not depend on ``V``
        (:class:`FixedTerms`: the ``K_uu`` factors and the first layer's projection of ``X``), for a
        caller that passes several ``V`` through the same layers (a sampler step's chain and
        hyperparameter passes); ``None`` where the chain moves them too (BSGP)."""
        _, F = self._start(X, num_samples, None)
        choleskies, inverses = (list(t) for t in zip(*inducing_factors(self.layers)))
        return FixedTerms(choleskies, self._projection(0, F, choleskies[0], inverses[0]), inverses)

    def _projection(
        self, l: int, F: tf.Tensor, L_K: tf.Tensor, inverse: Optional[tf.Tensor] = None
    ) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Layer ``l``'s
        ``(A = L_K^{-1} K(Z, F) [S, M, N], m(F) [S, N, D], k(f, f) - |A|^2 [S, N])`` (``inverse``:
        ``L_K^{-1}``, for a gradient without solves)."""
        layer = self.layers[l]
        A = whitened_projection(L_K, layer.K(layer.Z, F), inverse=inverse)
        return A, layer.mean(F), residual_variance(layer, F, A)

    def propagate_given(
        self,
        X,
        V: Sequence[tf.Tensor],
        num_samples: int = 1,
        seed=None,
        fixed: Optional[FixedTerms] = None,
        gaussian_prior: bool = True,
    ) -> Propagation:
        """Push ``X`` through the layers with the inducing outputs ``V`` (one ``[M, D_l]`` shared
        by the samples, or ``[S, M, D_l]`` per sample, per layer): hidden layers sampled (noise
        ``"f/{l}"``), the last layer's conditional marginals returned with a sample; ``kl`` is
        ``-log p(V)`` per sample. ``fixed``: :meth:`fixed_terms` of the same ``X`` and
        ``num_samples``, computed once for several passes. ``gaussian_prior=False`` leaves the
        prior's Gaussian factors (:meth:`flat_gaussian_prior`, here all of it) out of ``kl``."""
        source, F = self._start(X, num_samples, seed)
        if fixed is None:
            choleskies, inverses = (list(t) for t in zip(*inducing_factors(self.layers)))
        else:
            choleskies, inverses = fixed.choleskies, fixed.inverses or [None] * self.depth

        def projection(l, F):
            if l == 0 and fixed is not None:
                return fixed.first
            return self._projection(l, F, choleskies[l], inverses[l])

        samples, mean, var = self.pass_through_layers(F, V, projection, source)
        if gaussian_prior:
            kl = tf.broadcast_to(-self.log_prior(V), [num_samples])
        else:
            kl = tf.zeros([num_samples], mean.dtype)
        return Propagation(samples=samples, mean=mean, var=var, kl=kl)

    def pass_through_layers(
        self, F: tf.Tensor, V: Sequence[tf.Tensor], projection, source
    ) -> Tuple[List[tf.Tensor], tf.Tensor, tf.Tensor]:
        """The layers' pass from the inputs ``F`` ``[S, N, D_in]`` with inducing outputs ``V``:
        ``projection(l, F)`` gives layer ``l``'s ``(A [S, M, N], m(F) [S, N, D], k(f, f) - |A|^2
        [S, N])``; the hidden layers' outputs are sampled (noise ``"f/{l}"``), the last layer's
        sample drawn from its marginals. Returns ``(samples, mean, var)``, the last two
        ``[S, N, D_L]``."""
        jitter = gpflow.config.default_jitter()
        samples = []
        for l in range(self.depth):
            A, prior_mean, resid = projection(l, F)
            mean = conditional_mean(A, V[l], prior_mean)
            var = tf.broadcast_to(tf.expand_dims(resid, -1), tf.shape(mean))
            if l < self.depth - 1:
                F = sample_rows(
                    mean, var, source.normal(f"f/{l}", tf.shape(mean), mean.dtype), jitter
                )
                samples.append(F)
        var = tf.maximum(var, 0.0)
        samples.append(self.sample_last_layer(mean, var, source))
        return samples, mean, var

    def _drawn_members(self, num_samples: int, source) -> List[tf.Tensor]:
        """``S`` uniform draws from the sample set (stored samples, else the filled window, else the
        current state), one ``[S, ...]`` per chain variable; branch-free (no ``tf.cond``), so a
        traced step holds no host-synchronising op."""
        stored = tf.shape(self.samples[0])[0]
        filled = self.window_filled()
        cap = tf.shape(self.window[0])[0]
        start = tf.where(stored > 0, 0, tf.where(filled > 0, stored, stored + cap))
        count = tf.where(stored > 0, stored, tf.where(filled > 0, filled, 1))
        z = source.normal("sghmc/index", [num_samples], self.dtype)
        idx = start + uniform_index(z, count)
        # the members are data to a prediction: no gradient flows back into the chain (BSGP's chain
        # holds trainable GPflow variables; a gradient through the gather would also add a Where op)
        return [
            tf.stop_gradient(
                tf.gather(
                    tf.concat(
                        [tf.convert_to_tensor(s), tf.convert_to_tensor(W), tf.expand_dims(V, 0)],
                        axis=0,
                    ),
                    idx,
                )
            )
            for s, W, V in zip(self.samples, self.window, self.chain_variables())
        ]

    @inherit_check_shapes
    def propagate(self, X, num_samples=1, seed=None) -> Propagation:
        from ..noise import as_noise_source

        source = as_noise_source(seed)
        return self.propagate_given(
            X, self._drawn_members(num_samples, source), num_samples, source
        )
