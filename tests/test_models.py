"""DeepGP's public contract: defaults shared with the builders, prediction defaults, the seed
keyword (noise= deprecated), shape contracts."""

import inspect

import gpflow
import numpy as np
import pytest

import deepgp_gi as dg
from deepgp_gi.models import DEFAULT_POSTERIOR, DEFAULT_PREDICT_SAMPLES


def _model(rng):
    X = rng.normal(size=(20, 2))
    Y = np.sin(X[:, :1])
    return dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=6, seed=0), X, Y


def test_deep_gp_and_build_deep_gp_share_the_default_posterior():
    default = inspect.signature(dg.build_deep_gp).parameters["posterior"].default
    assert (
        default == DEFAULT_POSTERIOR == inspect.signature(dg.DeepGP).parameters["posterior"].default
    )


def test_layers_module_exports_dense_layer():
    from deepgp_gi.layers import DenseLayer, GPLayer

    assert DenseLayer is dg.DenseLayer and issubclass(DenseLayer, GPLayer)


@pytest.mark.parametrize(
    "method",
    ["predict_f", "predict_y", "predict_log_density", "predict_f_samples", "sample_layers"],
)
def test_prediction_defaults_to_many_samples(rng, method):
    assert DEFAULT_PREDICT_SAMPLES >= 10
    assert (
        inspect.signature(getattr(dg.DeepGP, method)).parameters["num_samples"].default
        == DEFAULT_PREDICT_SAMPLES
    )
    assert inspect.signature(dg.DeepGP.elbo).parameters["num_samples"].default == 1


def test_default_prediction_uses_the_default_sample_count(rng):
    """predict_f with no num_samples equals the explicit S = DEFAULT_PREDICT_SAMPLES mixture under
    the same seed, and two seeded default calls agree."""
    model, X, _ = _model(rng)
    m1, v1 = model.predict_f(X, seed=3)
    m2, v2 = model.predict_f(X, DEFAULT_PREDICT_SAMPLES, seed=3)
    np.testing.assert_array_equal(m1.numpy(), m2.numpy())
    np.testing.assert_array_equal(v1.numpy(), v2.numpy())
    assert model.predict_f_samples(X, seed=1).shape == (DEFAULT_PREDICT_SAMPLES, 20, 1)


def test_noise_keyword_is_a_deprecated_alias_of_seed(rng):
    model, X, Y = _model(rng)
    with pytest.warns(DeprecationWarning, match="noise= is deprecated"):
        old = model.elbo((X, Y), 3, noise=5)
    np.testing.assert_array_equal(old.numpy(), model.elbo((X, Y), 3, seed=5).numpy())
    with pytest.raises(TypeError, match="seed= only"):
        model.predict_y(X, 3, seed=1, noise=1)


def test_shape_contracts_reject_wrong_rank(rng):
    model, X, _ = _model(rng)
    with pytest.raises(Exception, match="X"):
        model.propagate(X[0], 2)


def test_weight_families_document_zero_variance(rng):
    """Propagation.var is exactly 0 for BNN families that sample the last layer's weights (local,
    and the global families with last_layer="sampled"), and positive where the last layer's weights
    are marginalised (the global families' default, last_layer="marginal")."""
    X, Y = rng.normal(size=(15, 2)), rng.normal(size=(15, 1))
    model = dg.build_bnn(X, Y, hidden=(3,), posterior="local", num_inducing=5, seed=0)
    assert np.all(model.predict_f_components(X, 2, seed=0)[1].numpy() == 0.0)
    for posterior in ("global", "factorised_global", "random_global"):
        model = dg.build_bnn(
            X, Y, hidden=(3,), posterior=posterior, num_inducing=5, seed=0, last_layer="sampled"
        )
        assert np.all(model.predict_f_components(X, 2, seed=0)[1].numpy() == 0.0)
        model = dg.build_bnn(X, Y, hidden=(3,), posterior=posterior, num_inducing=5, seed=0)
        assert np.all(model.predict_f_components(X, 2, seed=0)[1].numpy() > 0.0)
    model = dg.build_bnn(X, Y, hidden=(3,), posterior="factorised", seed=0)
    assert np.all(model.predict_f_components(X, 2, seed=0)[1].numpy() > 0.0)


def test_print_summary_shows_readable_precisions(rng):
    """Precisions are Parameters with a transform: the summary shows Lambda itself (exp(-4) for a
    hidden layer of the papers' initialisation) and a user can assign one."""
    X, Y = rng.normal(size=(15, 2)), rng.normal(size=(15, 1))
    model = dg.build_deep_gp(
        X, Y, depth=2, posterior="global", num_inducing=5, precision="diagonal", seed=0
    )
    params = gpflow.utilities.parameter_dict(model)
    key = ".posterior.pseudo_data[0].precision"
    np.testing.assert_allclose(params[key].numpy(), np.exp(-4.0), rtol=1e-12)
    np.testing.assert_allclose(params[key].unconstrained_variable.numpy(), -4.0 / 3.0, rtol=1e-12)
    params[key].assign(np.full(params[key].shape, 2.0))
    np.testing.assert_allclose(model.posterior.pseudo_data[0].diagonal().numpy(), 2.0)


def test_a_frozen_float32_model_keeps_its_dtype():
    """``dtype`` reads frozen parameters too: a float32 model with every parameter frozen predicts
    in float32 (its dtype was GPflow's default float64 when only trainable variables counted)."""
    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(20, 2)).astype(np.float32), rng.normal(size=(20, 1)).astype(np.float32)
    with gpflow.config.as_context(gpflow.config.Config(float=np.float32, jitter=1e-4)):
        model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=5, seed=0)
    gpflow.set_trainable(model, False)
    assert model.trainable_variables == () or len(model.trainable_variables) == 0
    assert model.dtype == np.float32 and model.posterior.dtype == np.float32
    mean, var = model.predict_y(X, num_samples=2, seed=0)
    assert mean.dtype == np.float32 and np.all(np.isfinite(var.numpy()))
