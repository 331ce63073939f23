"""``fit``: Adam on the ELBO with one compiled step, tf.data minibatches, progress, checkpoints.

Reproducibility and exact resumption come from making every random quantity a pure function of
``(seed, step)``: the minibatch of step ``t`` is a slice of epoch ``t // batches_per_epoch``'s
permutation, drawn statelessly from ``(seed, epoch)``, and the Monte Carlo noise of step ``t`` is
drawn statelessly from ``(seed, t)``. A checkpoint therefore needs only the model, the optimiser
state and the step count; a resumed run replays exactly the batches and noise an uninterrupted
run would have used.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Union

import gpflow
import numpy as np
import tensorflow as tf
from tqdm.auto import tqdm

from .models import DeepGP
from .noise import SeededNoise
from .validation import check_positive_int

__all__ = ["fit", "History", "batch_indices"]

_BATCH_STREAM = 1
_NOISE_STREAM = 2


@dataclass
class History:
    """What ``fit`` recorded: the ELBO estimate (full-data units) at logged steps, and timings."""

    step: List[int] = field(default_factory=list)
    elbo: List[float] = field(default_factory=list)
    wall_time: List[float] = field(default_factory=list)
    seed: Optional[int] = None
    num_data: Optional[int] = None
    resumed_from: int = 0

    @property
    def elbo_per_datapoint(self) -> List[float]:
        return [e / self.num_data for e in self.elbo] if self.num_data else list(self.elbo)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "History":
        return cls(**json.loads(text))


def batch_indices(step: tf.Tensor, num_data: int, batch_size: int, seed: int) -> tf.Tensor:
    """Row indices of step ``step``'s minibatch: a slice of a seeded per-epoch permutation.

    Epochs have ``ceil(num_data / batch_size)`` batches; the last batch of an epoch is smaller
    when ``batch_size`` does not divide ``num_data``. With ``batch_size == num_data`` every batch
    is the whole data set in its original order.
    """
    if batch_size >= num_data:
        return tf.range(num_data, dtype=tf.int64)
    per_epoch = -(-num_data // batch_size)
    step = tf.cast(step, tf.int64)
    epoch, b = step // per_epoch, step % per_epoch
    stream = tf.constant([seed, _BATCH_STREAM], tf.int64)
    epoch_seed = tf.random.experimental.stateless_fold_in(stream, epoch)
    keys = tf.random.stateless_uniform([num_data], seed=epoch_seed, dtype=tf.float64)
    perm = tf.argsort(keys, stable=True)
    start = b * batch_size
    stop = tf.minimum(start + batch_size, num_data)
    return tf.cast(perm[start:stop], tf.int64)


def _step_noise(seed: int, step: tf.Tensor) -> SeededNoise:
    stream = tf.constant([seed, _NOISE_STREAM], tf.int64)
    return SeededNoise(tf.random.experimental.stateless_fold_in(stream, tf.cast(step, tf.int64)))


def _array_dataset(X, Y, start: int, steps: int, batch_size: int, seed: int) -> tf.data.Dataset:
    N = int(X.shape[0])

    def take(step):
        idx = batch_indices(step, N, batch_size, seed)
        return step, tf.gather(X, idx), tf.gather(Y, idx)

    return tf.data.Dataset.range(start, steps).map(take).prefetch(2)


def fit(
    model: DeepGP,
    data,
    *,
    steps: int,
    batch_size: Optional[int] = None,
    learning_rate: float = 0.01,
    num_samples: int = 1,
    seed: Optional[int] = None,
    progress: bool = True,
    checkpoint_dir: Optional[Union[str, os.PathLike]] = None,
    checkpoint_every: Optional[int] = None,
    log_every: int = 10,
) -> History:
    """Maximise ``model``'s ELBO with Adam.

    :param model: a :class:`~deepgp_gi.DeepGP`.
    :param data: ``(X, Y)`` arrays, or a ``tf.data.Dataset`` of ``(X, Y)`` batches (then
        ``model.num_data`` must be set, and a resumed run skips the batches already used).
    :param steps: total number of optimisation steps (a resumed run does the remainder).
    :param batch_size: minibatch size for array data; ``None`` means the full data set.
    :param learning_rate: Adam's learning rate.
    :param num_samples: Monte Carlo samples per step.
    :param seed: seeds minibatches and Monte Carlo noise; ``None`` draws one (recorded in the
        returned history).
    :param progress: show a tqdm progress bar with the current ELBO per data point.
    :param checkpoint_dir: where to save the model, optimiser state and step count; a later call
        with the same arguments resumes from the latest checkpoint there.
    :param checkpoint_every: steps between checkpoints (default ``max(100, steps // 20)``).
    :param log_every: steps between entries of the history (and progress-bar updates).
    :return: a :class:`History`.
    """
    if not isinstance(model, DeepGP):
        raise TypeError(f"model must be a deepgp_gi.DeepGP, got {type(model).__name__}")
    steps = check_positive_int(steps, "steps")
    num_samples = check_positive_int(num_samples, "num_samples")
    log_every = check_positive_int(log_every, "log_every")
    if not (isinstance(learning_rate, (float, int)) and np.isfinite(learning_rate) and learning_rate > 0):
        raise ValueError(f"learning_rate must be a positive finite number, got {learning_rate!r}")
    if seed is None:
        seed = int(np.random.default_rng().integers(0, 2**31 - 1))
    elif isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an integer or None, got {seed!r}")
    seed = int(seed)

    is_dataset = isinstance(data, tf.data.Dataset)
    if is_dataset:
        if batch_size is not None:
            raise ValueError("batch_size is only for array data; batch the tf.data.Dataset itself")
        if model.num_data is None:
            raise ValueError("model.num_data must be set to train on a tf.data.Dataset of minibatches")
        N = model.num_data
    else:
        X, Y = model.check_data(data)
        N = int(X.shape[0])
        if batch_size is None:
            batch_size = N
        batch_size = check_positive_int(batch_size, "batch_size")
        if batch_size > N:
            raise ValueError(f"batch_size={batch_size} exceeds the number of data points N={N}")
        if batch_size < N and model.num_data is None:
            raise ValueError("model.num_data is None but batch_size < N: build the model with num_data=N")
        if model.num_data is not None and model.num_data != N:
            raise ValueError(f"model.num_data={model.num_data} but the data has N={N} rows")

    optimizer = gpflow.keras.tf_keras.optimizers.Adam(learning_rate)
    variables = model.trainable_variables
    optimizer.build(variables)
    step_var = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")

    history = History(seed=seed, num_data=N)
    manager = None
    if checkpoint_dir is not None:
        os.makedirs(checkpoint_dir, exist_ok=True)
        ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step_var)
        manager = tf.train.CheckpointManager(ckpt, os.fspath(checkpoint_dir), max_to_keep=2)
        if manager.latest_checkpoint:
            ckpt.restore(manager.latest_checkpoint).assert_existing_objects_matched()
            hist_path = os.path.join(checkpoint_dir, "history.json")
            if os.path.exists(hist_path):
                with open(hist_path) as fh:
                    saved = History.from_json(fh.read())
                if saved.seed != seed:
                    raise ValueError(
                        f"checkpoint_dir {checkpoint_dir} holds a run with seed {saved.seed}, not {seed}"
                    )
                # keep the regular log entries; an entry logged only because an earlier call ended
                # off the log_every grid is not part of an uninterrupted run's history
                done = int(step_var.numpy())
                keep = [i for i, s in enumerate(saved.step) if s <= done and s % log_every == 0]
                history.step = [saved.step[i] for i in keep]
                history.elbo = [saved.elbo[i] for i in keep]
                history.wall_time = [saved.wall_time[i] for i in keep]
            history.resumed_from = int(step_var.numpy())
        if checkpoint_every is None:
            checkpoint_every = max(100, steps // 20)
        checkpoint_every = check_positive_int(checkpoint_every, "checkpoint_every")

    start = int(step_var.numpy())
    if start >= steps:
        return history

    dtype = model.dtype
    if is_dataset:
        spec_x, spec_y = data.element_spec
        batches = data.skip(start).repeat().take(steps - start)
        batches = tf.data.Dataset.zip((tf.data.Dataset.range(start, steps), batches))
        batches = batches.map(lambda s, xy: (s, tf.cast(xy[0], dtype), tf.cast(xy[1], dtype)))
    else:
        batches = _array_dataset(X, Y, start, steps, batch_size, seed)

    signature = [
        tf.TensorSpec([], tf.int64),
        tf.TensorSpec([None, model.input_dim], dtype),
        tf.TensorSpec([None, None], dtype),
    ]

    # autograph off: the step has no Python control flow on tensor values (tracing is 3-4x faster)
    @tf.function(input_signature=signature, autograph=False)
    def train_step(step, X_b, Y_b):
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(variables)
            elbo = model.elbo((X_b, Y_b), num_samples, _step_noise(seed, step))
            loss = -(elbo + model.log_prior_density())
        grads = tape.gradient(loss, variables)
        optimizer.apply_gradients(zip(grads, variables))
        step_var.assign(step + 1)
        return elbo

    bar = tqdm(total=steps, initial=start, disable=not progress, desc="fit", dynamic_ncols=True)
    t0 = time.perf_counter() - (history.wall_time[-1] if history.wall_time else 0.0)
    try:
        for step, X_b, Y_b in batches:
            elbo = train_step(step, X_b, Y_b)
            t = int(step.numpy()) + 1
            if t % log_every == 0 or t == steps:
                value = float(elbo.numpy())
                if not np.isfinite(value):
                    raise FloatingPointError(
                        f"the ELBO became {value} at step {t}; lower the learning rate or check the data"
                    )
                history.step.append(t)
                history.elbo.append(value)
                history.wall_time.append(time.perf_counter() - t0)
                bar.set_postfix(elbo_per_point=f"{value / N:.4f}")
            bar.update(1)
            if manager is not None and (t % checkpoint_every == 0 or t == steps):
                manager.save(checkpoint_number=t)
                with open(os.path.join(checkpoint_dir, "history.json"), "w") as fh:
                    fh.write(history.to_json())
    finally:
        bar.close()
    return history
