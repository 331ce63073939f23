"""Every layer's ``chol(K_uu)`` at once (``inducing_choleskies``): the per-layer factors, from one
batched factorisation per inducing count."""

import collections

import numpy as np
import pytest
import tensorflow as tf

import deepgp_gi as dg
from deepgp_gi.posteriors.conditionals import inducing_choleskies, inducing_cholesky, unit_variances


def _layers(rng, M, depth=3):
    X = rng.normal(size=(30, 3))
    Y = np.sin(X[:, :1])
    return dg.build_deep_gp(
        X, Y, depth=depth, posterior="mean_field", num_inducing=M, seed=0
    ).layers


def _cholesky_ops(fn) -> int:
    graph = tf.function(fn).get_concrete_function().graph
    return collections.Counter(op.type for op in graph.get_operations())["Cholesky"]


def test_equal_sizes_are_one_factorisation_with_the_per_layer_factors(rng):
    layers = _layers(rng, M=6)
    together = inducing_choleskies(layers)
    for layer, L in zip(layers, together):
        np.testing.assert_allclose(
            L.numpy(), inducing_cholesky(layer, layer.Z).numpy(), rtol=0, atol=0
        )
    assert _cholesky_ops(lambda: inducing_choleskies(layers)) == 1
    assert _cholesky_ops(lambda: [inducing_cholesky(l, l.Z) for l in layers]) == 3


def test_mixed_sizes_keep_the_layer_order_and_group_by_size(rng):
    small, large = _layers(rng, M=4), _layers(rng, M=7)
    layers = [small[0], large[1], small[1], large[2]]
    together = inducing_choleskies(layers)
    assert [L.shape[-1] for L in together] == [4, 7, 4, 7]
    for layer, L in zip(layers, together):
        np.testing.assert_allclose(
            L.numpy(), inducing_cholesky(layer, layer.Z).numpy(), rtol=0, atol=0
        )
    assert _cholesky_ops(lambda: inducing_choleskies(layers)) == 2


def test_a_singular_layer_is_repaired_alone(rng):
    """Two coinciding inducing inputs and a kernel variance so large that the white noise and
    GPflow's jitter are below its rounding make one layer's K_uu numerically singular: that member
    escalates its jitter, the others' factors are untouched."""
    layers = _layers(rng, M=5)
    Z = layers[1].Z.numpy()
    Z[1] = Z[0]
    layers[1].Z.assign(Z)
    se, white = layers[1].kernel.kernels
    se.variance.assign(1e14)
    white.variance.assign(1e-6)
    jittered = layers[1].K(layers[1].Z).numpy() + 1e-6 * np.eye(5)
    assert not np.all(np.isfinite(tf.linalg.cholesky(jittered).numpy()))
    together = inducing_choleskies(layers)
    for i in (0, 2):
        np.testing.assert_allclose(
            together[i].numpy(), inducing_cholesky(layers[i], layers[i].Z).numpy(), rtol=0, atol=0
        )
    assert np.all(np.isfinite(together[1].numpy()))
    np.testing.assert_allclose(
        together[1].numpy(), inducing_cholesky(layers[1], layers[1].Z).numpy(), rtol=1e-12
    )


def _unit_variances_by_autodiff(R, A):
    """The direct form ``|R^T A|^2`` per unit, differentiated by TensorFlow."""
    RA = tf.linalg.matmul(R, A[:, None], transpose_a=True)
    return tf.linalg.matrix_transpose(tf.reduce_sum(tf.square(RA), axis=-2))


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-5)])
@pytest.mark.parametrize("jit", [False, True])
def test_unit_variances_and_their_hand_written_gradient_match_autodiff(rng, dtype, rtol, jit):
    """unit_variances forms A^T (R R^T) A with a written-out gradient (2 C A, A diag(g) A^T): values
    and the gradients in R (lower-triangular, as q_sqrt) and A equal those of |R^T A|^2 under
    automatic differentiation, plain and under XLA, for a weighted sum of the variances."""
    S, P, M, N = 2, 3, 7, 11
    R = tf.constant(np.tril(rng.normal(size=(P, M, M))).astype(dtype))
    A = tf.constant(rng.normal(size=(S, M, N)).astype(dtype))
    W = tf.constant(rng.normal(size=(S, N, P)).astype(dtype))

    def value_and_grads(f):
        @tf.function(jit_compile=jit)
        def run(R, A):
            with tf.GradientTape() as tape:
                tape.watch([R, A])
                v = f(R, A)
                total = tf.reduce_sum(W * v)
            return (v,) + tuple(tape.gradient(total, [R, A]))

        return [t.numpy() for t in run(R, A)]

    ours = value_and_grads(unit_variances)
    direct = value_and_grads(_unit_variances_by_autodiff)
    lower = np.tril(np.ones((M, M), dtype=bool))
    np.testing.assert_allclose(ours[0], direct[0], rtol=rtol)
    np.testing.assert_allclose(
        ours[1][:, lower], direct[1][:, lower], rtol=rtol * 10, atol=rtol * 10
    )
    np.testing.assert_allclose(ours[2], direct[2], rtol=rtol * 10, atol=rtol * 10)
    assert ours[0].dtype == dtype
