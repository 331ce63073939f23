"""The optimiser of :func:`~deepgp_gi.training.fit`: Adam with one fused update kernel per variable.

tf_keras's current ``Adam`` writes its update as a chain of elementwise TensorFlow ops per
variable (moments, bias corrections, square root, division, assignment). A deep GP has many
small variables, so those ops are a large share of a training step's ops, and on a GPU each op
is a kernel launch (op counts: ``docs/performance.md``, "Adam: one fused kernel per variable").
The legacy Keras ``Adam`` applies the same update with TensorFlow's fused ``ResourceApplyAdam``
kernel: one op per variable, plus a handful per step for the bias corrections. Its update is the
same algorithm (Kingma & Ba, Algorithm 1, with the bias corrections folded into the step size,
``lr_t = lr * sqrt(1 - beta_2^t) / (1 - beta_1^t)`` and ``x -= lr_t * m / (sqrt(v) + eps)``), and
it compiles with XLA and runs in float32. Like every Keras optimiser it keeps its
hyperparameters in float32 variables (``beta_1`` is 0.8999999762 in a float64 step).

:func:`adam` creates the optimiser's variables (iteration count, hyperparameters, the slots
``m`` and ``v`` of every variable) when it is built, as the current optimisers' ``build`` does:
left to the first ``apply_gradients``, they would be created inside the first trace of the
compiled step, and ``tf.function`` traces a step that creates variables twice. Built up front,
they are in every checkpoint from the first save and a restore matches them one to one.
"""

from __future__ import annotations

from typing import Sequence

import gpflow
import tensorflow as tf

__all__ = ["adam", "reset_adam"]


def adam(
    learning_rate, variables: Sequence[tf.Variable]
) -> "gpflow.keras.tf_keras.optimizers.legacy.Adam":
    """Adam with TensorFlow's fused update (``ResourceApplyAdam``: one kernel per variable).

    :param learning_rate: a positive float or a Keras learning-rate schedule.
    :param variables: the variables it will update; their slots are created now (under the
        caller's distribution strategy scope, where there is one).
    :return: a ``tf_keras.optimizers.legacy.Adam`` with Keras's default ``beta_1 = 0.9``,
        ``beta_2 = 0.999``, ``epsilon = 1e-7``, its variables created.
    """
    optimizer = gpflow.keras.tf_keras.optimizers.legacy.Adam(learning_rate)
    # the legacy optimisers' counterpart of ``build``: iterations, hyperparameters and slots
    optimizer._create_all_weights(list(variables))
    return optimizer


def reset_adam(optimizer, variables: Sequence[tf.Variable], learning_rate) -> None:
    """Put an optimiser made by :func:`adam` for ``variables`` back into the state
    ``adam(learning_rate, variables)`` creates it in: iteration count 0, the moments ``m`` and
    ``v`` of every variable zero, the learning rate ``learning_rate`` (a float is assigned to the
    optimiser's learning-rate variable; a schedule must be the one it was made with)."""
    optimizer.iterations.assign(0)
    for variable in variables:
        for name in optimizer.get_slot_names():
            slot = optimizer.get_slot(variable, name)
            slot.assign(tf.zeros_like(slot))
    if isinstance(learning_rate, gpflow.keras.tf_keras.optimizers.schedules.LearningRateSchedule):
        if optimizer._get_hyper("learning_rate") is not learning_rate:
            raise ValueError("reset_adam: a schedule other than the optimiser's was given")
    else:
        optimizer._set_hyper("learning_rate", learning_rate)
