"""``fit``: argument checks, then the pieces of :mod:`deepgp_gi.training` tied together."""

from __future__ import annotations

import contextlib
import math
import operator
import os
import time
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

import gpflow
import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from ..models import OBJECTIVES, DeepGP
from ..validation import check_choice, check_positive_float, check_positive_int, resolve_seed
from .batches import array_batches, dataset_batches
from .checkpoint import Checkpointer
from .compilation import resolve_jit_compile
from .history import History
from .optimizers import adam
from .reuse import cached_step, reset_step, step_key, store_step
from .step import DistributedStep, NaturalGradientStep, SamplerStep, TrainStep
from .tempering import kl_weight_at, resolve_kl_schedule

__all__ = ["fit"]


@dataclass
class FitPlan:
    """``fit``'s arguments, checked."""

    steps: int
    num_samples: int
    log_every: int
    learning_rate: Union[float, "LearningRateSchedule"]
    seed: int
    num_data: int
    batch_size: Optional[int]  # None for a tf.data.Dataset
    steps_per_epoch: Optional[int]  # None for a tf.data.Dataset of unknown or infinite length
    X: Optional[tf.Tensor] = None
    Y: Optional[tf.Tensor] = None
    importance_samples: Optional[int] = None  # K of a latent-variable model's bound
    objective: str = "elbo"


def check_fit_arguments(
    model, data, *, steps, batch_size, learning_rate, num_samples, seed, log_every
) -> FitPlan:
    """``fit``'s common arguments checked into a :class:`FitPlan`
    (also :func:`~deepgp_gi.collect_samples`'s)."""
    if not isinstance(model, DeepGP):
        raise TypeError(f"model must be a deepgp_gi.DeepGP, got {type(model).__name__}")
    steps = check_positive_int(steps, "steps")
    num_samples = check_positive_int(num_samples, "num_samples")
    log_every = check_positive_int(log_every, "log_every")
    learning_rate = _check_learning_rate(learning_rate)
    seed = resolve_seed(seed, "seed")
    common = dict(
        steps=steps,
        num_samples=num_samples,
        log_every=log_every,
        learning_rate=learning_rate,
        seed=seed,
    )

    if isinstance(data, tf.data.Dataset):
        if batch_size is not None:
            raise ValueError("batch_size is only for array data; batch the tf.data.Dataset itself")
        if model.num_data is None:
            raise ValueError(
                "model.num_data must be set to train on a tf.data.Dataset of minibatches"
            )
        length = int(data.cardinality())  # negative: infinite or unknown
        return FitPlan(
            num_data=model.num_data,
            batch_size=None,
            steps_per_epoch=length if length > 0 else None,
            **common,
        )

    X, Y = model.check_data(data)
    N = int(X.shape[0])
    if batch_size is None:
        batch_size = N
    batch_size = check_positive_int(batch_size, "batch_size")
    if batch_size > N:
        raise ValueError(f"batch_size={batch_size} exceeds the number of data points N={N}")
    if batch_size < N and model.num_data is None:
        raise ValueError(
            "model.num_data is None but batch_size < N: build the model with num_data=N"
        )
    if model.num_data is not None and model.num_data != N:
        raise ValueError(f"model.num_data={model.num_data} but the data has N={N} rows")
    return FitPlan(
        num_data=N, batch_size=batch_size, steps_per_epoch=-(-N // batch_size), X=X, Y=Y, **common
    )


LearningRateSchedule = gpflow.keras.tf_keras.optimizers.schedules.LearningRateSchedule


def _check_learning_rate(learning_rate):
    """A positive float, or a Keras learning-rate schedule whose first value is positive and
    finite."""
    if not isinstance(learning_rate, LearningRateSchedule):
        return check_positive_float(learning_rate, "learning_rate")
    first = float(learning_rate(0))
    if not (math.isfinite(first) and first > 0):
        raise ValueError(
            f"learning_rate is a schedule whose value at step 0 is {first}; it must be positive "
            "and finite"
        )
    return learning_rate


def _is_trainable(variable) -> bool:
    """Whether ``variable`` is to be trained: the flag ``gpflow.set_trainable`` writes.

    On one device that is the variable's ``trainable``. Under a ``tf.distribute`` strategy a
    GPflow parameter's variable is a distributed variable: a parameter created with
    ``trainable=False`` (as the builders create the ones they freeze) is frozen in every copy,
    but ``set_trainable`` on a model built under the strategy writes its flag on the wrapper
    only, while the wrapper's ``trainable`` (what ``model.trainable_variables``, GPflow's
    ``Scipy`` and ``print_summary`` read) still reads the per-device copy. The flag written last
    on the wrapper is the one the user meant; where none was written, the wrapper reads the
    copy's."""
    return bool(getattr(variable, "_trainable", variable.trainable))


def _trainable_variables(model) -> list:
    """The variables ``fit`` trains, in ``model.variables``' order: those :func:`_is_trainable`
    accepts (on one device exactly ``model.trainable_variables``; under a strategy also honouring
    a ``gpflow.set_trainable`` call on the built model).

    A sampling posterior's chain (its inducing outputs, momenta, adaptation statistics, window and
    samples) is never the optimiser's, whatever ``set_trainable`` was told.
    """
    chain = {id(v) for v in _sampler_variables(model)}
    return [v for v in model.variables if _is_trainable(v) and id(v) not in chain]


def _is_sampler(model) -> bool:
    return bool(getattr(model.posterior, "is_sampler", False))


def _sampler_variables(model) -> list:
    return list(model.posterior.sampler_variables()) if _is_sampler(model) else []


def _check_sampler_options(model, *, natgrad_gamma, kl_schedule, strategy) -> None:
    """A sampling family (``posterior="sghmc"``) moves its inducing outputs by SGHMC: natural
    gradients, KL tempering and data-parallel strategies do not apply to it (yet)."""
    if not _is_sampler(model):
        return
    family = type(model.posterior).__name__
    if natgrad_gamma is not None:
        raise ValueError(
            f"natgrad_gamma does not apply to a sampling posterior ({family}): its inducing "
            "outputs are sampled by SGHMC, not a Gaussian q(U); leave natgrad_gamma=None"
        )
    if kl_schedule is not None:
        raise ValueError(
            f"kl_schedule does not apply to a sampling posterior ({family}): tempering its prior "
            "would change the distribution it samples; leave kl_schedule=None"
        )
    if strategy is not None:
        raise ValueError(f"strategy is not supported for a sampling posterior ({family}) yet")


def _check_importance_samples(model, importance_samples, *, strategy) -> Optional[int]:
    """``importance_samples`` (K) needs a latent-variable model; ``None`` leaves the model's default
    (K = 1)."""
    from ..latent import LatentDeepGP

    latent = isinstance(model, LatentDeepGP)
    if latent and strategy is not None:
        raise ValueError("strategy is not supported for a latent-variable model (LatentDeepGP) yet")
    if importance_samples is None:
        return None
    K = check_positive_int(importance_samples, "importance_samples")
    if not latent:
        raise ValueError(
            f"importance_samples={K} needs a latent-variable model (build_deep_gp(..., "
            f"latent_dim=...)); this {type(model).__name__} has no latent input to draw K times"
        )
    return K


def plan_batches(plan: FitPlan, data, start: int, dtype: tf.DType) -> tf.data.Dataset:
    if plan.batch_size is None:
        return dataset_batches(data, start, plan.steps, dtype)
    return array_batches(plan.X, plan.Y, start, plan.steps, plan.batch_size, plan.seed)


def _check_objective(model, objective) -> str:
    """``objective`` is a name in :data:`~deepgp_gi.models.OBJECTIVES` the model can train on."""
    from ..latent import LatentDeepGP

    objective = check_choice(objective, "objective", OBJECTIVES)
    if objective == "predictive" and _is_sampler(model):
        raise ValueError(
            "objective='predictive' is for a variational family; a sampling posterior draws its "
            "inducing outputs by SGHMC and has no q(U) to fit"
        )
    if objective == "predictive" and isinstance(model, LatentDeepGP):
        raise ValueError(
            "objective='predictive' is not available for a latent-variable model; train it on the "
            "importance-weighted bound (importance_samples=K)"
        )
    return objective


def fit(
    model: DeepGP,
    data,
    *,
    steps: int,
    batch_size: Optional[int] = None,
    learning_rate: Union[float, LearningRateSchedule] = 0.01,
    num_samples: int = 1,
    seed: Optional[int] = None,
    progress: bool = True,
    checkpoint_dir: Optional[Union[str, os.PathLike]] = None,
    checkpoint_every: Optional[int] = None,
    log_every: int = 10,
    jit_compile: Union[bool, str] = "auto",
    natgrad_gamma: Optional[float] = None,
    natgrad_layers: Union[str, Sequence[int]] = "all",
    strategy: Optional[tf.distribute.Strategy] = None,
    kl_schedule: Union[None, str, Callable[[int], float]] = None,
    importance_samples: Optional[int] = None,
    objective: str = "elbo",
) -> History:
    """Maximise ``model``'s ELBO with Adam (or a KL-tempered ELBO, see ``kl_schedule``).

    The compiled step of a single-device variational fit is kept on the model: a later call on
    the same model with the same options reuses it (no new trace, and no memory growth from call
    to call; its optimiser starts afresh as a new one would; :mod:`~deepgp_gi.training.reuse`).

    A sampling posterior (``posterior="sghmc"``) is trained by
    :class:`~deepgp_gi.training.step.SamplerStep` instead: each step moves its chain of inducing
    outputs ``V`` by one scale-adapted SGHMC step and then takes one Adam step on the
    hyperparameters with ``V`` from the window of the last states (Havasi et al. 2018); the
    history then records the log joint ``log p(V) + (N / B) sum_batch log p(y | V)`` of the
    chain's state (``history.elbo``, full-data units; ``history.elbo_per_datapoint`` per data point)
    in place of the ELBO, a checkpoint holds the chain (momenta, adaptation statistics, window), and
    ``natgrad_gamma``, ``kl_schedule`` and ``strategy`` are refused. A sample set stored by
    :func:`~deepgp_gi.collect_samples` is discarded (it was drawn under the old hyperparameters).

    :param model: a :class:`~deepgp_gi.DeepGP`.
    :param data: ``(X, Y)`` arrays, or a ``tf.data.Dataset`` of ``(X, Y)`` batches (then
        ``model.num_data`` must be set; the dataset is cycled through as often as ``steps`` needs,
        and a resumed run skips the batches already used, across passes).
    :param steps: total number of optimisation steps (a resumed run does the remainder).
    :param batch_size: minibatch size for array data; ``None`` means the full data set.
    :param learning_rate: Adam's learning rate: a positive float, or a Keras learning-rate
        schedule of the optimiser's step (e.g. Lindinger et al.'s 0.005 decayed by 0.98 every
        1,000 steps: ``tf_keras.optimizers.schedules.ExponentialDecay(0.005, 1000, 0.98,
        staircase=True)``); the optimiser's step count is in every checkpoint, so a resumed run
        continues the schedule (when to decay: ``docs/training.md``, "A decaying learning rate").
    :param num_samples: Monte Carlo samples per step.
    :param seed: seeds minibatches and Monte Carlo noise; ``None`` draws one (recorded in the
        returned history).
    :param progress: show a tqdm progress bar with the current ELBO per data point.
    :param checkpoint_dir: where to save the model, optimiser state and step count; a later call
        with the same arguments resumes from the latest checkpoint there.
    :param checkpoint_every: steps between checkpoints (default ``max(100, steps // 20)``).
    :param log_every: steps between entries of the history (and progress-bar updates).
    :param jit_compile: compile the training step with XLA (``tf.function(jit_compile=True)``):
        ``True``, ``False``, or ``"auto"`` (default): XLA only for the families listed for this
        kind of device in :data:`~deepgp_gi.training.compilation.XLA_FASTER`, plain otherwise,
        and plain with natural gradients or a strategy.
    :param natgrad_gamma: if given, the posterior's Gaussian blocks (mean-field ``q(U_l)``, the
        fully-coupled ``q(f_M)``) take
        natural-gradient steps of this size and only the other variables use Adam, in one step;
        a family without Gaussian blocks raises a ``ValueError`` saying so.
    :param natgrad_layers: which mean-field layers' ``q(U_l)`` take the natural-gradient steps:
        ``"all"`` (default), ``"last"``, or a sequence of layer indices (negative ones count from
        the output); the others' blocks take Adam with every other variable. A hidden layer's
        expected log-likelihood is not concave in its inducing outputs, so a natural-gradient
        step there can leave its precision indefinite (a NaN in the update); ``"last"`` (the
        output layer, whose Gaussian likelihood is conjugate given the layer's inputs) is the
        stable choice for a deep model (docs/training.md). A family whose one Gaussian block
        spans every layer (fully-coupled) accepts only ``"all"``.
    :param strategy: a ``tf.distribute`` strategy (``MirroredStrategy`` over several devices,
        ``MultiWorkerMirroredStrategy`` over machines): build the model inside
        ``strategy.scope()``; ``fit`` enters the scope itself (calling it inside the scope works
        too) and creates its optimiser and step there; each replica takes a block of every batch
        (see :class:`~deepgp_gi.training.step.DistributedStep`), the KL is counted once and the
        gradients are summed across replicas. It combines with ``natgrad_gamma`` (each replica
        applies the natural-gradient update of the blocks' summed gradients) and with
        ``jit_compile=True`` (each replica's loss and gradients are compiled; the all-reduces and
        updates are not), and several strategies may train in one process, one after another.
    :param kl_schedule: KL tempering (:mod:`deepgp_gi.training.tempering`): step ``t`` (0-based)
        maximises ``E[log p(y | f)] - beta_t * KL`` (:meth:`~deepgp_gi.DeepGP.elbo_terms`) instead
        of the ELBO. ``None``: no tempering (``beta = 1``); ``"paper"``: O&A (2021)'s
        :class:`~deepgp_gi.training.PaperSchedule` (0 for 10 epochs, +0.1 every 10 epochs, 1 from
        epoch 100; an epoch is ``ceil(N / batch_size)`` steps, or one pass of a finite
        ``tf.data.Dataset``); ``"linear"``: ``LinearSchedule(ceil(steps / 10))``, 0 to 1 over the
        first 10% of the steps; a :class:`~deepgp_gi.training.LinearSchedule` /
        :class:`~deepgp_gi.training.PaperSchedule`, or any callable ``step -> beta``. Every value
        must be finite and in ``[0, 1]`` (checked at step 0 before training and at every step
        before it is used). The ELBO in the history and the progress bar is always untempered;
        ``history.kl_weight`` records the weight of each logged step. The weight depends on the
        global step only, so a resumed run continues the schedule; resuming with a schedule whose
        values differ from the recorded ones is an error.
    :param importance_samples: K, for a latent-variable model
        (``build_deep_gp(..., latent_dim=...)``, :class:`~deepgp_gi.latent.LatentDeepGP`): train
        the importance-weighted bound with K draws of the latent variable per data point (the
        history records that bound); ``None`` or 1 is the ELBO. A plain model refuses it.
    :param objective: ``"elbo"`` (default) or ``"predictive"``: the predictive objective of
        Jankowiak et al. (2020), the log predictive density of each training row under the mixture
        of the propagated samples minus the KL (:meth:`~deepgp_gi.DeepGP.elbo_terms`); the history
        and the progress bar then record that objective in place of the ELBO. Every variational
        family takes it (a deep sigma point process, ``posterior="dspp"``, is meant for it); a
        sampling family and a latent-variable model refuse it.
    :return: a :class:`History`.
    :raises TypeError: an argument of the wrong type (``model`` not a
        :class:`~deepgp_gi.DeepGP`, a non-integer ``steps``, ``jit_compile`` neither a bool nor
        ``"auto"``, a ``kl_schedule`` that is not callable, ``strategy`` not a
        ``tf.distribute.Strategy``).
    :raises ValueError: an argument out of range (non-positive ``steps``, ``batch_size`` above
        N, ``batch_size`` with a dataset, a ``model.num_data`` that disagrees with the data, an
        invalid ``kl_schedule`` or ``objective``), or an option the model's family refuses (see
        the parameters above).
    :raises deepgp_gi.linalg.CholeskyError: a factorisation failed in a step (checked before
        every log entry and checkpoint, and at the end, so no broken state is logged or saved).
    :raises FloatingPointError: the ELBO became NaN or infinite.
    """
    plan = check_fit_arguments(
        model,
        data,
        steps=steps,
        batch_size=batch_size,
        learning_rate=learning_rate,
        num_samples=num_samples,
        seed=seed,
        log_every=log_every,
    )
    if natgrad_gamma is None and not (isinstance(natgrad_layers, str) and natgrad_layers == "all"):
        raise ValueError(
            f"natgrad_layers={natgrad_layers!r} needs natgrad_gamma (the natural-gradient step "
            "size)"
        )
    jit_compile = resolve_jit_compile(
        jit_compile, model, natgrad=natgrad_gamma is not None, strategy=strategy
    )
    _check_sampler_options(
        model, natgrad_gamma=natgrad_gamma, kl_schedule=kl_schedule, strategy=strategy
    )
    plan.importance_samples = _check_importance_samples(
        model, importance_samples, strategy=strategy
    )
    plan.objective = _check_objective(model, objective)
    schedule = resolve_kl_schedule(
        kl_schedule, steps=plan.steps, steps_per_epoch=plan.steps_per_epoch
    )
    if strategy is not None:
        _check_strategy(model, strategy)
    # under a strategy, the optimiser's slots, the step counter and the failure record are created
    # under it too, whether or not the caller is inside its scope already
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        return _fit(
            model,
            data,
            plan,
            schedule,
            jit_compile=jit_compile,
            natgrad_gamma=natgrad_gamma,
            natgrad_layers=natgrad_layers,
            strategy=strategy,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=checkpoint_every,
            progress=progress,
        )


def _check_strategy(model, strategy) -> None:
    """Before training: the strategy is a strategy, no other one's scope is open, and the model's
    variables are that strategy's."""
    if not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(f"strategy must be a tf.distribute.Strategy, got {type(strategy).__name__}")
    if tf.distribute.has_strategy() and tf.distribute.get_strategy() is not strategy:
        raise ValueError("fit(..., strategy=s) was called inside another strategy's scope")
    foreign = [
        v.name for v in model.variables if not strategy.extended.variable_created_in_scope(v)
    ]
    if foreign:
        raise ValueError(
            f"strategy: the model's variables were not created under this strategy ({len(foreign)} "
            f"of them, e.g. {foreign[0]}); build the model inside `with strategy.scope():`"
        )


def _fit(
    model,
    data,
    plan: FitPlan,
    schedule,
    *,
    jit_compile,
    natgrad_gamma,
    natgrad_layers,
    strategy,
    checkpoint_dir,
    checkpoint_every,
    progress,
) -> History:
    """``fit`` after its checks (under the strategy's scope when there is one)."""

    blocks = []
    variables = _trainable_variables(model)
    if natgrad_gamma is not None:
        natgrad_gamma = check_positive_float(natgrad_gamma, "natgrad_gamma")
        blocks = _select_natgrad_blocks(model, natgrad_layers)
        taken = {
            id(v)
            for q_mu, q_sqrt in blocks
            for v in (q_mu.unconstrained_variable, q_sqrt.unconstrained_variable)
        }
        variables = [v for v in variables if id(v) not in taken]
    # a single-device variational step is kept on the model and reused by a later call with the
    # same configuration (no new trace; every trace stays in memory: .reuse)
    kind = None
    if strategy is None and not _is_sampler(model):
        kind = TrainStep if natgrad_gamma is None else NaturalGradientStep
    key = reused = None
    if kind is not None:
        key = step_key(
            model,
            kind,
            variables,
            blocks,
            plan.learning_rate,
            LearningRateSchedule,
            num_samples=plan.num_samples,
            seed=plan.seed,
            jit_compile=jit_compile,
            importance_samples=plan.importance_samples,
            objective=plan.objective,
            gamma=natgrad_gamma,
            num_data=model.num_data,
        )
        reused = cached_step(model, key)
    if reused is not None:
        reset_step(reused, plan.learning_rate)
        optimizer, step_counter = reused.optimizer, reused.step_counter
    else:
        optimizer = adam(plan.learning_rate, variables)
        step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
    history = History(seed=plan.seed, num_data=plan.num_data)

    checkpointer = None
    start = 0
    if checkpoint_dir is not None:
        every = max(100, plan.steps // 20) if checkpoint_every is None else checkpoint_every
        every = check_positive_int(every, "checkpoint_every")
        checkpointer = Checkpointer(
            checkpoint_dir, model=model, optimizer=optimizer, step=step_counter, every=every
        )
        start = checkpointer.restore(history, plan.log_every)
        _check_resumed_kl_weights(history, schedule, checkpoint_dir)
    if start >= plan.steps:
        return history

    batches = plan_batches(plan, data, start, model.dtype)
    options = dict(
        num_samples=plan.num_samples,
        seed=plan.seed,
        jit_compile=jit_compile,
        importance_samples=plan.importance_samples,
        objective=plan.objective,
    )
    if reused is not None:
        train_step = reused
    elif strategy is not None:
        train_step = DistributedStep(
            model,
            optimizer,
            variables,
            step_counter,
            strategy=strategy,
            natgrad_blocks=blocks,
            gamma=natgrad_gamma,
            **options,
        )
    elif _is_sampler(model):
        model.posterior.clear_samples()  # drawn under the hyperparameters this run changes
        train_step = SamplerStep(model, optimizer, variables, step_counter, **options)
    elif natgrad_gamma is None:
        train_step = TrainStep(model, optimizer, variables, step_counter, **options)
    else:
        train_step = NaturalGradientStep(
            model,
            optimizer,
            variables,
            step_counter,
            natgrad_blocks=blocks,
            gamma=natgrad_gamma,
            **options,
        )
    if key is not None and reused is None:
        store_step(model, key, train_step)
    _run(
        plan,
        batches,
        train_step,
        history,
        checkpointer,
        start,
        progress,
        _KLWeights(schedule, train_step),
    )
    return history


def _takes_steps(block) -> bool:
    """Whether a ``(q_mu, q_sqrt)`` block is trainable (``gpflow.set_trainable(..., False)`` on
    both keeps it fixed under natural gradients too); one trainable half alone is refused."""
    flags = [_is_trainable(half.unconstrained_variable) for half in block]
    if flags[0] != flags[1]:
        raise ValueError(
            "natgrad_gamma: a Gaussian block has one of q_mu, q_sqrt trainable and the other not; "
            "natural gradients update both together (set both trainable or neither)"
        )
    return flags[0]


def _select_natgrad_blocks(model, natgrad_layers) -> list:
    """The trainable Gaussian blocks of the layers ``natgrad_layers`` names (``fit``'s
    docstring)."""
    blocks = model.posterior.natural_gradient_blocks()
    if isinstance(natgrad_layers, str):
        if natgrad_layers == "all":
            return [block for block in blocks if _takes_steps(block)]
        if natgrad_layers != "last":
            raise ValueError(
                "natgrad_layers must be 'all', 'last' or a sequence of layer indices, got "
                f"{natgrad_layers!r}"
            )
        layers = [-1]
    else:
        try:
            layers = [operator.index(k) for k in natgrad_layers]
        except TypeError:
            raise TypeError(
                "natgrad_layers must be 'all', 'last' or a sequence of ints, got "
                f"{natgrad_layers!r}"
            ) from None
        if not layers:
            raise ValueError(
                "natgrad_layers is empty: name at least one layer, or leave natgrad_gamma=None"
            )
    depth = model.posterior.depth
    if len(blocks) != depth:
        raise ValueError(
            f"natgrad_layers={natgrad_layers!r}: {type(model.posterior).__name__} has one Gaussian "
            f"block over all {depth} layers, so its natural-gradient step cannot be split by "
            "layer; use natgrad_layers='all'"
        )
    picked = []
    for k in layers:
        if not -depth <= k < depth:
            raise ValueError(f"natgrad_layers: layer {k} does not exist in a depth-{depth} model")
        if k % depth in picked:
            raise ValueError(f"natgrad_layers names layer {k % depth} twice")
        if not _takes_steps(blocks[k]):
            raise ValueError(
                f"natgrad_layers names layer {k % depth}, whose q_mu and q_sqrt are not trainable"
            )
        picked.append(k % depth)
    return [blocks[k] for k in sorted(picked)]


def _check_resumed_kl_weights(history: History, schedule, checkpoint_dir) -> None:
    """A resumed run must use the schedule the checkpointed run used: compare the recorded
    weights of the logged steps with the schedule's (``1`` without one)."""
    for logged, recorded in zip(history.step, history.kl_weight):
        expected = 1.0 if schedule is None else kl_weight_at(schedule, logged - 1)
        if abs(expected - recorded) > 1e-12:
            raise ValueError(
                f"checkpoint_dir {os.fspath(checkpoint_dir)} holds a run whose KL weight at step "
                f"{logged} was {recorded}, but kl_schedule gives {expected}; resume with the run's "
                "kl_schedule"
            )


class _KLWeights:
    """The checked KL weight of each step and the tensor handed to the compiled step (rebuilt
    only when the value changes)."""

    def __init__(self, schedule, train_step: TrainStep):
        self.schedule, self.train_step = schedule, train_step
        self.value, self.tensor = 1.0, train_step.kl_weight_tensor(1.0)

    def __call__(self, step: int):
        value = 1.0 if self.schedule is None else kl_weight_at(self.schedule, step)
        if value != self.value:
            self.value, self.tensor = value, self.train_step.kl_weight_tensor(value)
        return self.value, self.tensor


def _run(
    plan: FitPlan,
    batches,
    train_step: TrainStep,
    history: History,
    checkpointer,
    start: int,
    progress: bool,
    kl_weights: _KLWeights,
):
    """The loop: step, log every ``log_every`` steps, checkpoint; the checks precede both."""
    steps, N = plan.steps, plan.num_data
    bar = tqdm(total=steps, initial=start, disable=not progress, desc="fit", dynamic_ncols=True)
    t0 = time.perf_counter() - (history.wall_time[-1] if history.wall_time else 0.0)
    t = start
    try:
        for step, X_b, Y_b in batches:
            s = int(step.numpy())
            beta, beta_tensor = kl_weights(s)
            elbo = train_step(step, X_b, Y_b, beta_tensor)
            t = s + 1
            log = t % plan.log_every == 0 or t == steps
            save = checkpointer is not None and checkpointer.due(t, steps)
            if log or save:
                train_step.raise_if_failed()
            if log:
                value = float(elbo.numpy())
                if not np.isfinite(value):
                    raise FloatingPointError(
                        f"the ELBO became {value} at step {t}; lower the learning rate or check "
                        "the data"
                    )
                history.step.append(t)
                history.elbo.append(value)
                history.kl_weight.append(beta)
                history.wall_time.append(time.perf_counter() - t0)
                postfix = dict(elbo_per_point=f"{value / N:.4f}")
                if kl_weights.schedule is not None:
                    postfix["kl_weight"] = f"{beta:.3g}"
                bar.set_postfix(**postfix)
            bar.update(1)
            if save:
                checkpointer.save(t, history)
    finally:
        bar.close()
    if t < steps:
        raise ValueError(
            f"the data ran out after step {t} of {steps}: the tf.data.Dataset yielded no more "
            "batches"
        )
    train_step.raise_if_failed()
