"""The sample-batched kernels."""

import gpflow
import numpy as np
import pytest

from deepgp_gi.kernels import batched_K, batched_K_diag, batched_K_sym

KERNELS = [
    lambda: gpflow.kernels.SquaredExponential(variance=1.7, lengthscales=[0.5, 1.5, 2.0]),
    lambda: gpflow.kernels.Matern52(variance=0.8, lengthscales=1.3),
    lambda: (
        gpflow.kernels.SquaredExponential(lengthscales=[1.0, 2.0, 0.7]) + gpflow.kernels.White(0.1)
    ),
    lambda: (
        gpflow.kernels.Linear(variance=0.4) * gpflow.kernels.Matern32()
        + gpflow.kernels.Constant(0.3)
    ),
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


def test_each_parameter_is_read_once_per_evaluation():
    """A stationary kernel's cross- and self-covariance read (and softplus) the lengthscales and
    the variance once each: the inputs are scaled by one read, and the self-covariance scales one
    input (each extra read is a transform and its gradient on every training step)."""
    import tensorflow as tf

    kernel = gpflow.kernels.SquaredExponential(variance=1.7, lengthscales=[0.5, 1.5, 2.0])
    X, Z = tf.zeros([2, 5, 3], tf.float64), tf.zeros([2, 4, 3], tf.float64)
    for evaluate in (lambda: batched_K(kernel, X, Z), lambda: batched_K_sym(kernel, X)):
        graph = tf.function(evaluate).get_concrete_function().graph
        softplus = [op for op in graph.get_operations() if op.type == "Softplus"]
        assert len(softplus) == 2, [op.name for op in softplus]


def test_shared_parameter_reads_read_each_parameter_once_per_pass():
    """Inside ``shared_parameter_reads`` the covariances, the cross-covariances and the diagonal
    of one kernel read (and softplus) each parameter once in all, with the same values and
    gradients as separate reads; outside it each evaluation reads its own."""
    import tensorflow as tf

    from deepgp_gi.kernels import constant_diagonal, shared_parameter_reads

    kernel = gpflow.kernels.SquaredExponential(
        variance=1.7, lengthscales=[0.5, 1.5, 2.0]
    ) + gpflow.kernels.White(0.1)
    X = tf.constant(np.random.default_rng(0).normal(size=(2, 5, 3)))
    Z = tf.constant(np.random.default_rng(1).normal(size=(4, 3)))

    def evaluate():
        with tf.GradientTape() as tape:
            value = (
                tf.reduce_sum(batched_K(kernel, X, Z))
                + tf.reduce_sum(batched_K_sym(kernel, Z[None]))
                + tf.reduce_sum(batched_K_diag(kernel, X))
                + constant_diagonal(kernel)
            )
        return value, tape.gradient(value, kernel.trainable_variables)

    def shared():
        with shared_parameter_reads():
            return evaluate()

    softplus = {}
    for name, fn in (("separate", evaluate), ("shared", shared)):
        graph = tf.function(fn).get_concrete_function().graph
        softplus[name] = sum(op.type == "Softplus" for op in graph.get_operations())
    assert (
        softplus["shared"] == 3 and softplus["separate"] > 3
    )  # SE variance and lengthscales, White variance
    (v1, g1), (v2, g2) = evaluate(), shared()
    np.testing.assert_allclose(v2.numpy(), v1.numpy(), rtol=1e-14)
    for a, b in zip(g1, g2):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-12)
    assert constant_diagonal(gpflow.kernels.Linear()) is None


@pytest.mark.parametrize("make", [KERNELS[0], KERNELS[1]], ids=["squared_exponential", "matern52"])
def test_coincident_inputs_give_the_prior_variance_and_finite_gradients(make, rng):
    """Rows of X repeated in Z (distance 0 up to round-off, which can leave it slightly negative):
    the cross-covariance there is the prior variance to 1e-12, and the gradient in the inputs is
    finite: the squared exponential takes the unclamped distance, the Matern kernel (sqrt of it)
    the clamped one."""
    import tensorflow as tf

    kernel = make()
    X = tf.constant(rng.normal(size=(2, 5, 3)) * 3.0)
    Z = tf.concat([X[:, :3], tf.constant(rng.normal(size=(2, 2, 3)))], axis=1)
    with tf.GradientTape() as tape:
        tape.watch(X)
        K = batched_K(kernel, X, Z)
        total = tf.reduce_sum(K)
    grad = tape.gradient(total, X).numpy()
    variance = float(kernel.variance.numpy())
    for s in range(2):
        np.testing.assert_allclose(np.diag(K.numpy()[s, :3, :3]), variance, rtol=1e-12)
        np.testing.assert_allclose(K.numpy()[s], kernel.K(X[s], Z[s]), rtol=1e-12, atol=1e-14)
    assert np.all(np.isfinite(grad))
