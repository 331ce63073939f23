"""The seeded minibatch and Monte Carlo noise streams, and the ``tf.data`` pipelines of ``fit``.

Both pipelines yield ``(step, X_b, Y_b)`` for ``step = start .. steps-1``, so a resumed run sees
exactly the batches an uninterrupted one would have seen from ``start`` on.
"""
from __future__ import annotations

import zlib

import numpy as np
import tensorflow as tf

from ..noise import NoiseSource

__all__ = ["batch_indices", "StepNoise", "step_noise", "array_batches", "dataset_batches"]

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


class StepNoise(NoiseSource):
    """The Monte Carlo noise of one training step: stateless in ``(seed, step, name)``.

    Unlike :class:`~deepgp_gi.noise.SeededNoise`, the draws are the same whether the step runs
    through TensorFlow's kernels or is compiled with XLA: TensorFlow's ``stateless_normal`` (and
    ``stateless_uniform`` for floats, and any draw from a seed outside the int32 range under the
    default algorithm) gives other numbers under XLA, so this source asks only for Philox integer
    bits (identical on both paths) and turns them into normals itself (Box-Muller on 53-bit
    uniforms in the open interval (0, 1), computed in float64). Gamma draws use
    ``tf.random.stateless_gamma``, which XLA cannot compile.
    """

    _ALG = "philox"

    def __init__(self, seed: int, step):
        stream = tf.constant([seed, _NOISE_STREAM], tf.int64)
        self.seed = tf.random.experimental.stateless_fold_in(stream, tf.cast(step, tf.int64), alg=self._ALG)

    def _seed_for(self, name: str) -> tf.Tensor:
        key = zlib.crc32(name.encode()) & 0x7FFFFFFF
        return tf.random.experimental.stateless_fold_in(self.seed, key, alg=self._ALG)

    def normal(self, name, shape, dtype):
        shape = tf.cast(shape, tf.int32)
        bits = tf.random.stateless_uniform(
            tf.concat([[2], shape], 0), seed=self._seed_for(name), minval=None, maxval=None,
            dtype=tf.uint64, alg=self._ALG,
        )
        top53 = tf.bitwise.right_shift(bits, tf.constant(11, tf.uint64))
        u = (tf.cast(top53, tf.float64) + 0.5) * 2.0**-53  # in (0, 1), never 0 or 1
        z = tf.sqrt(-2.0 * tf.math.log(u[0])) * tf.cos((2.0 * np.pi) * u[1])
        return tf.cast(z, dtype)

    def gamma(self, name, shape, alpha, dtype):
        alpha = tf.convert_to_tensor(alpha, dtype)
        return tf.random.stateless_gamma(shape, seed=self._seed_for(name), alpha=alpha, dtype=dtype)


def step_noise(seed: int, step: tf.Tensor) -> StepNoise:
    """The Monte Carlo noise source of step ``step``: stateless in ``(seed, step)``."""
    return StepNoise(seed, step)


def array_batches(X, Y, start: int, steps: int, batch_size: int, seed: int) -> tf.data.Dataset:
    """``(step, X_b, Y_b)`` for steps ``start .. steps-1`` of the seeded minibatch stream."""
    N = int(X.shape[0])

    def take(step):
        idx = batch_indices(step, N, batch_size, seed)
        return step, tf.gather(X, idx), tf.gather(Y, idx)

    return tf.data.Dataset.range(start, steps).map(take).prefetch(2)


def dataset_batches(data: tf.data.Dataset, start: int, steps: int, dtype: tf.DType) -> tf.data.Dataset:
    """``(step, X_b, Y_b)`` for steps ``start .. steps-1`` of a user's dataset of batches.

    The dataset is repeated *before* the ``start`` batches already used are skipped, so a resume
    point past the end of one pass lands where an uninterrupted run would be (skipping first and
    repeating after would give an empty dataset). Cycling through a finite dataset is
    deterministic when the dataset is (e.g. ``shuffle`` with a ``seed``).
    """
    batches = data.repeat().skip(start).take(steps - start)
    batches = tf.data.Dataset.zip((tf.data.Dataset.range(start, steps), batches))
    return batches.map(lambda s, xy: (s, tf.cast(xy[0], dtype), tf.cast(xy[1], dtype)))
