"""DSVI mean-field oracles: one layer equals GPflow's SVGP; whitening is a reparameterisation;
a deep GP with near-deterministic identity inner layers equals SVGP; minibatch ELBO is unbiased
(O7 and O16 in docs/algorithms.md, "Test oracles")."""

import gpflow
import numpy as np
import pytest

import deepgp_gi as dg
from deepgp_gi.noise import FixedNoise
from deepgp_gi.posteriors import MeanFieldPosterior

N, D, M, P = 40, 3, 7, 2


def _data(rng):
    return rng.normal(size=(N, D)), rng.normal(size=(N, P)), rng.normal(size=(M, D))


def _one_layer(rng, whiten, likelihood=None):
    X, Y, Z = _data(rng)
    kernel = gpflow.kernels.SquaredExponential(variance=1.3, lengthscales=[0.7, 1.1, 2.0])
    layer = dg.GPLayer(kernel, P, D, inducing_inputs=Z)
    post = MeanFieldPosterior([layer], whiten=whiten, q_sqrt_scales=[1.0])
    q_mu = rng.normal(size=(M, P))
    q_sqrt = np.tril(rng.normal(size=(P, M, M))) * 0.3
    post.q_mu[0].assign(q_mu)
    post.q_sqrt[0].assign(q_sqrt)
    likelihood = likelihood or gpflow.likelihoods.Gaussian(variance=0.3)
    model = dg.DeepGP([layer], likelihood, post, num_data=N)
    svgp = gpflow.models.SVGP(
        kernel,
        likelihood,
        gpflow.inducing_variables.InducingPoints(Z),
        num_latent_gps=P,
        q_mu=q_mu,
        q_sqrt=q_sqrt,
        whiten=whiten,
        num_data=N,
    )
    return model, svgp, X, Y


@pytest.mark.parametrize("whiten", [False, True])
def test_O7_one_layer_equals_svgp(whiten, rng):
    model, svgp, X, Y = _one_layer(rng, whiten)
    np.testing.assert_allclose(model.elbo((X, Y), 3), svgp.elbo((X, Y)), rtol=1e-10)
    Xs = rng.normal(size=(11, D))
    mu, var = model.predict_f(Xs, 4)
    mu_ref, var_ref = svgp.predict_f(Xs)
    np.testing.assert_allclose(mu, mu_ref, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(var, var_ref, rtol=1e-10, atol=1e-12)
    Ys = rng.normal(size=(11, P))
    np.testing.assert_allclose(
        model.predict_log_density((Xs, Ys), 5), svgp.predict_log_density((Xs, Ys)), rtol=1e-10
    )
    ym, yv = model.predict_y(Xs, 2)
    ym_ref, yv_ref = svgp.predict_y(Xs)
    np.testing.assert_allclose(yv, yv_ref, rtol=1e-10)


def test_O7_one_layer_equals_svgp_bernoulli_quadrature(rng):
    X, _, Z = _data(rng)
    Y = (rng.uniform(size=(N, 1)) > 0.5).astype(float)
    kernel = gpflow.kernels.SquaredExponential(lengthscales=[0.7, 1.1, 2.0])
    layer = dg.GPLayer(kernel, 1, D, inducing_inputs=Z)
    post = MeanFieldPosterior([layer], q_sqrt_scales=[0.5])
    post.q_mu[0].assign(rng.normal(size=(M, 1)))
    lik = gpflow.likelihoods.Bernoulli()
    model = dg.DeepGP([layer], lik, post, num_data=N)
    svgp = gpflow.models.SVGP(
        kernel,
        lik,
        layer.inducing_variable,
        q_mu=post.q_mu[0].numpy(),
        q_sqrt=post.q_sqrt[0].numpy(),
        whiten=False,
        num_data=N,
    )
    np.testing.assert_allclose(model.elbo((X, Y)), svgp.elbo((X, Y)), rtol=1e-10)


def test_studentt_likelihood_runs_and_matches_svgp(rng):
    model, _, X, Y = _one_layer(rng, False, gpflow.likelihoods.StudentT(scale=0.5))
    svgp = gpflow.models.SVGP(
        model.layers[0].kernel,
        model.likelihood,
        model.layers[0].inducing_variable,
        num_latent_gps=P,
        q_mu=model.posterior.q_mu[0].numpy(),
        q_sqrt=model.posterior.q_sqrt[0].numpy(),
        whiten=False,
        num_data=N,
    )
    np.testing.assert_allclose(model.elbo((X, Y)), svgp.elbo((X, Y)), rtol=1e-10)


def test_O16_whitened_equals_unwhitened_under_reparameterisation(rng):
    X, Y, Z = _data(rng)
    widths = [D, P]
    models = {}
    for whiten in (False, True):
        layers = [
            dg.GPLayer(
                gpflow.kernels.SquaredExponential(lengthscales=[1.0] * D)
                + gpflow.kernels.White(1e-3),
                D,
                D,
                mean_function=gpflow.mean_functions.Identity(),
                inducing_inputs=Z,
            ),
            dg.GPLayer(
                gpflow.kernels.SquaredExponential(lengthscales=[1.5] * D),
                P,
                D,
                inducing_inputs=Z * 0.5,
            ),
        ]
        models[whiten] = dg.DeepGP(
            layers,
            gpflow.likelihoods.Gaussian(0.2),
            MeanFieldPosterior(layers, whiten=whiten),
            num_data=N,
        )
    plain, white = models[False], models[True]
    for l, width in enumerate(widths):
        m = rng.normal(size=(M, width))
        R = np.tril(rng.normal(size=(width, M, M))) * 0.2
        plain.posterior.q_mu[l].assign(m)
        plain.posterior.q_sqrt[l].assign(R)
        Lk = dg.posteriors.conditionals.inducing_cholesky(
            plain.layers[l], plain.layers[l].Z
        ).numpy()
        white.posterior.q_mu[l].assign(np.linalg.solve(Lk, m))
        white.posterior.q_sqrt[l].assign(
            np.stack([np.linalg.solve(Lk, R[i]) for i in range(width)])
        )
    noise = FixedNoise({"f/0": rng.normal(size=(4, N, D)), "f/1": rng.normal(size=(4, N, P))})
    np.testing.assert_allclose(
        plain.elbo_per_sample((X, Y), 4, noise), white.elbo_per_sample((X, Y), 4, noise), rtol=1e-10
    )


def test_deep_gp_with_deterministic_identity_inner_layer_equals_svgp(rng):
    """Inner layers with near-zero variance and identity mean reproduce their inputs exactly
    enough that a depth-3 model's ELBO equals the single-layer SVGP on the same data."""
    X, Y, Z = _data(rng)
    tiny = 1e-18

    def inner():
        k = gpflow.kernels.SquaredExponential(variance=tiny, lengthscales=[1.0] * D)
        return dg.GPLayer(
            k, D, D, mean_function=gpflow.mean_functions.Identity(), inducing_inputs=Z
        )

    last_kernel = gpflow.kernels.SquaredExponential(variance=1.1, lengthscales=[0.9, 1.4, 0.6])
    layers = [inner(), inner(), dg.GPLayer(last_kernel, P, D, inducing_inputs=Z)]
    with gpflow.config.as_context(gpflow.config.Config(float=np.float64, jitter=1e-20)):
        post = MeanFieldPosterior(layers, q_sqrt_scales=[1e-5, 1e-5, 1.0])
    q_mu, q_sqrt = rng.normal(size=(M, P)), np.tril(rng.normal(size=(P, M, M))) * 0.3
    post.q_mu[2].assign(q_mu)
    post.q_sqrt[2].assign(q_sqrt)
    lik = gpflow.likelihoods.Gaussian(0.3)
    model = dg.DeepGP(layers, lik, post, num_data=N)
    svgp = gpflow.models.SVGP(
        last_kernel,
        lik,
        layers[2].inducing_variable,
        num_latent_gps=P,
        q_mu=q_mu,
        q_sqrt=q_sqrt,
        whiten=False,
        num_data=N,
    )
    with gpflow.config.as_context(gpflow.config.Config(float=np.float64, jitter=1e-20)):
        deep = model.elbo((X, Y), 3, seed=0).numpy()
        mu, _ = model.predict_f(X, 2, seed=0)
        kl_inner = sum(
            float(
                gpflow.kullback_leiblers.gauss_kl(
                    post.q_mu[l],
                    post.q_sqrt[l],
                    K_cholesky=dg.posteriors.conditionals.inducing_cholesky(layers[l], layers[l].Z),
                )
            )
            for l in (0, 1)
        )
        ref = svgp.elbo((X, Y)).numpy()
        mu_ref = svgp.predict_f(X)[0].numpy()
    # the inner layers contribute only their own KL; the data term equals SVGP's
    # inner samples move by ~sqrt(1e-18) x noise, so agreement is to ~1e-9 relative
    np.testing.assert_allclose(deep + kl_inner, ref, rtol=1e-9)
    np.testing.assert_allclose(mu, mu_ref, atol=1e-6)


def test_minibatch_elbo_is_unbiased_over_an_epoch(rng):
    model, _, X, Y = _one_layer(rng, False)
    full = model.elbo((X, Y)).numpy()
    perm = rng.permutation(N)
    batches = np.array_split(perm, 5)
    mean_batch = np.mean([model.elbo((X[b], Y[b])).numpy() for b in batches])
    # equal-size batches: the average of rescaled batch ELBOs is the full-batch ELBO
    np.testing.assert_allclose(mean_batch, full, rtol=1e-12)


def test_predictive_logsumexp_with_duplicated_samples_equals_single(rng):
    X, Y, Z = _data(rng)
    layers = [
        dg.GPLayer(
            gpflow.kernels.SquaredExponential(lengthscales=[1.0] * D),
            D,
            D,
            mean_function=gpflow.mean_functions.Identity(),
            inducing_inputs=Z,
        ),
        dg.GPLayer(
            gpflow.kernels.SquaredExponential(lengthscales=[1.0] * D), P, D, inducing_inputs=Z
        ),
    ]
    model = dg.DeepGP(
        layers,
        gpflow.likelihoods.Gaussian(0.1),
        MeanFieldPosterior(layers, q_sqrt_scales=[0.3, 1.0]),
    )
    eps = rng.normal(size=(1, N, D))
    one = model.predict_log_density((X, Y), 1, FixedNoise({"f/0": eps, "f/1": np.zeros((1, N, P))}))
    three = model.predict_log_density(
        (X, Y), 3, FixedNoise({"f/0": np.repeat(eps, 3, 0), "f/1": np.zeros((3, N, P))})
    )
    np.testing.assert_allclose(one, three, rtol=1e-12)


def test_print_summary_lists_each_parameter_once(rng):
    X, Y, _ = _data(rng)
    model = dg.build_deep_gp(X, Y, depth=3, posterior="mean_field", num_inducing=10, seed=0)
    names = list(gpflow.utilities.parameter_dict(model))
    assert len(names) == len(set(id(p) for p in gpflow.utilities.parameter_dict(model).values()))
    assert any("posterior.q_sqrt" in n for n in names)
    assert sum("kernel" in n for n in names) == len(set(n for n in names if "kernel" in n))
    n_vars = len(model.trainable_variables)
    assert n_vars == len({id(v) for v in model.trainable_variables})


def test_set_trainable_freezes_kernel(rng):
    X, Y, _ = _data(rng)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=10, seed=0)
    before = len(model.trainable_variables)
    gpflow.set_trainable(model.layers[0].kernel, False)
    assert len(model.trainable_variables) < before


@pytest.mark.slow  # 30 L-BFGS iterations in eager mode: `make test-all`
def test_gpflow_scipy_optimiser_through_training_loss_closure(rng):
    model, _, X, Y = _one_layer(rng, True)
    start = model.elbo((X, Y)).numpy()
    gpflow.optimizers.Scipy().minimize(
        model.training_loss_closure((X, Y)), model.trainable_variables, options=dict(maxiter=30)
    )
    assert model.elbo((X, Y)).numpy() > start + 1.0


def test_multiclass_likelihoods_over_the_sample_axis(rng):
    """Softmax (Monte Carlo) and RobustMax multi-class likelihoods work with [S, N, C] moments and
    agree with GPflow's own SVGP for a one-layer model."""
    X, _, Z = _data(rng)
    C = 3
    Y = rng.integers(0, C, size=(N, 1)).astype(float)
    kernel = gpflow.kernels.SquaredExponential(lengthscales=[1.0] * D)
    layer = dg.GPLayer(kernel, C, D, inducing_inputs=Z)
    post = MeanFieldPosterior([layer], q_sqrt_scales=[0.5])
    post.q_mu[0].assign(rng.normal(size=(M, C)))
    lik = gpflow.likelihoods.MultiClass(C)
    model = dg.DeepGP([layer], lik, post, num_data=N)
    svgp = gpflow.models.SVGP(
        kernel,
        lik,
        layer.inducing_variable,
        num_latent_gps=C,
        q_mu=post.q_mu[0].numpy(),
        q_sqrt=post.q_sqrt[0].numpy(),
        whiten=False,
        num_data=N,
    )
    np.testing.assert_allclose(model.elbo((X, Y), 3), svgp.elbo((X, Y)), rtol=1e-10)
    np.testing.assert_allclose(
        model.predict_log_density((X, Y), 2), svgp.predict_log_density((X, Y)), rtol=1e-10
    )
    soft = dg.DeepGP([layer], gpflow.likelihoods.Softmax(C), post, num_data=N)
    assert np.isfinite(soft.elbo((X, Y), 2).numpy())


@pytest.mark.parametrize("depth", [1, 3])
def test_propagation_equals_each_sample_pushed_through_its_own_layer_marginals(rng, depth):
    """``propagate`` computes the first layer's marginals once and broadcasts them over the
    samples; the result must be what each sample's own chain of layer marginals gives."""
    X, Y, Z = _data(rng)
    model = dg.build_deep_gp(X, Y, depth=depth, posterior="mean_field", num_inducing=M, seed=0)
    post = model.posterior
    for l, layer in enumerate(model.layers):  # a posterior away from its initialisation
        post.q_mu[l].assign(rng.normal(size=post.q_mu[l].shape) * 0.3)
        post.q_sqrt[l].assign(np.tril(rng.normal(size=post.q_sqrt[l].shape)) * 0.2)
    S = 4
    eps = {
        f"f/{l}": rng.normal(size=(S, N, layer.output_dim)) for l, layer in enumerate(model.layers)
    }
    prop = post.propagate(X, S, FixedNoise(eps))
    F = np.broadcast_to(X, (S, N, D))
    for l in range(depth):
        mean, var = (a.numpy() for a in post.layer_marginals(l, F))
        F = (
            mean
            + np.sqrt(
                np.maximum(var, 0.0) + (gpflow.config.default_jitter() if l < depth - 1 else 0.0)
            )
            * eps[f"f/{l}"]
        )
        np.testing.assert_allclose(prop.samples[l].numpy(), F, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(prop.mean.numpy(), mean, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(prop.var.numpy(), np.maximum(var, 0.0), rtol=1e-10, atol=1e-12)
    assert prop.mean.shape == (S, N, model.layers[-1].output_dim)
