"""Bad input raises a clear error naming the argument, before any work starts."""

import gpflow
import numpy as np
import pytest
import tensorflow as tf

import deepgp_gi as dg


@pytest.fixture
def data(rng):
    return rng.normal(size=(30, 3)), rng.normal(size=(30, 1))


@pytest.fixture
def model(data):
    X, Y = data
    return dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=8, seed=0)


def test_nan_and_inf_named_with_row(data, model):
    X, Y = data
    Xbad = X.copy()
    Xbad[17, 1] = np.nan
    with pytest.raises(ValueError, match="X contains NaN at row 17"):
        model.elbo((Xbad, Y))
    Ybad = Y.copy()
    Ybad[4] = np.inf
    with pytest.raises(ValueError, match="Y contains inf at row 4"):
        dg.fit(model, (X, Ybad), steps=1, progress=False)
    with pytest.raises(ValueError, match="X contains NaN"):
        dg.build_deep_gp(Xbad, Y, depth=1, posterior="mean_field", num_inducing=5)
    with pytest.raises(ValueError, match="Xnew contains NaN at row 17"):
        model.predict_f(Xbad)


def test_wrong_rank_columns_and_lengths(data, model):
    X, Y = data
    with pytest.raises(ValueError, match=r"Y must be 2-D.*Y\[:, None\]"):
        model.elbo((X, Y[:, 0]))
    with pytest.raises(ValueError, match="X has 2 columns but 3 are expected"):
        model.elbo((X[:, :2], Y))
    with pytest.raises(ValueError, match="Y has 2 columns but the likelihood expects 1"):
        model.elbo((X, np.hstack([Y, Y])))
    with pytest.raises(ValueError, match="X has 30 rows but Y has 29"):
        model.elbo((X, Y[:29]))
    with pytest.raises(ValueError, match="X has 30 rows but Y has 29"):
        dg.build_deep_gp(X, Y[:29], depth=1, posterior="mean_field", num_inducing=5)


def test_empty_and_wrong_dtype(data, model):
    X, Y = data
    with pytest.raises(ValueError, match="X is empty"):
        model.elbo((X[:0], Y[:0]))
    with pytest.raises(TypeError, match="X is a float32 tensor but the model uses float64"):
        model.elbo((tf.constant(X, tf.float32), Y))
    with pytest.raises(TypeError, match="Y must hold real numbers"):
        model.elbo((X, Y.astype(str)))
    with pytest.raises(TypeError, match="data must be a pair"):
        model.elbo(X)


def test_builder_settings(data):
    X, Y = data
    with pytest.raises(ValueError, match="unknown posterior 'globl'; choose one of"):
        dg.build_deep_gp(X, Y, depth=2, posterior="globl")
    with pytest.raises(ValueError, match="depth must be at least 1"):
        dg.build_deep_gp(X, Y, depth=0, posterior="mean_field")
    with pytest.raises(TypeError, match="depth must be an integer"):
        dg.build_deep_gp(X, Y, depth=2.5, posterior="mean_field")
    with pytest.raises(ValueError, match="num_inducing=31 exceeds the number of data points N=30"):
        dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=31)
    with pytest.raises(ValueError, match="inner_width must be at least 1"):
        dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=5, inner_width=0)


def test_fit_settings(data, model):
    X, Y = data
    with pytest.raises(ValueError, match="steps must be at least 1"):
        dg.fit(model, (X, Y), steps=0)
    with pytest.raises(ValueError, match="batch_size=31 exceeds the number of data points N=30"):
        dg.fit(model, (X, Y), steps=1, batch_size=31)
    with pytest.raises(ValueError, match="learning_rate must be a positive finite number"):
        dg.fit(model, (X, Y), steps=1, learning_rate=-1.0)
    with pytest.raises(ValueError, match="num_samples must be at least 1"):
        dg.fit(model, (X, Y), steps=1, num_samples=0)
    with pytest.raises(ValueError, match="model.num_data=30 but the data has N=20 rows"):
        dg.fit(model, (X[:20], Y[:20]), steps=1)


def test_targets_must_suit_the_likelihood(data):
    X, _ = data
    Y = np.full((30, 1), 0.5)
    with pytest.raises(
        ValueError, match="Y must hold 0/1 labels for a Bernoulli likelihood; row 0"
    ):
        dg.build_deep_gp(
            X,
            (Y > 1).astype(float),
            depth=1,
            posterior="mean_field",
            num_inducing=5,
            likelihood=gpflow.likelihoods.Bernoulli(),
        ).elbo((X, Y))


def test_deepgp_composition_errors(rng):
    Z = rng.normal(size=(5, 2))
    l0 = dg.GPLayer(gpflow.kernels.SquaredExponential(), 3, 2, inducing_inputs=Z)
    l1 = dg.GPLayer(gpflow.kernels.SquaredExponential(), 1, 2, inducing_inputs=Z)
    with pytest.raises(
        ValueError, match=r"layers\[1\].input_dim is 2 but layers\[0\].output_dim is 3"
    ):
        dg.DeepGP([l0, l1], gpflow.likelihoods.Gaussian())
    with pytest.raises(ValueError, match="unknown posterior 'nope'"):
        dg.DeepGP([l1], gpflow.likelihoods.Gaussian(), posterior="nope")
    with pytest.raises(ValueError, match="inducing_inputs must have shape"):
        dg.GPLayer(gpflow.kernels.SquaredExponential(), 1, 3, inducing_inputs=Z)
    with pytest.raises(ValueError, match="layers must contain at least one layer"):
        dg.DeepGP([], gpflow.likelihoods.Gaussian())


def test_a_float_above_a_bound_is_strictly_above_it_and_finite():
    from deepgp_gi.validation import check_float_above

    assert check_float_above(3, "df", 2.0) == 3.0
    assert check_float_above(np.float32(2.5), "df", 2.0) == 2.5
    for bad in (2, 2.0, 1.0, -np.inf, np.inf, np.nan, True, "3", None):
        with pytest.raises(ValueError, match=r"^df must be a finite number above 2, got"):
            check_float_above(bad, "df", 2.0)
    with pytest.raises(ValueError, match=r"above 0 \(a reason\), got -1"):
        check_float_above(-1, "x", 0.0, "a reason")
