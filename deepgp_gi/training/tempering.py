"""KL tempering: the weight ``beta`` of the KL term in ``fit``'s training objective.

``fit(..., kl_schedule=...)`` maximises ``E_q[log p(Y | F)] - beta_t * KL`` at step ``t`` (the
``ell`` and ``kl`` of :meth:`~deepgp_gi.DeepGP.elbo_terms`), while the ELBO it records and shows
is always the untempered one (``beta = 1``). A schedule is any callable ``step -> beta`` of the
0-based index of the step being taken; every value must be a finite number in ``[0, 1]``.

* :class:`PaperSchedule` — Ober & Aitchison (2021, App. O, CIFAR-10): ``beta = 0`` for the first
  10 epochs, then raised by 0.1 every 10 epochs, 1 from epoch 100 (0-based) on;
* :class:`LinearSchedule` — linear annealing from ``start`` to 1 (Ritter et al. 2021, App. J: no
  KL for 100 epochs, then 50 epochs of linear annealing, is
  ``LinearSchedule(50 * steps_per_epoch, delay_steps=100 * steps_per_epoch)``).

The weight is a function of the global step only, so a resumed run continues the schedule where
the checkpoint left it.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..validation import check_positive_int

__all__ = [
    "KLSchedule",
    "PaperSchedule",
    "LinearSchedule",
    "ConstantSchedule",
    "resolve_kl_schedule",
    "kl_weight_at",
]

#: ``fit(..., kl_schedule="linear")`` anneals over ``ceil(steps / LINEAR_WARMUP_DIVISOR)`` steps.
LINEAR_WARMUP_DIVISOR = 10


class KLSchedule:
    """Base class of the schedules: ``schedule(step) -> beta`` for the 0-based step index."""

    def __call__(self, step: int) -> float:  # pragma: no cover - interface
        raise NotImplementedError


class PaperSchedule(KLSchedule):
    """O&A (2021, App. O): ``beta = 0`` for the first ``zero_epochs`` epochs, then raised by
    ``increment`` every ``step_epochs`` epochs, capped at 1.

    With the defaults and 0-based epochs ``e = step // steps_per_epoch``: ``beta = 0`` for
    ``e < 10``, ``0.1`` for ``10 <= e < 20``, ..., ``0.9`` for ``90 <= e < 100`` and ``1`` from
    ``e = 100`` on. (The reference script, bayesfunc's ``examples/cifar10.py``, computes
    ``0.1 * floor((epoch - 1) / 10)`` with 0-based epochs, which is one epoch later and ``-0.1``
    in the first epoch; this follows the paper's text.)

    :param steps_per_epoch: optimisation steps per pass over the data (``ceil(N / batch_size)``).
    """

    def __init__(
        self,
        steps_per_epoch: int,
        zero_epochs: int = 10,
        step_epochs: int = 10,
        increment: float = 0.1,
    ):
        self.steps_per_epoch = check_positive_int(steps_per_epoch, "steps_per_epoch")
        self.zero_epochs = check_positive_int(zero_epochs, "zero_epochs", minimum=0)
        self.step_epochs = check_positive_int(step_epochs, "step_epochs")
        if isinstance(increment, bool) or not isinstance(
            increment, (int, float, np.integer, np.floating)
        ):
            raise TypeError(f"increment must be a number in (0, 1], got {increment!r}")
        if not (np.isfinite(increment) and 0 < increment <= 1):
            raise ValueError(f"increment must be a number in (0, 1], got {increment!r}")
        self.increment = float(increment)

    def __call__(self, step: int) -> float:
        epoch = int(step) // self.steps_per_epoch
        if epoch < self.zero_epochs:
            return 0.0
        raises = (epoch - self.zero_epochs) // self.step_epochs + 1
        return min(1.0, raises * self.increment)

    def __repr__(self) -> str:
        return (
            f"PaperSchedule(steps_per_epoch={self.steps_per_epoch}, "
            f"zero_epochs={self.zero_epochs}, step_epochs={self.step_epochs}, "
            f"increment={self.increment})"
        )


def _check_unit_weight(value, name: str) -> float:
    """``value`` as a float in ``[0, 1]``; a TypeError (not a number) or ValueError (not finite, or
    outside) naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number in [0, 1], got {value!r}")
    if not (np.isfinite(value) and 0 <= value <= 1):
        raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    return float(value)


class ConstantSchedule(KLSchedule):
    """One weight for every step: ``beta(t) = weight`` (a KL weight chosen on validation data, as
    Jankowiak et al. 2020 do for the predictive objective).

    :param weight: the weight, in ``[0, 1]``.
    :raises TypeError: ``weight`` is not a number.
    :raises ValueError: ``weight`` is not finite or outside ``[0, 1]``.
    """

    def __init__(self, weight: float):
        self.weight = _check_unit_weight(weight, "weight")

    def __call__(self, step: int) -> float:
        return self.weight

    def __repr__(self) -> str:
        return f"ConstantSchedule(weight={self.weight})"


class LinearSchedule(KLSchedule):
    """Linear annealing: ``beta = start`` for the first ``delay_steps`` steps, then rising linearly
    to 1 over ``warmup_steps`` steps, then 1:
    ``beta(t) = start + (1 - start) * clip((t - delay_steps) / warmup_steps, 0, 1)``.

    :param warmup_steps: steps from ``start`` to 1 (``beta(delay_steps + warmup_steps) = 1``).
    :param start: the initial weight, in ``[0, 1]``.
    :param delay_steps: steps held at ``start`` before the ramp (0 by default).
    """

    def __init__(self, warmup_steps: int, start: float = 0.0, *, delay_steps: int = 0):
        self.warmup_steps = check_positive_int(warmup_steps, "warmup_steps")
        self.delay_steps = check_positive_int(delay_steps, "delay_steps", minimum=0)
        self.start = _check_unit_weight(start, "start")

    def __call__(self, step: int) -> float:
        fraction = (int(step) - self.delay_steps) / self.warmup_steps
        if fraction >= 1:
            return 1.0
        return self.start + (1.0 - self.start) * max(fraction, 0.0)

    def __repr__(self) -> str:
        return (
            f"LinearSchedule(warmup_steps={self.warmup_steps}, start={self.start}, "
            f"delay_steps={self.delay_steps})"
        )


def resolve_kl_schedule(
    kl_schedule, *, steps: int, steps_per_epoch: Optional[int]
) -> Optional[Callable[[int], float]]:
    """``fit``'s ``kl_schedule`` argument as a callable (``None`` stays ``None``: no tempering).

    ``"paper"`` is :class:`PaperSchedule` with ``steps_per_epoch`` (``ceil(N / batch_size)`` for
    array data, the length of a finite ``tf.data.Dataset``; ``None`` when unknown, which is an
    error); ``"linear"`` is ``LinearSchedule(ceil(0.1 * steps))``, from 0 to 1 over the first
    10% of the run. Checks the value at step 0.
    """
    if kl_schedule is None:
        return None
    if isinstance(kl_schedule, str):
        if kl_schedule == "paper":
            if steps_per_epoch is None:
                raise ValueError(
                    "kl_schedule='paper' needs the number of steps per epoch, which this "
                    "tf.data.Dataset does not tell (infinite or unknown length); pass "
                    "PaperSchedule(steps_per_epoch=...)"
                )
            schedule = PaperSchedule(steps_per_epoch)
        elif kl_schedule == "linear":
            schedule = LinearSchedule(-(-steps // LINEAR_WARMUP_DIVISOR))
        else:
            raise ValueError(
                f"unknown kl_schedule {kl_schedule!r}; choose 'paper', 'linear', a schedule or a "
                "callable"
            )
    elif callable(kl_schedule):
        schedule = kl_schedule
    else:
        raise TypeError(
            "kl_schedule must be None, 'paper', 'linear', a KLSchedule or a callable step -> "
            f"weight, got {type(kl_schedule).__name__} {kl_schedule!r} (for a constant weight b "
            "use lambda step: b)"
        )
    kl_weight_at(schedule, 0)
    return schedule


def kl_weight_at(schedule: Callable[[int], float], step: int) -> float:
    """``schedule(step)`` checked: a real number (``TypeError`` otherwise), finite and in ``[0, 1]``
    (``ValueError`` otherwise); both errors name ``kl_schedule`` and the step."""
    value = schedule(step)
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"kl_schedule returned {value!r} at step {step}; it must return a number in [0, 1]"
        )
    try:
        arr = np.asarray(value)
    except Exception:  # pragma: no cover - anything numpy cannot hold is not a number
        arr = np.asarray(None)
    if arr.ndim != 0 or arr.dtype.kind not in "fiu":
        raise TypeError(
            f"kl_schedule returned {type(value).__name__} {value!r} at step {step}; it must return "
            "a number in [0, 1]"
        )
    value = float(arr)
    if not (np.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(
            f"kl_schedule gave {value} at step {step}; a KL weight must be finite and in [0, 1]"
        )
    return value
