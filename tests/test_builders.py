"""build_deep_gp: the papers' defaults, and every posterior family trains from them."""

import gpflow
import numpy as np
import pytest

import deepgp_gi as dg
from deepgp_gi.builders import linear_mean_maps


def _data(rng, n=80, d=5):
    X = rng.normal(size=(n, d))
    Y = np.sin(X[:, :1]) + 0.5 * X[:, 1:2] ** 2 + 0.05 * rng.normal(size=(n, 1))
    return X, (Y - Y.mean()) / Y.std()


def test_dsvi_defaults(rng):
    X, Y = _data(rng, d=5)
    model = dg.build_deep_gp(X, Y, depth=3, posterior="mean_field", num_inducing=12, seed=0)
    assert [l.output_dim for l in model.layers] == [5, 5, 1]  # inner width min(30, D)
    np.testing.assert_allclose(model.likelihood.variance.numpy(), 0.01)
    for l, layer in enumerate(model.layers):
        se = layer.kernel.kernels[0] if l < 2 else layer.kernel
        np.testing.assert_allclose(se.variance.numpy(), 2.0)
        np.testing.assert_allclose(se.lengthscales.numpy(), np.full(5, 2.0))
        if l < 2:
            np.testing.assert_allclose(layer.kernel.kernels[1].variance.numpy(), 1e-5)
    # inner q_sqrt starts at 1e-5 of the prior Cholesky, the last at the prior
    post = model.posterior
    for l, scale in enumerate([1e-5, 1e-5, 1.0]):
        Lk = dg.posteriors.conditionals.inducing_cholesky(
            model.layers[l], model.layers[l].Z
        ).numpy()
        np.testing.assert_allclose(post.q_sqrt[l].numpy()[0], scale * Lk, rtol=1e-10, atol=1e-300)
    # the first layer starts at its (identity) mean function and is nearly deterministic at its
    # k-means inducing inputs (away from them the conditional prior variance remains)
    Z = model.layers[0].Z.numpy()
    sample = model.sample_layers(Z, 2)[0].numpy()
    # std there: sqrt(white 1e-5 + jitter) ~ 3e-3
    np.testing.assert_allclose(sample, np.broadcast_to(Z, sample.shape), atol=2e-2)


@pytest.mark.parametrize("positive_transform", ["softplus", "exp"])
def test_kernel_start_havasi_starts_every_layer_at_the_sghmc_codes_values(rng, positive_transform):
    X, Y = _data(rng, d=5)
    model = dg.build_deep_gp(
        X,
        Y,
        depth=3,
        posterior="sghmc",
        num_inducing=12,
        inner_width=3,
        seed=0,
        positive_transform=positive_transform,
        kernel_start="havasi",
    )
    x = rng.normal(size=(4, 5))
    for l, (layer, d_in) in enumerate(zip(model.layers, [5, 3, 3])):
        se = layer.kernel.kernels[0] if l < 2 else layer.kernel
        np.testing.assert_allclose(se.variance.numpy(), 0.01, rtol=1e-12)
        np.testing.assert_allclose(
            se.lengthscales.numpy(), np.full(d_in, np.sqrt(d_in)), rtol=1e-12
        )
        # the kernel itself: 0.01 exp(-|x - x'|^2 / (2 D_in))
        sq = ((x[:, None, :d_in] - x[None, :, :d_in]) ** 2).sum(-1)
        np.testing.assert_allclose(se.K(x[:, :d_in]).numpy(), 0.01 * np.exp(-sq / (2 * d_in)))
    dsvi = dg.build_deep_gp(X, Y, depth=2, posterior="sghmc", num_inducing=12, seed=0)
    np.testing.assert_allclose(dsvi.layers[1].kernel.variance.numpy(), 2.0)
    np.testing.assert_allclose(dsvi.layers[1].kernel.lengthscales.numpy(), np.full(5, 2.0))
    with pytest.raises(ValueError, match="unknown kernel_start 'sqrt'"):
        dg.build_deep_gp(X, Y, depth=2, posterior="sghmc", kernel_start="sqrt")


def test_pca_mean_function_projects_on_top_singular_vectors(rng):
    X = rng.normal(size=(50, 6)) @ np.diag([5.0, 3.0, 1.0, 0.5, 0.1, 0.01])
    (A,) = linear_mean_maps(X, [2])
    _, _, Vt = np.linalg.svd(X, full_matrices=False)
    np.testing.assert_allclose(np.abs(A.T @ Vt[:2].T), np.eye(2), atol=1e-10)
    (wide,) = linear_mean_maps(X, [8])
    np.testing.assert_allclose(wide[:, :6], np.eye(6))
    np.testing.assert_allclose(wide[:, 6:], 0.0)


@pytest.mark.slow  # 80 steps at depth 3 per family: `make test-all`
@pytest.mark.parametrize(
    "posterior", ["mean_field", "fully_coupled", "stripes_arrow", "global", "local"]
)
def test_every_family_builds_and_trains(posterior, rng):
    X, Y = _data(rng)
    model = dg.build_deep_gp(
        X, Y, depth=3, posterior=posterior, num_inducing=15, inner_width=2, seed=1
    )
    before = model.elbo((X, Y), 20, seed=0).numpy()
    dg.fit(model, (X, Y), steps=80, seed=0, progress=False)
    after = model.elbo((X, Y), 20, seed=0).numpy()
    assert after > before
    mean, var = model.predict_y(X[:7], 4)
    assert mean.shape == (7, 1) and np.all(var.numpy() > 0)
    assert len(model.sample_layers(X[:7], 3)) == 3


def test_global_inducing_takes_inducing_inputs_from_data(rng):
    X, Y = _data(rng)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="global", num_inducing=10, seed=3)
    U0 = model.posterior.inducing_inputs.numpy()
    # every inducing input is a training input
    assert all(np.min(np.abs(X - u).sum(axis=1)) < 1e-12 for u in U0)
    # M > N: the one policy of deepgp_gi.initialisation (N(0, 1) rows), for every model kind
    many = dg.build_deep_gp(X, Y, depth=2, posterior="global", num_inducing=81, seed=3)
    assert many.posterior.inducing_inputs.shape == (81, X.shape[1])
    with pytest.raises(
        ValueError, match="num_inducing=81 exceeds the number of data points N=80.*k-means"
    ):
        dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=81)


def _positive_parameters(model):
    """``{name: Parameter}`` of the kernels' variances and lengthscales and the likelihood's
    variance."""
    out = {"likelihood.variance": model.likelihood.variance}
    for l, layer in enumerate(model.layers):
        kernels = layer.kernel.kernels if hasattr(layer.kernel, "kernels") else [layer.kernel]
        for k, kernel in enumerate(kernels):
            out[f"{l}.{k}.variance"] = kernel.variance
            if hasattr(kernel, "lengthscales"):
                out[f"{l}.{k}.lengthscales"] = kernel.lengthscales
    return out


def _uses_exp(param) -> bool:
    bijector = param.transform
    parts = bijector.bijectors if hasattr(bijector, "bijectors") else [bijector]
    return any(type(b).__name__ == "Exp" for b in parts)


@pytest.mark.parametrize(
    "posterior, exp",
    [("global", True), ("local", True), ("mean_field", False), ("stripes_arrow", False)],
)
def test_positive_transform_follows_the_family_reference_code(posterior, exp, rng):
    # O&A's global and local inducing (bayesfunc) learn log-lengthscales and log-heights; the DSVI
    # and Lindinger code use GPflow's softplus.
    X, Y = _data(rng)
    model = dg.build_deep_gp(X, Y, depth=2, posterior=posterior, num_inducing=10, seed=0)
    params = _positive_parameters(model)
    assert (
        len(params) == 6
    )  # noise; inner SE variance + lengthscales, white; last SE variance + lengthscales
    assert all(_uses_exp(p) == exp for p in params.values()), {
        n: p.transform.name for n, p in params.items()
    }
    # the values are the DSVI ones whatever the transform
    np.testing.assert_allclose(model.layers[1].kernel.lengthscales.numpy(), np.full(5, 2.0))
    np.testing.assert_allclose(model.likelihood.variance.numpy(), 0.01)
    # explicit override, and GPflow's global setting is left alone
    other = "softplus" if exp else "exp"
    model = dg.build_deep_gp(
        X, Y, depth=2, posterior=posterior, num_inducing=10, seed=0, positive_transform=other
    )
    assert all(_uses_exp(p) == (not exp) for p in _positive_parameters(model).values())
    assert gpflow.config.default_positive_bijector() == "softplus"
    with pytest.raises(ValueError, match="positive_transform"):
        dg.build_deep_gp(
            X, Y, depth=2, posterior=posterior, num_inducing=10, positive_transform="log"
        )


def test_global_inducing_hyperparameters_take_relative_adam_steps(rng):
    # The cause of the slow convergence of global inducing on UCI energy
    # (benchmarks/results/gi_convergence.md): its ARD lengthscales must grow from 2 to 100+, and
    # under GPflow's softplus an Adam step moves a lengthscale by about the learning rate (0.01), so
    # that takes > 10,000 steps. Log-parameterised, the first Adam step (|update| = lr exactly)
    # changes every kernel variance and lengthscale by the factor exp(+-lr).
    X, Y = _data(rng)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="global", num_inducing=10, seed=0)
    params = {
        n: p
        for n, p in _positive_parameters(model).items()
        if n != "likelihood.variance" and not n.endswith(".1.variance")
    }  # the white noise 1e-5 sits on GPflow's positive minimum
    before = {n: p.numpy().copy() for n, p in params.items()}
    dg.fit(model, (X, Y), steps=1, learning_rate=0.01, seed=0, progress=False)
    for name, p in params.items():
        step = np.abs(np.log(p.numpy()) - np.log(before[name]))
        np.testing.assert_allclose(step, 0.01, rtol=1e-3, err_msg=name)
