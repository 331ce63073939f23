"""safe_cholesky and the sample-batched kernels."""
import gpflow
import numpy as np
import pytest
import tensorflow as tf

from deepgp_gi.kernels import batched_K, batched_K_diag, batched_K_sym
from deepgp_gi.linalg import safe_cholesky


def test_safe_cholesky_equals_plain_cholesky_on_pd(rng):
    A = rng.normal(size=(3, 5, 5))
    A = A @ np.transpose(A, (0, 2, 1)) + 5 * np.eye(5)
    np.testing.assert_allclose(safe_cholesky(A), np.linalg.cholesky(A), rtol=1e-12)


def test_safe_cholesky_escalates_only_failing_members(rng):
    x = rng.normal(size=(4, 1))
    singular = x @ x.T  # rank one: plain Cholesky fails
    good = singular + np.eye(4)
    L = safe_cholesky(np.stack([good, singular])).numpy()
    np.testing.assert_allclose(L[0], np.linalg.cholesky(good), rtol=1e-12)
    assert np.all(np.isfinite(L[1]))
    jittered = L[1] @ L[1].T
    # the repaired factor reproduces the matrix up to a small relative jitter
    assert np.max(np.abs(jittered - singular)) < 1e-3 * np.mean(np.diag(singular))


def test_safe_cholesky_compiled_with_gradient(rng):
    A = tf.Variable(np.eye(3) * 2.0)

    @tf.function
    def f():
        with tf.GradientTape() as tape:
            out = tf.reduce_sum(safe_cholesky(A))
        return out, tape.gradient(out, A)

    value, grad = f()
    assert np.isfinite(value.numpy()) and np.all(np.isfinite(grad.numpy()))


def test_safe_cholesky_clear_error_on_indefinite():
    A = np.array([[1.0, 0.0], [0.0, -5.0]])
    with pytest.raises(tf.errors.InvalidArgumentError, match="my_matrix is not positive definite"):
        safe_cholesky(A, name="my_matrix")


KERNELS = [
    lambda: gpflow.kernels.SquaredExponential(variance=1.7, lengthscales=[0.5, 1.5, 2.0]),
    lambda: gpflow.kernels.Matern52(variance=0.8, lengthscales=1.3),
    lambda: gpflow.kernels.SquaredExponential(lengthscales=[1.0, 2.0, 0.7]) + gpflow.kernels.White(0.1),
    lambda: gpflow.kernels.Linear(variance=0.4) * gpflow.kernels.Matern32() + gpflow.kernels.Constant(0.3),
]


@pytest.mark.parametrize("make", KERNELS)
def test_batched_kernels_match_gpflow_per_sample(make, rng):
    kernel = make()
    X = rng.normal(size=(3, 6, 3))
    Z = rng.normal(size=(3, 4, 3))
    cross = batched_K(kernel, X, Z).numpy()
    sym = batched_K_sym(kernel, X).numpy()
    diag = batched_K_diag(kernel, X).numpy()
    for s in range(3):
        np.testing.assert_allclose(cross[s], kernel.K(X[s], Z[s]), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(sym[s], kernel(X[s]), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(diag[s], kernel.K_diag(X[s]), rtol=1e-12)
    # an input without a sample axis is shared by every sample
    shared = batched_K(kernel, X, Z[0]).numpy()
    for s in range(3):
        np.testing.assert_allclose(shared[s], kernel.K(X[s], Z[0]), rtol=1e-12, atol=1e-14)


def test_unsupported_kernel_is_named():
    kernel = gpflow.kernels.ArcCosine()
    with pytest.raises(TypeError, match="ArcCosine"):
        batched_K(kernel, np.zeros((1, 2, 1)), np.zeros((1, 2, 1)))
