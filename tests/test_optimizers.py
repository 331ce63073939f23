"""``deepgp_gi.training.adam`` (``fit``'s optimiser) is Adam: the textbook update, step by step."""

import numpy as np
import pytest
import tensorflow as tf

import deepgp_gi as dg

A = np.array([[3.0, 0.5, 0.0], [0.5, 1.0, -0.2], [0.0, -0.2, 0.3]])
B = np.array([1.0, -2.0, 0.5])
X0 = np.array([0.3, -0.1, 2.0])


def _gradient(x):
    return A @ x - B  # of the quadratic x^T A x / 2 - b^T x


def _f32(value: float) -> float:
    return float(np.float32(value))


def textbook_adam(x, steps, lr, beta_1=0.9, beta_2=0.999, epsilon=1e-7):
    """Kingma & Ba's Algorithm 1 with the bias corrections folded into the step size (the
    "epsilon hat" form Keras and TensorFlow's kernels use), in float64."""
    x, m, v = x.copy(), np.zeros_like(x), np.zeros_like(x)
    for t in range(1, steps + 1):
        g = _gradient(x)
        m = beta_1 * m + (1 - beta_1) * g
        v = beta_2 * v + (1 - beta_2) * g * g
        x = x - lr * np.sqrt(1 - beta_2**t) / (1 - beta_1**t) * m / (np.sqrt(v) + epsilon)
    return x


def _run(learning_rate, dtype, steps, jit_compile):
    x = tf.Variable(X0.astype(dtype))
    optimizer = dg.training.adam(learning_rate, [x])
    A_t, B_t = tf.constant(A, dtype), tf.constant(B, dtype)

    @tf.function(jit_compile=jit_compile, autograph=False)
    def step():
        with tf.GradientTape() as tape:
            loss = 0.5 * tf.reduce_sum(x * tf.linalg.matvec(A_t, x)) - tf.reduce_sum(B_t * x)
        optimizer.apply_gradients([(tape.gradient(loss, x), x)])

    for _ in range(steps):
        step()
    return x.numpy()


@pytest.mark.parametrize("jit_compile", [False, True], ids=["plain", "xla"])
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_adam_is_the_textbook_update(dtype, tol, jit_compile):
    steps, lr = 25, 0.05
    # Keras keeps the hyperparameters in float32 variables (its floatx) whatever the model's dtype
    expected = textbook_adam(X0, steps, _f32(lr), _f32(0.9), _f32(0.999), _f32(1e-7))
    assert np.max(np.abs(expected - X0)) > 0.5  # the steps moved x: the comparison can fail
    np.testing.assert_allclose(_run(lr, dtype, steps, jit_compile), expected, rtol=0, atol=tol)
