"""Sources of standard-normal noise for the stochastic steps of every posterior.

Every random draw in a forward pass goes through a :class:`NoiseSource` with a name (``"f/0"``
for the data-row noise of layer 0, ``"u/1"`` for the inducing-row noise of layer 1, ...). Three
sources exist:

* :class:`RandomNoise` — fresh draws from TensorFlow's global generator (interactive use);
* :class:`SeededNoise` — stateless draws that are a pure function of a ``[2]`` integer seed and
  the draw's name, so a training step is reproducible from ``(seed, step)`` alone (this is how
  ``fit`` resumes exactly);
* :class:`FixedNoise` — pre-drawn tensors looked up by name, so two code paths (say fully-coupled
  and mean-field) can be compared under identical noise in tests.
"""
from __future__ import annotations

import zlib
from typing import Dict, Mapping, Optional, Sequence, Union

import tensorflow as tf

__all__ = ["NoiseSource", "RandomNoise", "SeededNoise", "FixedNoise", "as_noise_source"]


class NoiseSource:
    """Interface: ``normal(name, shape, dtype)`` returns standard-normal draws."""

    def normal(self, name: str, shape, dtype: tf.DType) -> tf.Tensor:  # pragma: no cover
        raise NotImplementedError

    def gamma(self, name: str, shape, alpha, dtype: tf.DType) -> tf.Tensor:
        """Gamma(alpha, 1) draws (reparameterised by TensorFlow's implicit gradients)."""
        raise NotImplementedError(f"{type(self).__name__} does not provide Gamma draws")


class RandomNoise(NoiseSource):
    """Fresh draws from TensorFlow's global random generator."""

    def normal(self, name, shape, dtype):
        return tf.random.normal(shape, dtype=dtype)

    def gamma(self, name, shape, alpha, dtype):
        return tf.random.gamma(shape, alpha, dtype=dtype)


def _name_key(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


class SeededNoise(NoiseSource):
    """Stateless draws determined by ``seed`` (an int or a ``[2]`` int tensor) and the name."""

    def __init__(self, seed):
        if isinstance(seed, int):
            seed = [seed, 0]
        self.seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)

    def _seed_for(self, name: str) -> tf.Tensor:
        return tf.random.experimental.stateless_fold_in(self.seed, _name_key(name))

    def normal(self, name, shape, dtype):
        return tf.random.stateless_normal(shape, seed=self._seed_for(name), dtype=dtype)

    def gamma(self, name, shape, alpha, dtype):
        alpha = tf.convert_to_tensor(alpha, dtype)
        return tf.random.stateless_gamma(shape, seed=self._seed_for(name), alpha=alpha, dtype=dtype)


class FixedNoise(NoiseSource):
    """Pre-drawn noise by name. Unknown names fall back to ``fallback`` (default: an error)."""

    def __init__(self, draws: Mapping[str, tf.Tensor], fallback: Optional[NoiseSource] = None):
        self.draws: Dict[str, tf.Tensor] = dict(draws)
        self.fallback = fallback

    def normal(self, name, shape, dtype):
        if name not in self.draws:
            if self.fallback is None:
                raise KeyError(f"FixedNoise has no draw named {name!r}; it has {sorted(self.draws)}")
            return self.fallback.normal(name, shape, dtype)
        value = tf.cast(self.draws[name], dtype)
        tf.debugging.assert_equal(
            tf.shape(value), tf.cast(shape, tf.int32), message=f"FixedNoise draw {name!r} has the wrong shape"
        )
        return value

    def gamma(self, name, shape, alpha, dtype):
        if name in self.draws:
            return tf.cast(self.draws[name], dtype)
        if self.fallback is None:
            raise KeyError(f"FixedNoise has no draw named {name!r}")
        return self.fallback.gamma(name, shape, alpha, dtype)


NoiseLike = Union[None, int, NoiseSource, Sequence[int], tf.Tensor]


def as_noise_source(noise: NoiseLike) -> NoiseSource:
    """``None`` -> :class:`RandomNoise`; an int or ``[2]`` seed -> :class:`SeededNoise`."""
    if noise is None:
        return RandomNoise()
    if isinstance(noise, NoiseSource):
        return noise
    return SeededNoise(noise)
