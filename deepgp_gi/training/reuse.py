"""One compiled training step per model and configuration, reused by every ``fit`` call.

Each trace of a training step stays in memory for the rest of the process, whether or not its
``tf.function`` is still referenced: TensorFlow registers the gradient of every
``tf.custom_gradient`` call traced in graph mode in a global registry, and TensorFlow
Probability's global bijector cache keeps each traced parameter transform's input (a tensor of
the traced graph, which holds the graph and so the transform's output) alive. A ``fit`` that
built and traced a new step every call therefore kept every earlier call's graphs: calling
``fit`` again and again on one model (a long run resumed segment by segment from its
checkpoints) grew by one traced step per call.

So ``fit`` keeps the step it builds on the model (:func:`cached_step`) and a later call on the
same model with the same configuration (:func:`step_key`: the step's kind, the variables it
trains, the model's modules and variables, the options traced into the step) takes that step
again, with its optimiser, step counter and failure record put back into the state a new one
starts in (:func:`reset_step`). The compiled function then runs without a new trace, and the
numbers are those of a newly built step.

A step reads the model's Python-level settings (those that are not variables) when it is traced;
a setting changed between ``fit`` calls without replacing a module or a variable is not seen by a
reused step: :func:`clear_cached_steps` drops a model's steps.
"""

from __future__ import annotations

from typing import Optional

from .optimizers import reset_adam
from .step import block_variables

__all__ = ["cached_step", "store_step", "reset_step", "step_key", "clear_cached_steps"]

_ATTRIBUTE = "_deepgp_gi_fit_steps"


class _Steps:
    """The steps a model keeps (by :func:`step_key`). A plain object, not a ``tf.Module`` or a
    container: a model's ``variables``, ``trainable_variables`` and checkpoints do not see it, and
    a copy of the model starts without steps."""

    def __init__(self):
        self.by_key = {}

    def __deepcopy__(self, memo):
        return _Steps()

    def __reduce__(self):
        return (_Steps, ())


def step_key(model, kind, variables, blocks, learning_rate, schedule_type, **options) -> tuple:
    """What a reused step must share with the one ``fit`` would build: ``kind`` (its class), the
    ``variables`` it trains (in order), the natural-gradient ``blocks``, every module and variable
    of the model (a replaced likelihood or layer is a new model to the step), a learning-rate
    schedule (the object: it is traced into the step) or ``"float"`` (a constant rate is a
    variable, assigned on reuse), and the ``options`` traced into the step."""
    if isinstance(learning_rate, schedule_type):
        rate = learning_rate
    else:
        rate = "float"
    return (
        kind,
        tuple(v.ref() for v in variables),
        tuple(v.ref() for v in block_variables(blocks)),
        tuple(model.submodules),
        tuple(v.ref() for v in model.variables),
        rate,
        tuple(sorted(options.items())),
    )


def cached_step(model, key):
    """The step ``model`` keeps for ``key``, or ``None``."""
    steps: Optional[_Steps] = model.__dict__.get(_ATTRIBUTE)
    return None if steps is None else steps.by_key.get(key)


def store_step(model, key, step) -> None:
    """Keep ``step`` on ``model`` for later ``fit`` calls with the same ``key``."""
    steps = model.__dict__.get(_ATTRIBUTE)
    if steps is None:
        steps = _Steps()
        # a plain object: not tracked by tf.Module's attribute tracking
        setattr(model, _ATTRIBUTE, steps)
    steps.by_key[key] = step


def reset_step(step, learning_rate) -> None:
    """Put a kept step back into the state of a newly built one: Adam's iteration count and
    moments zero and its learning rate ``learning_rate`` (:func:`~.optimizers.reset_adam`), the
    step counter 0, no Cholesky failure recorded."""
    reset_adam(step.optimizer, step.variables, learning_rate)
    step.step_counter.assign(0)
    step.reset_failures()


def clear_cached_steps(model) -> None:
    """Drop the training steps ``model`` keeps: the next ``fit`` builds and traces a new one."""
    steps = model.__dict__.get(_ATTRIBUTE)
    if steps is not None:
        steps.by_key.clear()
