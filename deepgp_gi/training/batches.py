"""The seeded minibatch and Monte Carlo noise streams, and the ``tf.data`` pipelines of ``fit``.

Both pipelines yield ``(step, X_b, Y_b)`` for ``step = start .. steps-1``, so a resumed run sees
exactly the batches an uninterrupted one would have seen from ``start`` on.
"""

from __future__ import annotations

import tensorflow as tf

from ..noise import SeededNoise

__all__ = ["batch_indices", "step_noise", "array_batches", "dataset_batches"]

_BATCH_STREAM = 1
_NOISE_STREAM = 2


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


def step_noise(seed: int, step: tf.Tensor) -> SeededNoise:
    """The Monte Carlo noise source of step ``step``: stateless in ``(seed, step, name)``.

    :class:`~deepgp_gi.noise.SeededNoise` draws from a counter-based generator, so the numbers
    are the same whether the step runs through TensorFlow's kernels or is compiled with XLA (the
    step seed is folded in with Philox, whose integer output XLA reproduces).
    """
    stream = tf.constant([seed, _NOISE_STREAM], tf.int64)
    return SeededNoise(
        tf.random.experimental.stateless_fold_in(stream, tf.cast(step, tf.int64), alg="philox")
    )


def array_batches(X, Y, start: int, steps: int, batch_size: int, seed: int) -> tf.data.Dataset:
    """``(step, X_b, Y_b)`` for steps ``start`` to ``steps - 1`` of the seeded minibatch stream."""
    N = int(X.shape[0])

    def take(step):
        idx = batch_indices(step, N, batch_size, seed)
        return step, tf.gather(X, idx), tf.gather(Y, idx)

    return tf.data.Dataset.range(start, steps).map(take).prefetch(2)


def dataset_batches(
    data: tf.data.Dataset, start: int, steps: int, dtype: tf.DType
) -> tf.data.Dataset:
    """``(step, X_b, Y_b)`` for steps ``start`` to ``steps - 1`` of a user's dataset of batches.

    The dataset is repeated *before* the ``start`` batches already used are skipped, so a resume
    point past the end of one pass lands where an uninterrupted run would be (skipping first and
    repeating after would give an empty dataset). Cycling through a finite dataset is
    deterministic when the dataset is (e.g. ``shuffle`` with a ``seed``).
    """
    batches = data.repeat().skip(start).take(steps - start)
    batches = tf.data.Dataset.zip((tf.data.Dataset.range(start, steps), batches))
    return batches.map(lambda s, xy: (s, tf.cast(xy[0], dtype), tf.cast(xy[1], dtype)))
