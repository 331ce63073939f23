"""Saving and resuming a ``fit`` run.

A checkpoint holds the model, the optimiser state and the step count (``tf.train.Checkpoint``),
plus ``history.json``. The random streams need no state (they are functions of ``(seed, step)``,
see :mod:`.batches`), so a resumed call with the same arguments replays exactly what an
uninterrupted run would have done. A checkpoint is only written after the run's Cholesky-failure
flag and ELBO have been checked (see :mod:`.loop`), so a broken state is never saved.
"""

from __future__ import annotations

import os
from typing import Optional, Union

import tensorflow as tf

from .history import History

__all__ = ["Checkpointer"]

_HISTORY_FILE = "history.json"


class Checkpointer:
    """Owns one run's ``tf.train.CheckpointManager`` and ``history.json``."""

    def __init__(
        self,
        directory: Union[str, os.PathLike],
        *,
        model,
        optimizer,
        step: tf.Variable,
        every: int,
        max_to_keep: int = 2,
    ):
        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.every = every
        self.step = step
        self._checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
        self._manager = tf.train.CheckpointManager(
            self._checkpoint, self.directory, max_to_keep=max_to_keep
        )

    def restore(self, history: History, log_every: int) -> int:
        """Restore the latest checkpoint, if any, into the model, optimiser, step and ``history``.

        Keeps only the history entries an uninterrupted run would also have: those on the
        ``log_every`` grid up to the saved step (an entry logged because an earlier call ended off
        the grid is dropped). Raises ``ValueError`` if the saved run used another seed.
        Returns the step to resume from (0 without a checkpoint).
        """
        latest = self._manager.latest_checkpoint
        if not latest:
            return 0
        try:
            self._checkpoint.restore(latest).assert_existing_objects_matched()
        except (AssertionError, ValueError) as err:
            raise ValueError(
                f"checkpoint_dir {self.directory}: the checkpoint {latest} does not match this "
                "run's model and optimiser (another model, or a checkpoint written with another "
                "optimiser state: fit's Adam keeps the legacy Keras slots m and v since it uses "
                f"the fused update); use a new checkpoint_dir. ({type(err).__name__}: "
                f"{str(err)[:500]})"
            ) from err
        done = int(self.step.numpy())
        saved = self._load_history()
        if saved is not None:
            if saved.seed != history.seed:
                raise ValueError(
                    f"checkpoint_dir {self.directory} holds a run with seed {saved.seed}, not "
                    f"{history.seed}"
                )
            keep = [i for i, s in enumerate(saved.step) if s <= done and s % log_every == 0]
            history.step = [saved.step[i] for i in keep]
            history.elbo = [saved.elbo[i] for i in keep]
            history.wall_time = [saved.wall_time[i] for i in keep]
            # a history.json written before KL tempering existed has no weights: those runs used 1
            weights = (
                saved.kl_weight
                if len(saved.kl_weight) == len(saved.step)
                else [1.0] * len(saved.step)
            )
            history.kl_weight = [weights[i] for i in keep]
        history.resumed_from = done
        return done

    def due(self, step: int, steps: int) -> bool:
        """Whether to save after completing ``step`` steps of ``steps``."""
        return step % self.every == 0 or step == steps

    def save(self, step: int, history: History) -> None:
        self._manager.save(checkpoint_number=step)
        with open(os.path.join(self.directory, _HISTORY_FILE), "w") as fh:
            fh.write(history.to_json())

    def _load_history(self) -> Optional[History]:
        path = os.path.join(self.directory, _HISTORY_FILE)
        if not os.path.exists(path):
            return None
        with open(path) as fh:
            return History.from_json(fh.read())
