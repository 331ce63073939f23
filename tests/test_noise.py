"""Noise sources: the counter-based generator behind SeededNoise and its XLA-safe Gamma draws."""
import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

from deepgp_gi.noise import FixedNoise, SeededNoise, counter_uniform, derive_key, stateless_gamma


@pytest.mark.parametrize("dtype", [tf.float64, tf.float32])
def test_seeded_normal_is_standard_normal_and_independent_across_names(dtype):
    source = SeededNoise(tf.constant([3, 4], tf.int64))
    x = source.normal("f/0", [50_000], dtype).numpy().astype(np.float64)
    assert scipy.stats.kstest(x, "norm").pvalue > 1e-3
    assert abs(x.mean()) < 4.5 / np.sqrt(x.size) and abs(x.var() - 1) < 4.5 * np.sqrt(2 / x.size)
    y = source.normal("f/1", [50_000], dtype).numpy().astype(np.float64)
    z = SeededNoise(tf.constant([3, 5], tf.int64)).normal("f/0", [50_000], dtype).numpy().astype(np.float64)
    for other in (y, z, np.roll(x, 1)):
        assert abs(np.corrcoef(x, other)[0, 1]) < 4.5 / np.sqrt(x.size)


def test_uniform_is_inside_the_open_interval():
    u = counter_uniform([200_000], derive_key(tf.constant([0, 0], tf.int64)), tf.float32).numpy()
    assert u.min() > 0 and u.max() < 1
    assert scipy.stats.kstest(u, "uniform").pvalue > 1e-3


def test_seeded_draws_agree_eagerly_compiled_and_under_xla():
    source = SeededNoise(tf.constant([7, 1], tf.int64))

    def draw():
        return source.normal("u/2", [8, 300], tf.float64)

    eager = draw().numpy()
    np.testing.assert_array_equal(tf.function(draw)().numpy(), eager)
    np.testing.assert_allclose(tf.function(draw, jit_compile=True)().numpy(), eager, rtol=0, atol=1e-14)


@pytest.mark.parametrize("alpha", [0.4, 2.0, 30.0])
def test_stateless_gamma_distribution_and_implicit_gradient(alpha):
    """Gamma(alpha, 1) by KS test; d E[g] / d alpha = 1 (E[g] = alpha) from the implicit
    reparameterisation gradients, and the same draws under XLA."""
    a = tf.Variable(alpha, dtype=tf.float64)

    def draw():
        with tf.GradientTape() as tape:
            g = stateless_gamma([40_000], derive_key(tf.constant([1, 2], tf.int64), 5), a, tf.float64)
            mean = tf.reduce_mean(g)
        return g, tape.gradient(mean, a)

    g, grad = tf.function(draw)()
    assert scipy.stats.kstest(g.numpy(), scipy.stats.gamma(alpha).cdf).pvalue > 1e-3
    assert abs(float(grad) - 1.0) < 0.02
    g_xla, grad_xla = tf.function(draw, jit_compile=True)()
    np.testing.assert_allclose(g_xla.numpy(), g.numpy(), rtol=1e-12)
    np.testing.assert_allclose(float(grad_xla), float(grad), rtol=1e-10)


def test_seeded_draws_share_one_key_derivation_per_graph():
    """A step's draws cost one generator op each: the seed is scrambled once per graph, so ten
    names add no hashing ops over one name; the streams still differ by name, in and out of the
    compiled function alike."""
    source = SeededNoise(tf.constant([7, 1], tf.int64))

    def hashing_ops(num_names):
        @tf.function
        def draws():
            return [source.normal(f"f/{i}", [4], tf.float64) for i in range(num_names)]

        graph = draws.get_concrete_function().graph
        ops = [op.type for op in graph.get_operations()]
        return ops.count("BitwiseXor"), ops.count("StatelessRandomUniformFullIntV2"), draws()

    xor_1, gen_1, _ = hashing_ops(1)
    xor_10, gen_10, compiled = hashing_ops(10)
    assert xor_1 > 0 and xor_10 == xor_1 and (gen_1, gen_10) == (1, 10)
    eager = [source.normal(f"f/{i}", [4], tf.float64).numpy() for i in range(10)]
    np.testing.assert_array_equal(np.stack([c.numpy() for c in compiled]), np.stack(eager))
    assert len({tuple(e) for e in eager}) == 10


def test_seeded_gamma_draws_differ_by_name():
    source = SeededNoise(tf.constant([2, 9], tf.int64))
    g1, g2 = (source.gamma(name, [2_000], 2.0, tf.float64).numpy() for name in ("s/0", "s/1"))
    assert abs(np.corrcoef(g1, g2)[0, 1]) < 4.5 / np.sqrt(g1.size)


def test_fixed_noise_checks_shapes_and_names():
    noise = FixedNoise({"f/0": np.zeros((2, 3))})
    with pytest.raises(KeyError, match="f/1"):
        noise.normal("f/1", [2, 3], tf.float64)
    with pytest.raises(Exception, match="wrong shape"):
        noise.normal("f/0", [3, 3], tf.float64)
