"""The family tables: one name -> class table per model kind, read by DeepGP, the builders and
the CLI; unknown options are refused with the accepted ones named."""

import gpflow
import numpy as np
import pytest

import deepgp_gi as dg
from deepgp_gi import cli
from deepgp_gi.families import BNN_FAMILIES, DEEP_GP_FAMILIES
from deepgp_gi.layers import DenseLayer, GPLayer
from deepgp_gi.noise import SeededNoise


def _data(rng, N=30, D=3):
    X = rng.normal(size=(N, D))
    return X, np.sin(X[:, :1]) + 0.1 * rng.normal(size=(N, 1))


def test_cli_and_builders_read_the_tables():
    assert cli.GP_POSTERIORS == tuple(DEEP_GP_FAMILIES)
    assert cli.BNN_POSTERIORS == tuple(BNN_FAMILIES) == dg.bnn.BNN_POSTERIORS
    for name, family in {**DEEP_GP_FAMILIES, **BNN_FAMILIES}.items():
        assert issubclass(family, dg.posteriors.DeepPosterior) and family.summary


@pytest.mark.parametrize("posterior", list(DEEP_GP_FAMILIES))
def test_build_deep_gp_names_the_accepted_options(rng, posterior):
    X, Y = _data(rng)
    with pytest.raises(ValueError, match="bogus_option") as err:
        dg.build_deep_gp(X, Y, depth=2, posterior=posterior, num_inducing=5, bogus_option=1)
    accepted = DEEP_GP_FAMILIES[posterior].options
    assert accepted and all(option in str(err.value) for option in accepted)


@pytest.mark.parametrize("posterior", list(BNN_FAMILIES))
def test_build_bnn_names_the_accepted_options(rng, posterior):
    X, Y = _data(rng)
    with pytest.raises(
        ValueError, match="accepted options: " + ", ".join(BNN_FAMILIES[posterior].options)
    ):
        dg.build_bnn(X, Y, hidden=(4,), posterior=posterior, num_inducing=5, bogus_option=1)


def test_every_listed_option_is_accepted_by_its_family(rng):
    """The option lists are not decoration: each one reaches the posterior (a typo'd list would
    raise a TypeError here)."""
    X, Y = _data(rng)
    values = dict(
        whiten=True,
        q_sqrt_scales=[1e-5, 1.0],
        inner_scale=1e-4,
        stripes=False,
        arrow=True,
        precision="diagonal",
        kl="analytic",
        residual_mean=False,
        rho=2.0,
        space="auto",
        log_precision_hidden=-3.0,
        log_precision_output=0.5,
        log_precision=-1.0,
        local_reparameterisation=False,
        lambda_init=2e-3,
        lambda_max=0.5,
        sd_init=2e-3,
        sd_max=0.5,
        d_init=2e-3,
        jitter=1e-5,
        num_members=3,
        member_spread=0.2,
        prior_regulariser=True,
        precondition_offdiagonal=False,
        offdiagonal_step=0.5,
        last_layer="sampled",
        step_size=0.02,
        momentum_decay=0.1,
        window_size=10,
        chain_steps=3,
        inducing_prior="determinantal",
        log_lengthscale_prior=(0.1, 2.0),
        log_variance_prior=(-2.0, 1.5),
        num_sigma_points=3,
    )
    for name, family in DEEP_GP_FAMILIES.items():
        model = dg.build_deep_gp(
            X,
            Y,
            depth=2,
            posterior=name,
            num_inducing=5,
            inner_width=1,
            **{k: values[k] for k in family.options},
        )
        assert np.isfinite(model.elbo((X, Y), 2, seed=0).numpy())
    for name, family in BNN_FAMILIES.items():
        model = dg.build_bnn(
            X,
            Y,
            hidden=(4,),
            posterior=name,
            num_inducing=5,
            **{k: values[k] for k in family.options},
        )
        assert np.isfinite(model.elbo((X, Y), 2, seed=0).numpy())


def test_deep_gp_by_name_on_dense_layers_is_build_bnn_global(rng):
    """DeepGP(dense_layers, lik, posterior="global") and build_bnn(..., posterior="global") run the
    same class; with the same parameter values they give the same distribution: identical samples,
    KL and ELBO under the same noise."""
    X, Y = _data(rng)
    built = dg.build_bnn(
        X, Y, hidden=(5,), posterior="global", num_inducing=100, seed=3
    )  # DeepGP default M
    layers = [DenseLayer(3, 5, "identity", name="a"), DenseLayer(5, 1, "relu", name="b")]
    by_name = dg.DeepGP(
        layers,
        gpflow.likelihoods.Gaussian(built.likelihood.variance.numpy()),
        "global",
        num_data=len(X),
    )
    assert (
        type(by_name.posterior) is type(built.posterior) is dg.posteriors.GlobalInducingBNNPosterior
    )
    assert isinstance(built.posterior, dg.posteriors.GlobalInducingPosterior)
    assert by_name.posterior.weight_space == built.posterior.weight_space == [True, True]
    # copy every variational parameter (paths and shapes must agree: one parameterisation)
    ours = gpflow.utilities.parameter_dict(by_name.posterior)
    theirs = gpflow.utilities.parameter_dict(built.posterior)
    assert sorted(ours) == sorted(theirs)
    for key, param in ours.items():
        param.assign(theirs[key].numpy())
    a = by_name.posterior.propagate(X, 4, SeededNoise(7))
    b = built.posterior.propagate(X, 4, SeededNoise(7))
    for x, y in zip(a.samples + [a.kl], b.samples + [b.kl]):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    np.testing.assert_array_equal(
        by_name.elbo((X, Y), 3, seed=1).numpy(), built.elbo((X, Y), 3, seed=1).numpy()
    )


def test_deep_gp_by_name_picks_the_table_of_the_layers(rng):
    gp_layers = [GPLayer(gpflow.kernels.SquaredExponential(), 1, 2)]
    assert isinstance(
        dg.DeepGP(gp_layers, gpflow.likelihoods.Gaussian()).posterior,
        dg.posteriors.GlobalInducingPosterior,
    )
    dense = [DenseLayer(2, 1)]
    assert isinstance(
        dg.DeepGP(dense, gpflow.likelihoods.Gaussian(), "factorised").posterior,
        dg.posteriors.FactorisedWeightPosterior,
    )
    with pytest.raises(ValueError, match="unknown posterior 'factorised' for deep GP layers"):
        dg.DeepGP(gp_layers, gpflow.likelihoods.Gaussian(), "factorised")
    with pytest.raises(ValueError, match="'factorised', 'local', 'global'"):
        dg.DeepGP(dense, gpflow.likelihoods.Gaussian(), "mean_field")
