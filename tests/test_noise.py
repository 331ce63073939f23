"""Noise sources: the counter-based generator behind SeededNoise and its XLA-safe Gamma draws."""

import numpy as np
import pytest
import scipy.special
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
    z = (
        SeededNoise(tf.constant([3, 5], tf.int64))
        .normal("f/0", [50_000], dtype)
        .numpy()
        .astype(np.float64)
    )
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
    np.testing.assert_allclose(
        tf.function(draw, jit_compile=True)().numpy(), eager, rtol=0, atol=1e-14
    )


@pytest.mark.parametrize("alpha", [0.4, 2.0, 30.0])
def test_stateless_gamma_distribution_and_implicit_gradient(alpha):
    """Gamma(alpha, 1) by KS test; d E[g] / d alpha = 1 (E[g] = alpha) from the implicit
    reparameterisation gradients, and the same draws under XLA."""
    a = tf.Variable(alpha, dtype=tf.float64)

    def draw():
        with tf.GradientTape() as tape:
            g = stateless_gamma(
                [40_000], derive_key(tf.constant([1, 2], tf.int64), 5), a, tf.float64
            )
            mean = tf.reduce_mean(g)
        return g, tape.gradient(mean, a)

    g, grad = tf.function(draw)()
    assert scipy.stats.kstest(g.numpy(), scipy.stats.gamma(alpha).cdf).pvalue > 1e-3
    assert abs(float(grad) - 1.0) < 0.02
    g_xla, grad_xla = tf.function(draw, jit_compile=True)()
    np.testing.assert_allclose(g_xla.numpy(), g.numpy(), rtol=1e-12)
    np.testing.assert_allclose(float(grad_xla), float(grad), rtol=1e-10)


def test_seeded_draws_share_one_key_derivation_per_graph():
    """A step's draws cost one generator op each: the seed is turned into a key once per graph
    (itself one generator op), so ten names add nine generator ops over one name and nothing
    else; the streams still differ by name, in and out of the compiled function alike."""
    source = SeededNoise(tf.constant([7, 1], tf.int64))

    def graph_ops(num_names):
        @tf.function
        def draws():
            return [source.normal(f"f/{i}", [4], tf.float64) for i in range(num_names)]

        graph = draws.get_concrete_function().graph
        return [op.type for op in graph.get_operations()], draws()

    ops_1, _ = graph_ops(1)
    ops_10, compiled = graph_ops(10)
    assert ops_1.count("StatelessRandomUniformFullIntV2") == 2  # the key and the draw
    assert ops_10.count("StatelessRandomUniformFullIntV2") == 11
    # per name: the generator, a cast, a multiply-add and the quantile (constants aside)

    def work(ops):
        return [t for t in ops if t not in ("Const", "Identity", "NoOp")]

    assert len(work(ops_10)) - len(work(ops_1)) == 9 * 5
    eager = [source.normal(f"f/{i}", [4], tf.float64).numpy() for i in range(10)]
    np.testing.assert_array_equal(np.stack([c.numpy() for c in compiled]), np.stack(eager))
    assert len({tuple(e) for e in eager}) == 10


@pytest.mark.parametrize("dtype", [tf.float64, tf.float32])
def test_counter_normal_is_standard_normal_with_a_finite_capped_tail(dtype):
    """10^5 inverse-CDF draws: KS test and the first four moments of N(0, 1); the grid's extreme
    words give the largest |z| the generator can produce (2^-33 and 1 - 2^-33 in float64, 2^-24
    and 1 - 2^-24 in float32), finite and symmetric, eagerly and under XLA."""
    from deepgp_gi.noise import _ndtri, _unit_interval, counter_normal

    n = 100_000
    x = (
        counter_normal([n], derive_key(tf.constant([11, 3], tf.int64)), dtype)
        .numpy()
        .astype(np.float64)
    )
    assert scipy.stats.kstest(x, "norm").pvalue > 1e-3
    se = 1 / np.sqrt(n)
    assert abs(x.mean()) < 4.5 * se and abs(x.var() - 1) < 4.5 * np.sqrt(2) * se
    assert (
        abs(scipy.stats.skew(x)) < 4.5 * np.sqrt(6) * se
        and abs(scipy.stats.kurtosis(x)) < 4.5 * np.sqrt(24) * se
    )
    words = tf.constant([0, 2**32 - 1], tf.uint32)
    cap = {tf.float64: scipy.special.ndtri(2.0**-33), tf.float32: scipy.special.ndtri(2.0**-24)}[
        dtype
    ]
    for ends in (
        _ndtri(_unit_interval(words, dtype)),
        tf.function(lambda: _ndtri(_unit_interval(words, dtype)), jit_compile=True)(),
    ):
        ends = ends.numpy().astype(np.float64)
        assert np.all(np.isfinite(ends)) and ends[0] == -ends[1]
        np.testing.assert_allclose(
            ends, [cap, -cap], rtol={tf.float64: 1e-14, tf.float32: 1e-6}[dtype]
        )
    assert np.abs(x).max() <= -cap


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
