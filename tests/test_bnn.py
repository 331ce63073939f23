"""build_bnn: initialisation, bad input, the true-evidence bound (O14 in
docs/algorithms.md, "Test oracles") and float32 for every family."""

import gpflow
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from deepgp_gi.bnn import BNN_POSTERIORS, build_bnn
from deepgp_gi.datasets import deep_linear, deep_linear_log_evidence
from deepgp_gi.priors import ScalePrior

tfd = tfp.distributions


def _adam(model, data, steps, num_samples=1):
    opt = tf.optimizers.Adam(0.01)
    variables = model.trainable_variables

    @tf.function(
        autograph=False
    )  # the model has no Python control flow on tensors; tracing is 3-4x faster
    def step(seed):
        with tf.GradientTape() as tape:
            loss = -model.elbo(data, num_samples, seed=tf.stack([seed, 0]))
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))

    for i in range(steps):
        step(tf.constant(i, tf.int64))


# 100 Adam steps per family: `make test-all` (each family's oracles run in make test)
@pytest.mark.slow
@pytest.mark.parametrize("posterior", BNN_POSTERIORS)
def test_O14_true_evidence_bounds_elbo(posterior):
    data = deep_linear(num_train=100, num_test=1, input_dim=5, noise_variance=0.1, seed=1)
    X, Y = data.X_train, data.Y_train
    log_true = deep_linear_log_evidence(X, Y, 5, 0.1)
    lik = gpflow.likelihoods.Gaussian(0.1)
    gpflow.set_trainable(lik, False)
    model = build_bnn(
        X,
        Y,
        hidden=(8,),
        posterior=posterior,
        activation="identity",
        num_inducing=10,
        likelihood=lik,
        seed=0,
    )
    Xt, Yt = tf.constant(X), tf.constant(Y)
    _adam(model, (Xt, Yt), 100)
    elbo = model.elbo((X, Y), 20, seed=123).numpy()
    assert np.isfinite(elbo)
    assert elbo / len(X) <= log_true / len(X) + 0.01, (elbo / len(X), log_true / len(X))


def test_build_bnn_structure_and_initialisation(rng):
    X, Y = rng.normal(size=(30, 3)), rng.normal(size=(30, 2))
    m = build_bnn(X, Y, hidden=(6, 5), posterior="global", num_inducing=10, seed=0)
    assert [l.output_dim for l in m.layers] == [6, 5, 2] and m.num_data == 30
    assert (
        m.layers[0].kernel.activation_name == "identity"
        and m.layers[1].kernel.activation_name == "relu"
    )
    post = m.posterior
    # U_0 = a subset of the inputs, top pseudo-outputs = their targets.
    U0, V = post.inducing_inputs.numpy(), post.pseudo_data[-1].pseudo_outputs.numpy()
    idx = [int(np.argmin(np.abs(X - u).sum(1))) for u in U0]
    np.testing.assert_array_equal(X[idx], U0)
    np.testing.assert_array_equal(Y[idx], V)
    np.testing.assert_allclose(
        3 * post.pseudo_data[0].precision.unconstrained_variable.numpy(), -4.0
    )
    np.testing.assert_allclose(post.pseudo_data[-1].precision.unconstrained_variable.numpy(), 0.0)
    m2 = build_bnn(X, Y, hidden=(6, 5), posterior="global", num_inducing=10, seed=0)
    np.testing.assert_array_equal(m2.posterior.inducing_inputs.numpy(), U0)
    toy = build_bnn(X, Y, hidden=(4,), num_inducing=50, seed=0)  # M > N: N(0, 1) inducing inputs
    assert toy.posterior.inducing_inputs.shape == (50, 3)
    li = build_bnn(X, Y, hidden=(4,), posterior="local", seed=0)
    assert [l.num_inducing for l in li.layers] == [4, 5]
    fac = build_bnn(X, Y, hidden=(4,), posterior="factorised", seed=0)
    mu, var = fac.posterior.weights[0].moments()
    np.testing.assert_allclose(var, 1e-3 / 4)
    sc = build_bnn(X, Y, hidden=(4,), prior=ScalePrior(power=-0.5), seed=0)
    assert sc.layers[0].prior is not sc.layers[1].prior and sc.layers[1].prior.power == -0.5


def test_build_bnn_classification_uses_one_hot_pseudo_outputs(rng):
    X = rng.normal(size=(12, 2))
    Y = rng.integers(0, 3, size=(12, 1)).astype(float)
    m = build_bnn(
        X, Y, hidden=(4,), num_inducing=5, likelihood=gpflow.likelihoods.Softmax(3), seed=0
    )
    V = m.posterior.pseudo_data[-1].pseudo_outputs.numpy()
    assert V.shape == (5, 3) and np.all(V.sum(1) == 1) and set(np.unique(V)) == {0.0, 1.0}
    assert m.predict_f_samples(X, 2, seed=0).shape == (2, 12, 3)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(posterior="globl"), "posterior 'globl'.*'factorised'"),
        (dict(prior="gauss"), "prior 'gauss'.*'neal'"),
        (dict(activation="relu6"), "activation 'relu6'.*'relu'"),
        (dict(hidden=(5, 0)), r"hidden\[1\]"),
        (dict(hidden=(5.5,)), r"hidden\[0\]"),
        (dict(num_inducing=0), "num_inducing"),
    ],
)
def test_build_bnn_rejects_bad_arguments(rng, kwargs, match):
    X, Y = rng.normal(size=(10, 2)), rng.normal(size=(10, 1))
    with pytest.raises(ValueError, match=match):
        build_bnn(X, Y, **kwargs)


def test_build_bnn_rejects_bad_data(rng):
    X, Y = rng.normal(size=(10, 2)), rng.normal(size=(10, 1))
    Xbad = X.copy()
    Xbad[3, 1] = np.nan
    with pytest.raises(ValueError, match="X contains NaN at row 3"):
        build_bnn(Xbad, Y)
    with pytest.raises(ValueError, match="X has 10 rows but Y has 9"):
        build_bnn(X, Y[:9])
    with pytest.raises(ValueError, match="Y must be 2-D"):
        build_bnn(X, Y[:, 0])
    with pytest.raises(TypeError, match="likelihood"):
        build_bnn(X, Y, likelihood="gaussian")
    with pytest.raises(TypeError, match="hidden"):
        build_bnn(X, Y, hidden="50")


@pytest.mark.parametrize("posterior", BNN_POSTERIORS)
def test_float32_end_to_end(rng, posterior):
    X = rng.normal(size=(20, 3)).astype(np.float32)
    Y = rng.normal(size=(20, 1)).astype(np.float32)
    with gpflow.config.as_context(gpflow.config.Config(float=np.float32, jitter=1e-4)):
        model = build_bnn(
            X, Y, hidden=(6, 6), posterior=posterior, prior="scale", num_inducing=8, seed=0
        )
        assert all(v.dtype == tf.float32 for v in model.trainable_variables)
        with tf.GradientTape() as tape:
            elbo = model.elbo((X, Y), 3, seed=0)
        grads = tape.gradient(elbo, model.trainable_variables)
        assert elbo.dtype == tf.float32 and np.isfinite(elbo.numpy())
        assert all(np.all(np.isfinite(g.numpy())) for g in grads)
        mean, var = model.predict_f(X, 4, seed=1)
        assert (
            mean.dtype == tf.float32
            and np.all(np.isfinite(mean.numpy()))
            and np.all(np.isfinite(var.numpy()))
        )
