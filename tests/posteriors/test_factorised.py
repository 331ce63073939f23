"""Factorised BNN posteriors and the fac->gi / rand->gi hybrids: O13, O15, O16
(docs/algorithms.md, "Test oracles")."""

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from deepgp_gi.layers import DenseLayer
from deepgp_gi.noise import FixedNoise
from deepgp_gi.posteriors import GlobalInducingPosterior
from deepgp_gi.posteriors.factorised import (
    FactorisedGlobalPosterior,
    FactorisedWeightPosterior,
    RandomGlobalPosterior,
)
from deepgp_gi.posteriors.weight_space import factorised_kl, local_reparameterisation_moments
from deepgp_gi.priors import NealPrior, StandardPrior

tfd = tfp.distributions


@pytest.mark.parametrize("prior_cls", [NealPrior, StandardPrior])
def test_O13_factorised_kl_equals_tfp(rng, prior_cls):
    layers = [
        DenseLayer(3, 5, "identity", prior=prior_cls()),
        DenseLayer(5, 2, "tanh", prior=prior_cls()),
    ]
    means = [rng.normal(size=(4, 5)), rng.normal(size=(6, 2))]
    variances = [np.exp(rng.normal(size=(4, 5))), np.exp(rng.normal(size=(6, 2)))]
    post = FactorisedWeightPosterior(layers, means=means, variances=variances)
    kl = post.propagate(rng.normal(size=(4, 3)), 3, seed=0).kl.numpy()
    ref = 0.0
    for layer, mu, var in zip(layers, means, variances):
        prior_sd = np.sqrt(layer.prior.weight_variance(layer.fan_in))
        ref += tf.reduce_sum(
            tfd.kl_divergence(tfd.Normal(mu, np.sqrt(var)), tfd.Normal(0.0 * mu, prior_sd))
        ).numpy()
    np.testing.assert_allclose(kl, ref, rtol=1e-12)


@pytest.mark.parametrize("prior_cls", [NealPrior, StandardPrior])
def test_O15_factorised_at_prior_has_zero_kl(prior_cls):
    layer = DenseLayer(4, 3, prior=prior_cls())
    var = layer.prior.weight_variance(layer.fan_in)
    post = FactorisedWeightPosterior([layer], means=[np.zeros((5, 3))], variances=[var])
    np.testing.assert_allclose(post.propagate(np.ones((2, 4)), 2, seed=0).kl, 0.0, atol=1e-12)
    np.testing.assert_allclose(
        factorised_kl(np.zeros((5, 3)), np.full((5, 3), var), np.full(2, 1 / var)), 0.0, atol=1e-12
    )


def test_O16_local_reparameterisation_matches_weight_samples(rng):
    layer = DenseLayer(3, 2, "identity")
    means = [rng.normal(size=(4, 2)) * 0.5]
    variances = [np.exp(rng.normal(size=(4, 2))) * 0.2]
    explicit = FactorisedWeightPosterior([layer], means, variances, local_reparameterisation=False)
    local = FactorisedWeightPosterior([layer], means, variances, local_reparameterisation=True)
    X = rng.normal(size=(5, 3))
    prop = local.propagate(X, 1, seed=0)
    Phi = np.concatenate([X, np.ones((5, 1))], 1)
    m_ref, v_ref = local_reparameterisation_moments(Phi[None], means[0], variances[0])
    np.testing.assert_allclose(prop.mean[0], m_ref[0], rtol=1e-12)
    np.testing.assert_allclose(prop.var[0], v_ref[0], rtol=1e-12)
    S = 40_000
    F = explicit.propagate(X, S, seed=2).samples[-1].numpy()  # [S, 5, 2]
    se_mean = np.sqrt(prop.var[0].numpy() / S)
    assert np.all(np.abs(F.mean(0) - prop.mean[0].numpy()) < 4.5 * se_mean)
    emp_var = F.var(0)
    se_var = prop.var[0].numpy() * np.sqrt(2.0 / S)
    assert np.all(np.abs(emp_var - prop.var[0].numpy()) < 4.5 * se_var)
    # Explicit weights are shared by the rows of a sample; the local trick samples rows
    # independently.
    assert np.all(explicit.propagate(X, 3, seed=2).var.numpy() == 0)


def test_hybrids_share_weights_between_inducing_and_data_rows(rng):
    """With U_0 = X the data rows equal the inducing rows: the same weights act on both."""
    X = rng.normal(size=(4, 2))
    for cls in (FactorisedGlobalPosterior, RandomGlobalPosterior, GlobalInducingPosterior):
        layers = [DenseLayer(2, 3, "identity"), DenseLayer(3, 1, "relu")]
        post = cls(layers, inducing_inputs=X)
        S = 3
        noise = FixedNoise(
            {
                f"w/{l}": rng.normal(size=(S, layers[l].fan_in, layers[l].output_dim))
                for l in range(2)
            }
        )
        prop = post.propagate(X, S, noise)
        assert prop.samples[0].shape == (S, 4, 3) and prop.mean.shape == (S, 4, 1)
        # Data rows through the explicit network with the same lower-layer weights:
        if cls is RandomGlobalPosterior:
            W0 = noise.draws["w/0"] / np.sqrt(3.0)
        elif cls is FactorisedGlobalPosterior:
            mu, var = post.weights[0].moments()
            W0 = mu.numpy() + np.sqrt(var.numpy()) * noise.draws["w/0"]
        else:
            continue
        F0 = np.concatenate([X, np.ones((4, 1))], 1) @ W0
        np.testing.assert_allclose(prop.samples[0], F0, rtol=1e-12)
        assert np.all(np.isfinite(prop.kl.numpy()))
    rand = RandomGlobalPosterior(
        [DenseLayer(2, 3), DenseLayer(3, 1, "relu")], X, log_precision_init=-800.0
    )
    np.testing.assert_allclose(rand.propagate(X, 3, seed=0).kl, 0.0, atol=1e-12)
