"""The compiled training step.

:class:`TrainStep` is one Adam step on ``-(ELBO + log prior)`` for a minibatch, compiled once
with ``tf.function`` (and XLA with ``jit_compile=True``). It also watches every
:func:`~deepgp_gi.linalg.safe_cholesky` traced in the step through
:func:`~deepgp_gi.linalg.cholesky_checks`: the first failing step and its message code are kept
in two variables on the device (branch-free, no host round-trip per step), and
:meth:`TrainStep.raise_if_failed` turns them into a :class:`~deepgp_gi.linalg.CholeskyError`
when the loop next reads results anyway (before logging or checkpointing).

The parts the other steps change are separate methods: :meth:`TrainStep.objective` (the loss and
the ELBO it reports) and :meth:`TrainStep.update` (how the gradients are applied);
:class:`NaturalGradientStep`, :class:`SamplerStep` and :class:`DistributedStep` (a
``tf.distribute`` strategy, with or without natural gradients and XLA) replace the step itself.

Every step takes the KL weight ``beta`` (:mod:`.tempering`) as a scalar tensor argument of the
model's dtype, so a schedule that changes it every step never retraces the compiled function
(plain or XLA). The loss is ``-(mean_s[ell_s - beta * kl_s] + log prior)``; the ELBO returned is
``mean_s[ell_s - kl_s]`` from the same draws, whatever ``beta`` is. With ``beta = 1`` the loss
is the one without tempering to the last bit.
"""

from __future__ import annotations

import contextlib
from typing import Sequence

import tensorflow as tf

from ..linalg import cholesky_checks, raise_if_failed
from ..noise import NoiseSource
from .batches import step_noise
from .collectives import separate_collective_keys

__all__ = ["TrainStep", "NaturalGradientStep", "DistributedStep", "SamplerStep", "tempered_loss"]


def tempered_loss(ell, kl, kl_weight, log_prior):
    """``(loss, elbo)`` from the ELBO's terms per joint sample (``ell [S]``, ``kl [S]``): the loss
    ``-(mean_s[ell_s - kl_weight * kl_s] + log_prior)`` and the untempered
    ``mean_s[ell_s - kl_s]``."""
    elbo = tf.reduce_mean(ell - kl)
    tempered = tf.reduce_mean(ell - kl_weight * kl)
    return -(tempered + log_prior), elbo


class TrainStep:
    """One optimisation step; call it with ``(step, X_b, Y_b)`` and optionally the KL weight
    ``kl_weight`` (default 1: no tempering); it returns the (untempered) ELBO estimate.

    ``importance_samples``: K of a latent-variable model's importance-weighted bound
    (:class:`~deepgp_gi.latent.LatentDeepGP`), passed to its ``elbo_terms``; ``None`` for a plain
    model. ``objective``: ``"elbo"`` (default) or ``"predictive"``, passed to ``elbo_terms`` (the
    step then returns the predictive objective where it would return the ELBO)."""

    def __init__(
        self,
        model,
        optimizer,
        variables: Sequence[tf.Variable],
        step_counter: tf.Variable,
        *,
        num_samples: int,
        seed: int,
        importance_samples=None,
        objective: str = "elbo",
        jit_compile: bool = False,
    ):
        self.model = model
        # read once: the model's dtype property walks its module tree, which per call would cost
        # more than some whole compiled steps
        self.dtype = model.dtype
        self._unit_kl_weight = tf.constant(1.0, self.dtype)
        self.optimizer = optimizer
        self.variables = list(variables)
        self.step_counter = step_counter
        self.num_samples = num_samples
        self.seed = seed
        self.elbo_options = (
            {} if importance_samples is None else {"importance_samples": importance_samples}
        )
        if objective != "elbo":
            self.elbo_options["objective"] = objective
        self.jit_compile = jit_compile
        # int64, not int32: TensorFlow keeps int32 variables in host memory on a GPU, which an
        # XLA-compiled step on the GPU cannot read (fit(jit_compile=True) failed there)
        self.failure_code = tf.Variable(0, dtype=tf.int64, trainable=False, name="cholesky_failure")
        self.failure_step = tf.Variable(
            -1, dtype=tf.int64, trainable=False, name="cholesky_failure_step"
        )
        # Traced per batch shape in both modes (at most two: full batches and an epoch's smaller
        # last batch). XLA compiles one program per concrete shape anyway; in the plain graph a
        # static batch size lets the shape arithmetic of every broadcast's gradient fold at trace
        # time, so fewer ops run per step (docs/performance.md). Static shapes also keep gradients
        # such as set_diag's from building zeros of a run-time-rank shape, which XLA cannot
        # compile.
        # autograph off: the step has no Python control flow on tensor values (and traces faster)
        self._compiled = tf.function(self._step, autograph=False, jit_compile=jit_compile)

    def __call__(self, step, X_b, Y_b, kl_weight=None) -> tf.Tensor:
        return self._compiled(step, X_b, Y_b, self.kl_weight_tensor(kl_weight))

    def kl_weight_tensor(self, kl_weight=None) -> tf.Tensor:
        """``kl_weight`` (``None`` means 1) as a scalar tensor of the model's dtype: a Python
        float handed to the compiled step would retrace it for every new value."""
        if kl_weight is None:
            return self._unit_kl_weight
        return tf.convert_to_tensor(kl_weight, self.dtype)

    def objective(self, step, X_b, Y_b, kl_weight=1.0):
        """``(loss, elbo)`` for one minibatch with step ``step``'s noise: the loss is
        ``-(mean_s[ell_s - kl_weight * kl_s] + log prior)``, the ELBO ``mean_s[ell_s - kl_s]``."""
        # the noise source is the third positional argument (the keyword is seed=)
        ell, kl = self.model.elbo_terms(
            (X_b, Y_b), self.num_samples, step_noise(self.seed, step), **self.elbo_options
        )
        return tempered_loss(ell, kl, kl_weight, self.model.log_prior_density())

    def loss_and_gradients(self, step, X_b, Y_b, kl_weight=None):
        """The ELBO and the loss gradients of one step (KL weight ``kl_weight``, default 1),
        without an update."""
        kl_weight = self.kl_weight_tensor(kl_weight)
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(self.variables)
            loss, elbo = self.objective(step, X_b, Y_b, kl_weight)
        return elbo, tape.gradient(loss, self.variables)

    def update(self, grads) -> None:
        """Apply the gradients (Adam)."""
        self.optimizer.apply_gradients(zip(grads, self.variables))

    def _step(self, step, X_b, Y_b, kl_weight):
        with cholesky_checks() as checks:
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(self.variables)
                loss, elbo = self.objective(step, X_b, Y_b, kl_weight)
            grads = tape.gradient(loss, self.variables)
        status = checks.status()
        self.update(grads)
        self.finish_step(step, status)
        return elbo

    def finish_step(self, step, status) -> None:
        """Count step ``step`` as done and keep the first failure: ``status`` is the step's
        :func:`~deepgp_gi.linalg.cholesky_checks` code (0: every factorisation succeeded)."""
        self.step_counter.assign(step + 1)
        status = tf.cast(status, tf.int64)
        first = tf.logical_and(tf.equal(self.failure_code, 0), tf.not_equal(status, 0))
        self.failure_step.assign(tf.where(first, step, self.failure_step))
        self.failure_code.assign(tf.where(first, status, self.failure_code))

    def reset_failures(self) -> None:
        """Forget the failures recorded so far (the state a new step starts in)."""
        self.failure_code.assign(0)
        self.failure_step.assign(-1)

    def raise_if_failed(self) -> None:
        """Raise :class:`~deepgp_gi.linalg.CholeskyError` if a factorisation failed in any step
        so far (reads two scalars from the device)."""
        code = int(self.failure_code.numpy())
        if code:
            step = int(self.failure_step.numpy()) + 1
            raise_if_failed(code, context=f"first failed in training step {step}")


class NaturalGradientStep(TrainStep):
    """One step that updates the posterior's Gaussian blocks by natural gradients and every other
    variable by Adam, from one gradient of the same loss (GPflow's ``NaturalGradient`` convention).
    With a KL weight ``beta`` the loss is the tempered one. For a conjugate block the update is
    ``theta <- theta + gamma * (lambda_lik - beta * (theta - theta_prior))`` in natural
    parameters: its fixed point is the maximiser of ``ell - beta * KL``, reached in one step by
    ``gamma = 1 / beta`` (``gamma = 1`` shrinks the distance to it by ``1 - beta``).

    :param natgrad_blocks: ``(q_mu [M, P], q_sqrt [P, M, M])`` Parameter pairs
        (:meth:`~deepgp_gi.posteriors.DeepPosterior.natural_gradient_blocks`).
    :param gamma: the natural-gradient step size (1 reaches the optimal Gaussian of a conjugate
        model in one step).
    """

    def __init__(
        self, model, optimizer, variables, step_counter, *, natgrad_blocks, gamma, **kwargs
    ):
        import gpflow

        self.blocks = list(natgrad_blocks)
        self.natgrad = gpflow.optimizers.NaturalGradient(gamma)
        super().__init__(model, optimizer, variables, step_counter, **kwargs)

    def _step(self, step, X_b, Y_b, kl_weight):
        block_vars = block_variables(self.blocks)
        with cholesky_checks() as checks:
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(self.variables + block_vars)
                loss, elbo = self.objective(step, X_b, Y_b, kl_weight)
            grads = tape.gradient(loss, self.variables + block_vars)
        status = checks.status()
        n = len(self.variables)
        if n:
            self.update(grads[:n])
        apply_natural_gradients(self.natgrad, self.blocks, grads[n:])
        self.finish_step(step, status)
        return elbo


def block_variables(blocks) -> list:
    """The unconstrained variables of ``(q_mu, q_sqrt)`` blocks, two per block in block order."""
    return [
        v
        for q_mu, q_sqrt in blocks
        for v in (q_mu.unconstrained_variable, q_sqrt.unconstrained_variable)
    ]


def apply_natural_gradients(natgrad, blocks, grads) -> None:
    """One natural-gradient step of each ``(q_mu, q_sqrt)`` block from the loss gradients of its
    unconstrained variables (``grads``: two per block, ordered as :func:`block_variables`)."""
    for k, (q_mu, q_sqrt) in enumerate(blocks):
        g_mu, g_sqrt = grads[2 * k], grads[2 * k + 1]
        if hasattr(q_mu, "natgrad_gradient"):  # a reshaped view (fully-coupled q(f_M))
            g_mu, g_sqrt = q_mu.natgrad_gradient(g_mu), q_sqrt.natgrad_gradient(g_sqrt)
        natgrad._natgrad_apply_gradients(g_mu, g_sqrt, q_mu, q_sqrt)


class _Renamed(NoiseSource):
    """A view of a noise source whose draws are ``source``'s under ``prefix + name``: a sampler
    step's two halves draw from one :class:`~deepgp_gi.noise.SeededNoise` (one key per step)
    under distinct names."""

    def __init__(self, source: NoiseSource, prefix: str):
        self.source, self.prefix = source, prefix

    def normal(self, name, shape, dtype):
        return self.source.normal(self.prefix + name, shape, dtype)

    def gamma(self, name, shape, alpha, dtype):
        return self.source.gamma(self.prefix + name, shape, alpha, dtype)


class SamplerStep(TrainStep):
    """One step of a sampling family (``posterior="sghmc"``; Havasi et al. 2018's moving-window
    MCEM): one scale-adapted SGHMC step of every layer's inducing outputs ``V``, then one Adam step
    on the hyperparameters (kernels, likelihood, inducing inputs, mean functions) with ``V`` set
    to a uniformly drawn member of the window of the last states.

    The target is the log joint ``log p(V) + (N / B) sum_batch log p(y | V)``
    (:meth:`log_joint_terms`); the chain moves on the gradient of its per-point form (the update
    and its temperature: :mod:`deepgp_gi.posteriors.sghmc`), the Adam step on
    ``-(log joint + log prior of the hyperparameters)``. The step returns the log joint estimate
    of the chain's state before its move (full-data units: ``fit``'s ``history.elbo`` records it,
    ``history.elbo_per_datapoint`` per data point).

    How the step saves work (the values are those of the plain formulation): the chain state is
    read once, and the gradient of the prior's Gaussian factors is added in closed form on the
    flat state (:meth:`~deepgp_gi.posteriors.sghmc.SGHMCPosterior.gaussian_log_prior`) rather than
    differentiated layer by layer; where the chain does not move the kernels (SGHMC), the two
    passes share one read of every kernel parameter and the terms that do not depend on ``V``
    (:meth:`~deepgp_gi.posteriors.sghmc.SGHMCPosterior.fixed_terms`: the ``K_uu`` factors and the
    first layer's projection of the batch), computed under the hyperparameters' tape.

    Draws: step ``t``'s noise source (:func:`~.batches.step_noise`, or ``stream``'s) serves both
    halves under distinct names: ``"chain/..."`` for the chain's move (its hidden-layer draws and
    the momentum noise ``"chain/sghmc/move"``), ``"hyper/..."`` for the hyperparameter step (its
    hidden-layer draws and the window member, ``"hyper/sghmc/window"``); every draw is stateless
    in ``(seed, t)``.

    Iterations of several chain steps (the posterior's ``chain_steps``): step ``t`` is one chain
    step on its own minibatch; whether it adapts the statistics and whether it ends the iteration
    (window entry and hyperparameter step) follow
    :func:`~deepgp_gi.posteriors.sghmc.chain_step_roles` of ``t``, one compiled function per role.

    :param optimizer: Adam on ``variables``, or ``None``: no hyperparameter step (sample
        collection).
    :param adapt: adapt the preconditioner and friction statistics (burn-in: ``fit``) or keep them
        (``collect_samples``).
    :param stream: ``None`` for ``fit``'s noise stream; an int selects another stream of ``seed``.
    :param step_size: the chain's ``eps`` for these steps (``None``: the posterior's).
    :param momentum_decay: the chain's ``alpha`` for these steps (``None``: the posterior's).
    """

    def __init__(
        self,
        model,
        optimizer,
        variables,
        step_counter,
        *,
        adapt: bool = True,
        stream=None,
        step_size=None,
        momentum_decay=None,
        **kwargs,
    ):
        self.adapt = bool(adapt)
        self.stream = stream
        self.move_options = dict(step_size=step_size, momentum_decay=momentum_decay)
        super().__init__(model, optimizer, variables, step_counter, **kwargs)
        self.chain_steps = int(getattr(model.posterior, "chain_steps", 1))
        self._by_role = {}

    def roles(self, step):
        """``(adapt, hyper)`` of step ``step`` (a Python or host tensor integer): whether it adapts
        the statistics and whether it ends an iteration (window entry and, when there is an
        optimizer, the hyperparameter step)."""
        from ..posteriors.sghmc import chain_step_roles

        if self.chain_steps == 1:
            return self.adapt, True
        adapts, ends = chain_step_roles(int(step), self.chain_steps)
        return self.adapt and adapts, ends

    def __call__(self, step, X_b, Y_b, kl_weight=None) -> tf.Tensor:
        if self.chain_steps == 1:
            return super().__call__(step, X_b, Y_b, kl_weight)
        role = self.roles(step)
        if role not in self._by_role:
            adapt, ends = role
            self._by_role[role] = tf.function(
                lambda t, X, Y, w: self._step(t, X, Y, w, adapt=adapt, ends=ends),
                autograph=False,
                jit_compile=self.jit_compile,
            )
        return self._by_role[role](step, X_b, Y_b, self.kl_weight_tensor(kl_weight))

    def step_sources(self, step):
        """``(chain noise, hyperparameter noise)`` of step ``step``: two name spaces of one
        source."""
        from ..noise import SeededNoise

        if self.stream is None:
            source = step_noise(self.seed, step)
        else:
            stream = tf.constant([self.seed, self.stream], tf.int64)
            seed = tf.random.experimental.stateless_fold_in(
                stream, tf.cast(step, tf.int64), alg="philox"
            )
            source = SeededNoise(seed)
        return _Renamed(source, "chain/"), _Renamed(source, "hyper/")

    def log_joint_terms(self, X_b, Y_b, V, noise, fixed=None, gaussian_prior=True):
        """``(log-likelihood [S], -log p(V) [S])`` of the minibatch for the chain state ``V`` (one
        value per chain variable: ``[M, D_l]`` per layer for SGHMC; BSGP's also holds the inducing
        inputs and kernel hyperparameters, and its ``-log p`` their priors): the log-likelihood is
        ``(N / B) sum_batch log p(y | V)`` with the last layer's ``f`` integrated out
        (the model's :meth:`~deepgp_gi.DeepGP.sample_log_density`)
        and the hidden layers sampled. ``fixed`` and ``gaussian_prior``: as the posterior's
        ``propagate_given`` (without the Gaussian factors, ``-log p`` is what is left of it)."""
        from ..kernels import shared_parameter_reads

        X, Y = self.model.check_data((X_b, Y_b))
        with shared_parameter_reads():  # each kernel parameter read once per pass
            prop = self.model.posterior.propagate_given(
                X, V, self.num_samples, noise, fixed=fixed, gaussian_prior=gaussian_prior
            )
        ll = tf.reduce_sum(self.model.sample_log_density(X, Y, prop), axis=-1)
        batch = tf.cast(tf.shape(X)[0], ll.dtype)
        return ll * (self.num_data(X) / batch), prop.kl

    def num_data(self, X) -> tf.Tensor:
        """``N``: ``model.num_data``, or the batch's rows when it is not set (full batches)."""
        if self.model.num_data is not None:
            return tf.constant(float(self.model.num_data), self.dtype)
        return tf.cast(tf.shape(X)[0], self.dtype)

    def objective(self, step, X_b, Y_b, kl_weight=1.0):
        """``(loss, log joint)`` of the hyperparameter step with the chain's current state."""
        ll, neg_log_prior = self.log_joint_terms(
            X_b, Y_b, self.model.posterior.chain_variables(), self.step_sources(step)[1]
        )
        return tempered_loss(ll, neg_log_prior, 1.0, self.model.log_prior_density())

    def _step(self, step, X_b, Y_b, kl_weight, adapt=None, ends=True):
        from ..kernels import shared_parameter_reads

        posterior = self.model.posterior
        chain_noise, hyper_noise = self.step_sources(step)
        N = self.num_data(X_b)
        X, _ = self.model.check_data((X_b, Y_b))
        adapt = self.adapt if adapt is None else adapt
        hyper = self.optimizer is not None and ends
        with contextlib.ExitStack() as stack:
            checks = stack.enter_context(cholesky_checks())
            if hyper:  # records the terms the two passes share, and the hyperparameter pass
                hyper_tape = stack.enter_context(tf.GradientTape(watch_accessed_variables=False))
                hyper_tape.watch(self.variables)
            reads = stack.enter_context(contextlib.ExitStack())
            reads.enter_context(shared_parameter_reads())  # each kernel parameter read once
            fixed = posterior.fixed_terms(X, self.num_samples)
            state = [tf.convert_to_tensor(v) for v in posterior.chain_variables()]  # read once
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(state)
                ll, neg_log_prior = self.log_joint_terms(
                    X_b, Y_b, state, chain_noise, fixed, gaussian_prior=False
                )
                log_likelihood = tf.reduce_mean(
                    ll - neg_log_prior
                )  # and the prior's non-Gaussian factors
                per_point_loss = -log_likelihood / N
            grads = tape.gradient(
                per_point_loss, state, unconnected_gradients=tf.UnconnectedGradients.ZERO
            )
            theta = posterior.flat_state(state)
            log_prior, neg_prior_grad = posterior.gaussian_log_prior(theta)
            log_joint = log_likelihood + log_prior
            if fixed is None:  # the move assigns what the block may have read (BSGP's kernels)
                reads.close()
            posterior.sghmc_move(
                theta,
                posterior.flat_state(grads) + neg_prior_grad / N,
                chain_noise,
                N,
                adapt,
                push=ends,
                **self.move_options,
            )
            if hyper:
                member = posterior.window_member(hyper_noise.normal("sghmc/window", [], self.dtype))
                # the prior of the member's state does not depend on the hyperparameters
                ll_h, nlp_h = self.log_joint_terms(
                    X_b, Y_b, member, hyper_noise, fixed, gaussian_prior=False
                )
                loss, _ = tempered_loss(ll_h, nlp_h, 1.0, self.model.log_prior_density())
        if hyper:
            hyper_grads = hyper_tape.gradient(loss, self.variables)
        status = checks.status()
        if hyper and self.variables:
            self.update(hyper_grads)
        self.finish_step(step, status)
        return log_joint


class DistributedStep(TrainStep):
    """One data-parallel step under a ``tf.distribute`` strategy (build the model and call ``fit``
    inside ``strategy.scope()``).

    The batch is split into contiguous row blocks, one per replica. Replica ``r`` propagates its
    rows with :class:`~deepgp_gi.noise.RowSlice` noise (its rows of the data-row draws, the whole
    batch's inducing and weight draws), and its share of the loss is its expected log-likelihood
    rescaled by ``num_data / batch`` minus ``1/R`` of the KL and of the log prior; the optimiser
    sums the replicas' gradients (an all-reduce), so a step equals one device's step on the whole
    batch up to summation order. With a KL weight ``beta`` each replica's loss subtracts
    ``beta / R`` of the KL instead, and its reported share of the ELBO stays untempered.

    ``natgrad_blocks`` and ``gamma`` (as :class:`NaturalGradientStep`'s): the replicas' gradients
    of the blocks are summed in one all-reduce, and each replica applies the natural-gradient
    update of the sum to its own copy of the blocks, as the optimiser applies Adam's update of the
    summed gradients to each copy of the other variables (the same inputs and operations in every
    replica, so the copies stay equal).

    ``jit_compile=True`` compiles each replica's loss and gradients with XLA (one program per
    replica and batch shape); the all-reduces and the updates around them run in the plain step
    (on CPUs a strategy's all-reduce cannot run inside an XLA program).

    The strategy's collective keys are moved past those of every strategy stepped before
    (:func:`~.collectives.separate_collective_keys`), so several strategies train in one process.
    """

    def __init__(
        self,
        model,
        optimizer,
        variables,
        step_counter,
        *,
        strategy,
        natgrad_blocks=(),
        gamma=None,
        **kwargs,
    ):
        self.strategy = strategy
        self.blocks = list(natgrad_blocks)
        self.natgrad = None
        if self.blocks:
            import gpflow

            self.natgrad = gpflow.optimizers.NaturalGradient(gamma)
        separate_collective_keys(strategy)
        super().__init__(model, optimizer, variables, step_counter, **kwargs)
        # the step itself stays plain (its all-reduces are outside XLA); with jit_compile, each
        # replica's objective and gradients are one XLA program, traced per replica (its row block
        # is a compile-time constant) and batch shape
        self._compiled = tf.function(self._step, autograph=False)
        self._replica_xla = None
        if self.jit_compile:
            self._replica_xla = tf.function(
                self._replica_gradients, autograph=False, jit_compile=True
            )

    def _replica_gradients(self, step, X_b, Y_b, kl_weight, replica=None):
        """This replica's ``(share of the ELBO, gradients of its share of the loss, status)``: the
        model's one objective (:meth:`~deepgp_gi.DeepGP.elbo_terms`) on the replica's rows, its
        likelihood term rescaled for the whole batch, ``1/R`` of the KL and of the log prior. The
        gradients are those of the Adam variables, then of the natural-gradient blocks'.
        ``replica``: this replica's index as a Python int (the XLA program's row block is then a
        constant), or ``None`` to read it from the replica context."""
        from ..noise import RowSlice

        R = self.strategy.num_replicas_in_sync
        if replica is None:
            r = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.int32)
            B = tf.shape(X_b)[0]
        else:
            r = replica
            B = X_b.shape[0] if X_b.shape[0] is not None else tf.shape(X_b)[0]
        start, stop = B * r // R, B * (r + 1) // R
        noise = RowSlice(step_noise(self.seed, step), start, stop, B)
        watched = self.variables + block_variables(self.blocks)
        with cholesky_checks() as checks:
            with tf.GradientTape(watch_accessed_variables=False) as tape:
                tape.watch(watched)
                ell, kl = self.model.elbo_terms(
                    (X_b[start:stop], Y_b[start:stop]),
                    self.num_samples,
                    noise,
                    batch_size=B,
                    **self.elbo_options,
                )
                loss, share = tempered_loss(
                    ell, kl / R, kl_weight, self.model.log_prior_density() / R
                )
            grads = tape.gradient(loss, watched)
        # every replica must all-reduce the same list: a variable its rows do not reach (e.g. an
        # empty block of a small last batch) gets an explicit zero gradient, not None
        grads = [tf.zeros_like(v) if g is None else g for g, v in zip(grads, watched)]
        return share, grads, checks.status()

    def _replica_terms(self, step, X_b, Y_b, kl_weight):
        """:meth:`_replica_gradients` of the current replica, XLA-compiled with ``jit_compile``."""
        if self._replica_xla is None:
            return self._replica_gradients(step, X_b, Y_b, kl_weight)
        replica = tf.get_static_value(tf.distribute.get_replica_context().replica_id_in_sync_group)
        if replica is None:
            raise ValueError(
                "jit_compile=True under this strategy: its replica index is not known when the "
                "step is traced, so a replica's row block cannot be compiled; use jit_compile=False"
            )
        return self._replica_xla(step, X_b, Y_b, kl_weight, int(replica))

    def _replica(self, step, X_b, Y_b, kl_weight):
        share, grads, status = self._replica_terms(step, X_b, Y_b, kl_weight)
        n = len(self.variables)
        if n:
            self.update(grads[:n])  # the optimiser all-reduces (sums) the replicas' gradients
        if self.blocks:  # one batched all-reduce; every replica updates its copy from the sum
            summed = tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, grads[n:]
            )
            apply_natural_gradients(self.natgrad, self.blocks, summed)
        return share, status

    def loss_and_gradients(self, step, X_b, Y_b, kl_weight=None):
        """The whole batch's ELBO and loss gradients of the Adam variables as the replicas compute
        them (summed across replicas), without an update: for checking against one device."""
        n = len(self.variables)

        @tf.function(autograph=False)
        def run(step, X_b, Y_b, kl_weight):
            shares, grads, _ = self.strategy.run(
                self._replica_terms, args=(step, X_b, Y_b, kl_weight)
            )
            total = self.strategy.reduce(tf.distribute.ReduceOp.SUM, shares, axis=None)
            return total, [
                self.strategy.reduce(tf.distribute.ReduceOp.SUM, g, axis=None) for g in grads[:n]
            ]

        return run(step, X_b, Y_b, self.kl_weight_tensor(kl_weight))

    def _step(self, step, X_b, Y_b, kl_weight):
        shares, statuses = self.strategy.run(self._replica, args=(step, X_b, Y_b, kl_weight))
        elbo = self.strategy.reduce(tf.distribute.ReduceOp.SUM, shares, axis=None)
        # a failure code is 0 or a positive code: any replica's non-zero code is the step's
        status = tf.reduce_max(tf.stack(self.strategy.experimental_local_results(statuses)))
        self.finish_step(step, status)
        return elbo
