"""The Bayesian linear regression of pseudo-data: moments, sampled log-ratio and analytic KL
against dense references (weight space, any prior precision)."""

import numpy as np
import pytest
import scipy.stats
import tensorflow_probability as tfp

from deepgp_gi.posteriors.pseudo_data import (
    analytic_kl,
    log_ratio,
    pseudo_data_posterior,
    sample_weights,
)

tfd = tfp.distributions


@pytest.mark.parametrize("per_unit", [True, False])
def test_gi_weight_posterior_moments_and_log_ratio(rng, per_unit):
    S, M, D, P, p = 2, 6, 4, 3, 2.5
    Phi_u = rng.normal(size=(S, M, D))
    lam = np.exp(rng.normal(size=(P if per_unit else 1, M)))
    V = rng.normal(size=(M, P))
    z = rng.normal(size=(S, D, P))
    L, m = pseudo_data_posterior(Phi_u, V, np.full(S, p), diag_precision=lam)
    W = sample_weights(L, m, z)
    kl = -log_ratio(L, W, z, np.full(S, p))
    for s in range(S):
        logq = logp = 0.0
        for u in range(P):
            lam_u = lam[u if per_unit else 0]
            prec = p * np.eye(D) + Phi_u[s].T @ (lam_u[:, None] * Phi_u[s])
            cov = np.linalg.inv(prec)
            mean = cov @ Phi_u[s].T @ (lam_u * V[:, u])
            chol = np.linalg.cholesky(prec)
            np.testing.assert_allclose(
                W[s, :, u], mean + np.linalg.solve(chol.T, z[s, :, u]), rtol=1e-10
            )
            logq += scipy.stats.multivariate_normal(mean, cov).logpdf(W[s, :, u])
            logp += scipy.stats.multivariate_normal(np.zeros(D), np.eye(D) / p).logpdf(W[s, :, u])
        np.testing.assert_allclose(kl[s], logq - logp, rtol=1e-10)
    # The analytic KL is the expectation of the sampled log-ratio (exact formula vs scipy/TFP).
    kl_an = analytic_kl(L, m, np.full(S, p)).numpy()
    for s in range(S):
        ref = 0.0
        for u in range(P):
            lam_u = lam[u if per_unit else 0]
            prec = p * np.eye(D) + Phi_u[s].T @ (lam_u[:, None] * Phi_u[s])
            cov = np.linalg.inv(prec)
            mean = cov @ Phi_u[s].T @ (lam_u * V[:, u])
            q = tfd.MultivariateNormalFullCovariance(mean, cov)
            ref += tfd.kl_divergence(
                q, tfd.MultivariateNormalDiag(np.zeros(D), np.full(D, p**-0.5))
            ).numpy()
        np.testing.assert_allclose(kl_an[s], ref, rtol=1e-10)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_stacked_posterior_equals_the_layers_own(rng, dtype):
    """``stacked_posterior`` and ``stacked_analytic_kl`` (local inducing's layers as one stack)
    against each layer's :meth:`PseudoData.posterior` and :func:`analytic_kl`, with their
    gradients."""
    import gpflow
    import tensorflow as tf

    from deepgp_gi.posteriors.pseudo_data import PseudoData, stacked_analytic_kl, stacked_posterior

    M, widths = 5, (3, 2, 1)
    with gpflow.config.as_context(gpflow.config.Config(float=dtype)):
        layers = [
            PseudoData(rng.normal(size=(M, P)), "full", 0.3 * i - 0.2, name=f"pd{i}")
            for i, P in enumerate(widths)
        ]
        for pd in layers:  # a shape other than the identity
            pd.precision_shape.assign(np.eye(M) + 0.2 * np.tril(rng.normal(size=(M, M))))
    X = rng.normal(size=(len(widths), M, M))
    L_K = tf.constant(np.linalg.cholesky(X @ np.transpose(X, (0, 2, 1)) + M * np.eye(M)), dtype)
    variables = [v for pd in layers for v in pd.trainable_variables]
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(L_K)
        stacked = stacked_posterior(layers, L_K)
        kl = stacked_analytic_kl(stacked)
        stacked_loss = kl + sum(tf.reduce_sum(tf.sin(m)) for m in stacked.means)
        own = [pd.posterior(tf.expand_dims(L_K[i], 0)) for i, pd in enumerate(layers)]
        own_kl = tf.add_n([analytic_kl(L, m)[0] for L, m in own])
        own_loss = own_kl + sum(tf.reduce_sum(tf.sin(m[0])) for _, m in own)
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == np.float64 else dict(rtol=2e-4, atol=1e-5)
    for i, (L, m) in enumerate(own):
        np.testing.assert_allclose(stacked.factors[i], L[0], **tol)
        np.testing.assert_allclose(stacked.means[i], m[0], **tol)
        np.testing.assert_allclose(stacked.inverse_factors[i] @ L[0], np.eye(M), **tol)
    np.testing.assert_allclose(kl, own_kl, **tol)
    for a, b in zip(
        tape.gradient(stacked_loss, variables + [L_K]), tape.gradient(own_loss, variables + [L_K])
    ):
        np.testing.assert_allclose(a, b, **tol)


@pytest.mark.parametrize("kind", ["full", "diagonal", "shared_diagonal"])
def test_draw_is_the_mean_plus_the_posterior_draw(rng, kind):
    """``PseudoData.draw`` (the draw by two solves, sharing the mean's first) returns
    :func:`sample_weights`' draw ``mean + L^{-T} z`` from :meth:`PseudoData.posterior`'s own
    ``(L, mean)``, with the same gradients; the draw does not depend on ``with_mean``."""
    import tensorflow as tf

    from deepgp_gi.posteriors.pseudo_data import PseudoData

    S, M, P = 2, 5, 3
    pd = PseudoData(rng.normal(size=(M, P)), kind, 0.4)
    Phi = tf.constant(rng.normal(size=(S, M, M)))
    z = tf.constant(rng.normal(size=(S, M, P)))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(Phi)
        L, mean = pd.posterior(Phi)
        reference = sample_weights(L, mean, z)
        only = pd.draw(Phi, z)
        both = pd.draw(Phi, z, with_mean=True)
        loss, loss_ref = tf.reduce_sum(tf.sin(only.weights)), tf.reduce_sum(tf.sin(reference))
    assert only.mean is None
    np.testing.assert_array_equal(only.factor, L)
    np.testing.assert_array_equal(both.mean, mean)
    np.testing.assert_array_equal(both.weights, only.weights)
    np.testing.assert_allclose(only.weights, reference, rtol=1e-10, atol=1e-12)
    sources = [Phi] + list(pd.trainable_variables)
    for a, b in zip(tape.gradient(loss, sources), tape.gradient(loss_ref, sources)):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
