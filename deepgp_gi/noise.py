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

from .linalg import in_xla_context

__all__ = [
    "NoiseSource",
    "RandomNoise",
    "SeededNoise",
    "FixedNoise",
    "as_noise_source",
    "stateless_gamma",
    "counter_normal",
    "counter_uniform",
    "derive_key",
    "RowSlice",
]


class NoiseSource:
    """Interface: ``normal(name, shape, dtype)`` returns standard-normal draws."""

    def normal(self, name: str, shape, dtype: tf.DType) -> tf.Tensor:  # pragma: no cover
        raise NotImplementedError

    def gamma(self, name: str, shape, alpha, dtype: tf.DType) -> tf.Tensor:
        """Gamma(alpha, 1) draws of shape ``shape`` (reparameterised by TensorFlow's implicit
        gradients); ``alpha`` is a scalar or a tensor that broadcasts to ``shape``."""
        raise NotImplementedError(f"{type(self).__name__} does not provide Gamma draws")


class RandomNoise(NoiseSource):
    """Fresh draws from TensorFlow's global random generator."""

    def normal(self, name, shape, dtype):
        return tf.random.normal(shape, dtype=dtype)

    def gamma(self, name, shape, alpha, dtype):
        alpha = tf.convert_to_tensor(alpha, dtype=dtype)
        if alpha.shape.rank == 0:
            return tf.random.gamma(shape, alpha, dtype=dtype)
        # tf.random.gamma's output shape is ``shape + alpha.shape``: broadcast alpha instead.
        return tf.random.gamma([], tf.broadcast_to(alpha, shape), dtype=dtype)


def _name_key(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


#: Proposals per Gamma draw in :func:`stateless_gamma` (Marsaglia-Tsang accepts each with
#: probability > 0.95 for shape >= 1, so all 16 fail with probability < 1e-20).
GAMMA_PROPOSALS = 16

_GOLDEN64 = 0x9E3779B97F4A7C15
_PHILOX = 1  # TensorFlow's enum value of the Philox-4x32 algorithm


def _mix64(x: int) -> int:
    """SplitMix64's finaliser: a bijective 64-bit integer hash, evaluated in Python."""
    x &= 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def _philox(shape, key: tf.Tensor, counter: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """Philox-4x32 full-range integers of ``shape`` under a ``[1]`` uint64 key, the 128-bit
    counter starting at ``counter`` (``[2]`` uint64, low word first)."""
    return tf.raw_ops.StatelessRandomUniformFullIntV2(
        shape=shape, key=key, counter=counter, alg=tf.constant(_PHILOX, tf.int32), dtype=dtype
    )


def derive_key(seed: tf.Tensor, data: int = 0) -> tf.Tensor:
    """The ``[1]`` uint64 Philox key of an int ``[2]`` seed and an integer (e.g. a draw's name).

    The seed's 128 bits are the counter of one Philox block under a key fixed by ``data`` (hashed
    in Python), and the block's first 64 bits are the key: two ops per key, and distinct seeds
    give unrelated keys (Philox is a bijection of its counter for each key).
    """
    seed = tf.convert_to_tensor(seed)
    if seed.dtype != tf.int64:
        seed = tf.cast(seed, tf.int64)
    if seed.shape != [2]:
        seed = tf.reshape(seed, [2])
    key = tf.constant([_mix64((data & 0xFFFFFFFFFFFFFFFF) ^ _GOLDEN64)], tf.uint64)
    return _philox([1], key, tf.bitcast(seed, tf.uint64), tf.uint64)


def _key64(key: tf.Tensor) -> tf.Tensor:
    """A key as Philox's ``[1]`` uint64 (:func:`derive_key`'s form; a ``[2]`` uint32 key is
    reinterpreted)."""
    key = tf.convert_to_tensor(key)
    if key.dtype == tf.uint64 and key.shape == [1]:
        return key
    return tf.reshape(
        tf.bitcast(tf.reshape(key, [-1, 2]), tf.uint64) if key.dtype == tf.uint32 else key, [1]
    )


def _static_shape(shape):
    """``shape`` as a list of ints when it is known at trace time (so the generator's shape
    argument is a constant and no size arithmetic runs), else the int32 tensor."""
    if isinstance(shape, tf.TensorShape):
        shape = shape.as_list() if shape.is_fully_defined() else None
    if isinstance(shape, (list, tuple)) and all(isinstance(d, int) for d in shape):
        return [int(d) for d in shape]
    tensor = tf.cast(shape, tf.int32)
    value = tf.get_static_value(tensor)
    return tensor if value is None else [int(d) for d in value]


def _counter_words(shape, key: tf.Tensor, stream: int = 0) -> tf.Tensor:
    """Pseudo-random uint32 words of ``shape``: Philox-4x32 under ``key`` with its 128-bit
    counter starting at ``stream * 2^64``, so streams of one key never overlap (a draw would
    need 2^64 blocks). Philox's full-range integer output is what TensorFlow's kernels and XLA
    produce identically (its float outputs differ). One op per draw."""
    counter = tf.constant([0, stream & 0xFFFFFFFFFFFFFFFF], tf.uint64)
    return _philox(_static_shape(shape), _key64(key), counter, tf.uint32)


def _unit_interval(words: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
    """Uniform on a grid of the open interval (0, 1), exact in ``dtype``: ``(w + 1/2) 2^-32`` for
    32-bit words in float64 (a cast and one multiply-add); in lower precisions the top 23 bits,
    ``(t + 1/2) 2^-23``, whose largest value ``1 - 2^-24`` is still below 1 in float32."""
    if dtype == tf.float64:
        return tf.cast(words, tf.float64) * 2.0**-32 + 2.0**-33
    top = tf.bitwise.right_shift(words, tf.constant(9, tf.uint32))
    u = tf.cast(top, tf.float32) * 2.0**-23 + 2.0**-24
    return u if dtype == tf.float32 else tf.cast(u, dtype)


def _ndtri(u: tf.Tensor) -> tf.Tensor:
    """The standard-normal quantile of ``u``. TensorFlow's kernel (Cephes' ``ndtri``) is accurate
    to a few ulps; XLA lowers it through its ``ErfInv``, whose float64 error reaches 1e-12 beyond
    |z| = 4, so in an XLA context one Newton step on the smaller tail probability ``q`` (exact on
    the grid of :func:`_unit_interval`) brings it back to the kernel's accuracy. XLA fuses the
    step, and plain execution never runs it."""
    z = tf.math.ndtri(u)
    if not in_xla_context():
        return z
    q = tf.minimum(u, 1.0 - u)
    lower = -tf.abs(z)  # the quantile of q
    residual = 0.5 * tf.math.erfc(-lower * 0.7071067811865476) - q
    density = tf.exp(-0.5 * tf.square(lower)) * 0.3989422804014327
    lower = lower - residual / density
    return tf.where(u < 0.5, lower, -lower)


def counter_uniform(shape, key: tf.Tensor, dtype: tf.DType, stream: int = 0) -> tf.Tensor:
    """Uniform draws in (0, 1) from Philox integer words (32 random bits each in float64, 23 in
    lower precisions).

    The words are Philox integers and the conversion is ours, so the same key gives the same
    draws eagerly, in a ``tf.function`` and under XLA (TensorFlow's own float draws differ
    between XLA and plain execution).
    """
    return _unit_interval(_counter_words(shape, key, stream), dtype)


def counter_normal(shape, key: tf.Tensor, dtype: tf.DType, stream: int = 0) -> tf.Tensor:
    """Standard normal draws by inversion, ``z = Phi^{-1}(u)`` of one :func:`counter_uniform`
    per draw (the generator, a cast, a multiply-add and the quantile: five ops in float64). The
    grid's extreme points cap ``|z|`` at 6.34 in float64 (``u = 2^-33``) and 5.33 in float32
    (``u = 2^-24``)."""
    return _ndtri(counter_uniform(shape, key, dtype, stream))


@tf.custom_gradient
def _implicit_gamma(alpha: tf.Tensor, sample: tf.Tensor):
    """``sample`` (a Gamma(alpha, 1) draw) with the implicit reparameterisation gradient
    ``d sample / d alpha = -(dF/d alpha) / p(sample)`` (Figurnov et al. 2018)."""

    def grad(upstream):
        return upstream * tf.raw_ops.RandomGammaGrad(alpha=alpha, sample=sample), tf.zeros_like(
            sample
        )

    return tf.identity(sample), grad


def stateless_gamma(
    shape, key: tf.Tensor, alpha: tf.Tensor, dtype: tf.DType, stream: int = 0
) -> tf.Tensor:
    """Gamma(alpha, 1) draws that compile with XLA and agree between plain and compiled code.

    Marsaglia & Tsang's method on :func:`counter_normal` / :func:`counter_uniform` with a fixed
    number of proposals (no loop), boosted by ``U^(1/alpha)`` for ``alpha < 1``; gradients with
    respect to ``alpha`` are the implicit reparameterisation gradients (as ``tf.random.gamma``'s).
    ``alpha`` broadcasts against ``shape``. Its three sub-draws use the Philox streams
    ``stream + 1 .. stream + 3`` of ``key`` (:class:`SeededNoise` spaces names' streams by 4).
    """
    alpha = tf.broadcast_to(tf.convert_to_tensor(alpha, dtype), shape)
    a = tf.stop_gradient(alpha)
    boosted = a < 1.0
    a1 = tf.where(boosted, a + 1.0, a)
    d = a1 - 1.0 / 3.0
    c = 1.0 / tf.sqrt(9.0 * d)
    full = tf.concat([[GAMMA_PROPOSALS], tf.shape(a)], 0)
    z = counter_normal(full, key, dtype, stream + 1)
    u = counter_uniform(full, key, dtype, stream + 2)
    v = tf.maximum(1.0 + c * z, 0.0) ** 3
    log_v = tf.math.log(tf.maximum(v, tf.experimental.numpy.finfo(dtype.as_numpy_dtype).tiny))
    accept = (v > 0.0) & (tf.math.log(u) < 0.5 * tf.square(z) + d - d * v + d * log_v)
    first = tf.argmax(tf.cast(accept, tf.int32), axis=0)  # the first accepted proposal
    v_by_draw = tf.transpose(tf.reshape(v, [GAMMA_PROPOSALS, -1]))  # [n, K]
    chosen = tf.gather(v_by_draw, tf.reshape(first, [-1, 1]), batch_dims=1)[:, 0]
    g = d * tf.reshape(chosen, tf.shape(a))
    boost = counter_uniform(tf.shape(a), key, dtype, stream + 3)
    g = tf.where(boosted, g * boost ** (1.0 / a), g)
    return _implicit_gamma(alpha, tf.stop_gradient(g))


class SeededNoise(NoiseSource):
    """Stateless draws determined by ``seed`` (an int or a ``[2]`` int tensor) and the name.

    Draws are Philox integer words turned into floats here (:func:`counter_normal`), so a seeded
    step gives the same numbers eagerly, in a ``tf.function`` and under XLA (to the last bit in
    the words, to a few ulps in the normal quantile).
    """

    def __init__(self, seed):
        if isinstance(seed, int):
            seed = [seed, 0]
        self.seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
        self._keys: Dict[int, tuple] = {}  # id(graph) -> (graph, key)

    def _key(self) -> tf.Tensor:
        """The Philox key of ``seed``, scrambled once per graph (a step's draws share it and
        differ by their streams, so a draw costs one generator op, not a key derivation)."""
        graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
        cached = self._keys.get(id(graph))
        if cached is None or cached[0] is not graph:
            cached = self._keys[id(graph)] = (graph, derive_key(self.seed))
        return cached[1]

    @staticmethod
    def _stream(name: str) -> int:
        return _name_key(name) << 2  # room for stateless_gamma's three sub-streams

    def normal(self, name, shape, dtype):
        return counter_normal(shape, self._key(), dtype, self._stream(name))

    def gamma(self, name, shape, alpha, dtype):
        return stateless_gamma(shape, self._key(), alpha, dtype, self._stream(name))


class FixedNoise(NoiseSource):
    """Pre-drawn noise by name. Unknown names fall back to ``fallback`` (default: an error)."""

    def __init__(self, draws: Mapping[str, tf.Tensor], fallback: Optional[NoiseSource] = None):
        self.draws: Dict[str, tf.Tensor] = dict(draws)
        self.fallback = fallback

    def normal(self, name, shape, dtype):
        if name not in self.draws:
            if self.fallback is None:
                raise KeyError(
                    f"FixedNoise has no draw named {name!r}; it has {sorted(self.draws)}"
                )
            return self.fallback.normal(name, shape, dtype)
        value = tf.cast(self.draws[name], dtype)
        tf.debugging.assert_equal(
            tf.shape(value),
            tf.cast(shape, tf.int32),
            message=f"FixedNoise draw {name!r} has the wrong shape",
        )
        return value

    def gamma(self, name, shape, alpha, dtype):
        if name in self.draws:
            return tf.cast(self.draws[name], dtype)
        if self.fallback is None:
            raise KeyError(f"FixedNoise has no draw named {name!r}")
        return self.fallback.gamma(name, shape, alpha, dtype)


class RowSlice(NoiseSource):
    """The draws of one data-parallel replica that holds rows ``[start, stop)`` of a batch of
    ``batch_rows``: each data-row draw (names ``"f/..."``, shaped ``[S, rows, ...]``) is that slice
    of the draw the whole batch would make, and every other draw (inducing rows, weights, scales)
    is the whole batch's, so replicas together reproduce one device's step exactly."""

    def __init__(self, source: NoiseSource, start, stop, batch_rows):
        self.source, self.start, self.stop, self.batch_rows = source, start, stop, batch_rows

    def normal(self, name, shape, dtype):
        if not name.startswith("f/"):
            return self.source.normal(name, shape, dtype)
        shape = tf.convert_to_tensor(shape, tf.int32)
        full = tf.concat([shape[:1], [self.batch_rows], shape[2:]], 0)
        return self.source.normal(name, full, dtype)[:, self.start : self.stop]

    def gamma(self, name, shape, alpha, dtype):
        return self.source.gamma(name, shape, alpha, dtype)


NoiseLike = Union[None, int, NoiseSource, Sequence[int], tf.Tensor]


def as_noise_source(noise: NoiseLike) -> NoiseSource:
    """``None`` -> :class:`RandomNoise`; an int or ``[2]`` seed -> :class:`SeededNoise`."""
    if noise is None:
        return RandomNoise()
    if isinstance(noise, NoiseSource):
        return noise
    return SeededNoise(noise)
