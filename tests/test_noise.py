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


def test_fixed_noise_checks_shapes_and_names():
    noise = FixedNoise({"f/0": np.zeros((2, 3))})
    with pytest.raises(KeyError, match="f/1"):
        noise.normal("f/1", [2, 3], tf.float64)
    with pytest.raises(Exception, match="wrong shape"):
        noise.normal("f/0", [3, 3], tf.float64)
