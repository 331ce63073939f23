"""The predictive objective and deep sigma point processes (Jankowiak et al. 2020).

Oracles: on one layer with a Gaussian likelihood the predictive objective equals its closed form
(GPflow's SVGP predictive density of each row, summed, minus its KL); a DSPP with one sigma point
equals the model whose hidden layers are their means; a DSPP's mixture density is the weighted
sum of its paths' densities."""

import gpflow
import numpy as np
import pytest
import tensorflow as tf

import deepgp_gi as dg
from deepgp_gi.noise import FixedNoise, SeededNoise
from deepgp_gi.posteriors import DSPPPosterior, MeanFieldPosterior
from doc_examples import run_page  # tests/ is on sys.path under pytest

N, D, M = 30, 2, 6


def _data(seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, D))
    return X, np.sin(X[:, :1]) + 0.1 * rng.normal(size=(N, 1))


def _copy_parameters(target, source):
    """Assign every parameter of ``source`` to the same path of ``target``."""
    theirs = gpflow.utilities.parameter_dict(source)
    for path, parameter in gpflow.utilities.parameter_dict(target).items():
        if path in theirs:
            parameter.assign(theirs[path].numpy())


@pytest.mark.parametrize("whiten", [False, True])
def test_one_layer_predictive_objective_is_its_closed_form(whiten):
    X, Y = _data()
    rng = np.random.default_rng(1)
    kernel = gpflow.kernels.SquaredExponential(lengthscales=1.3)
    Z = rng.normal(size=(M, D))
    layer = dg.GPLayer(kernel, 1, D, inducing_inputs=Z)
    post = MeanFieldPosterior([layer], whiten=whiten, q_sqrt_scales=[0.7])
    post.q_mu[0].assign(rng.normal(size=(M, 1)))
    likelihood = gpflow.likelihoods.Gaussian(variance=0.2)
    model = dg.DeepGP([layer], likelihood, post, num_data=N)
    svgp = gpflow.models.SVGP(
        kernel,
        likelihood,
        layer.inducing_variable,
        q_mu=post.q_mu[0].numpy(),
        q_sqrt=post.q_sqrt[0].numpy(),
        whiten=whiten,
        num_data=N,
    )
    expected = tf.reduce_sum(svgp.predict_log_density((X, Y))) - svgp.prior_kl()
    ell, kl = model.elbo_terms((X, Y), 3, seed=4, objective="predictive")
    np.testing.assert_allclose(np.mean(ell - kl), expected.numpy(), rtol=1e-10)
    # the predictive objective bounds the ELBO from above (Jensen, per row)
    assert np.mean(ell - kl) > model.elbo((X, Y), 3, seed=4).numpy()
    # a minibatch is rescaled to the full data as the ELBO is
    ell_b, _ = model.elbo_terms((X[:10], Y[:10]), 3, seed=4, objective="predictive")
    rows = svgp.predict_log_density((X[:10], Y[:10])).numpy()
    np.testing.assert_allclose(ell_b.numpy(), np.full(3, rows.sum() * N / 10), rtol=1e-10)


def test_dspp_with_one_sigma_point_is_the_deterministic_hidden_layer_model():
    X, Y = _data()
    dspp = dg.build_deep_gp(
        X, Y, depth=3, posterior="dspp", num_inducing=M, seed=2, num_sigma_points=1
    )
    mf = dg.build_deep_gp(X, Y, depth=3, posterior="mean_field", num_inducing=M, seed=2)
    rng = np.random.default_rng(3)
    for q_mu in mf.posterior.q_mu:  # away from the initial values, so the hidden means matter
        q_mu.assign(rng.normal(size=q_mu.shape))
    _copy_parameters(dspp, mf)
    assert isinstance(dspp.posterior, DSPPPosterior) and dspp.posterior.num_sigma_points == 1
    np.testing.assert_array_equal(dspp.posterior.sigma_points[0].numpy(), 0.0)
    # the mean-field model with zero noise on its hidden layers
    zeros = {
        f"f/{l}": tf.zeros([1, N, layer.output_dim], tf.float64)
        for l, layer in enumerate(mf.layers[:-1])
    }
    last = SeededNoise(9)
    a = dspp.propagate(X, 5, seed=9)
    b = mf.propagate(X, 1, seed=FixedNoise(zeros, fallback=last))
    for x, y in zip(a.samples + [a.mean, a.var, a.kl], b.samples + [b.mean, b.var, b.kl]):
        np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-12, atol=1e-14)
    for objective in ("elbo", "predictive"):
        ours = dspp.elbo_terms((X, Y), 1, seed=9, objective=objective)
        theirs = mf.elbo_terms(
            (X, Y), 1, seed=FixedNoise(zeros, fallback=last), objective=objective
        )
        np.testing.assert_allclose(np.subtract(*ours), np.subtract(*theirs), rtol=1e-12)


def test_dspp_predictive_density_is_the_weighted_mixture_of_its_paths():
    X, Y = _data()
    model = dg.build_deep_gp(
        X, Y, depth=2, posterior="dspp", num_inducing=M, seed=2, num_sigma_points=3
    )
    model.posterior.sigma_logits.assign([0.3, -1.0, 0.5])
    w = tf.nn.softmax(model.posterior.sigma_logits).numpy()
    mean, var = model.predict_f_components(
        X, 100, seed=1
    )  # the Q = 3 paths, whatever num_samples says
    mean, var = mean.numpy(), var.numpy()
    assert mean.shape == (3, N, 1)
    noise = model.likelihood.variance.numpy()
    dens = np.exp(-0.5 * (Y[None] - mean) ** 2 / (var + noise)) / np.sqrt(2 * np.pi * (var + noise))
    expected = np.log(np.einsum("s,sn->n", w, dens[..., 0]))
    np.testing.assert_allclose(
        model.predict_log_density((X, Y), 7, seed=1).numpy(), expected, rtol=1e-10
    )
    ell, kl = model.elbo_terms((X, Y), 1, seed=1, objective="predictive")
    np.testing.assert_allclose(ell.numpy(), np.full(3, expected.sum()), rtol=1e-10)
    y_mean, y_var = (t.numpy() for t in model.predict_y(X, 5, seed=1))
    np.testing.assert_allclose(y_mean[:, 0], np.einsum("s,sn->n", w, mean[..., 0]), rtol=1e-10)
    second = np.einsum("s,sn->n", w, (var + noise + mean**2)[..., 0])
    np.testing.assert_allclose(y_var[:, 0], second - y_mean[:, 0] ** 2, rtol=1e-9)
    # the ELBO weights each path's expected log-likelihood
    ell_e, _ = model.elbo_terms((X, Y), 1, seed=1)
    exact = -0.5 * ((Y[None] - mean) ** 2 + var) / noise - 0.5 * np.log(2 * np.pi * noise)
    np.testing.assert_allclose(
        np.mean(ell_e.numpy()), np.einsum("s,s->", w, exact.sum(axis=(1, 2))), rtol=1e-10
    )


def test_dspp_refuses_what_it_cannot_do():
    X, Y = _data()
    with pytest.raises(ValueError, match="num_sigma_points"):
        dg.build_deep_gp(X, Y, depth=2, posterior="dspp", num_inducing=M, num_sigma_points=0)
    with pytest.raises(ValueError, match="latent_dim does not apply to posterior 'dspp'"):
        dg.build_deep_gp(X, Y, depth=2, posterior="dspp", num_inducing=M, latent_dim=1)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="dspp", num_inducing=M)
    with pytest.raises(ValueError, match="unknown objective 'predict'"):
        model.elbo_terms((X, Y), objective="predict")


def test_the_predictive_objective_page_runs(capsys):
    run_page("predictive_objective.md")
    value, shape = capsys.readouterr().out.split(maxsplit=1)
    assert np.isfinite(float(value)) and shape.strip() == "(5,)"


@pytest.mark.slow  # three fits, one of 40 steps: `make test-all`
def test_fit_trains_on_the_predictive_objective():
    X, Y = _data()
    model = dg.build_deep_gp(
        X, Y, depth=2, posterior="dspp", num_inducing=M, seed=2, num_sigma_points=3
    )

    def objective():
        return float(
            np.mean(np.subtract(*model.elbo_terms((X, Y), 1, seed=0, objective="predictive")))
        )

    before = objective()
    history = dg.fit(model, (X, Y), steps=40, seed=0, progress=False, objective="predictive")
    assert objective() > before + 1.0
    # the history records the objective the step maximised (full batch, and the DSPP's value has no
    # Monte Carlo noise): the last logged value is the objective one update before the end
    assert history.elbo[-1] > before
    assert abs(history.elbo[-1] - objective()) < 0.05 * abs(objective())
    # a mean-field model too, and the step's value is the objective, not the ELBO
    mf = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=M, seed=2)
    history = dg.fit(
        mf, (X, Y), steps=1, seed=0, progress=False, objective="predictive", num_samples=4
    )
    assert (
        history.elbo[0]
        > dg.fit(
            dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=M, seed=2),
            (X, Y),
            steps=1,
            seed=0,
            progress=False,
            num_samples=4,
        ).elbo[0]
    )


def test_fit_refuses_the_predictive_objective_where_it_does_not_apply():
    X, Y = _data()
    sampler = dg.build_deep_gp(X, Y, depth=2, posterior="sghmc", num_inducing=M)
    with pytest.raises(ValueError, match="objective='predictive' is for a variational family"):
        dg.fit(sampler, (X, Y), steps=1, objective="predictive", progress=False)
    latent = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=M, latent_dim=1)
    with pytest.raises(ValueError, match="not available for a latent-variable model"):
        dg.fit(latent, (X, Y), steps=1, objective="predictive", progress=False)
    with pytest.raises(ValueError, match="unknown objective 'elbow'"):
        dg.fit(sampler, (X, Y), steps=1, objective="elbow", progress=False)
