"""The Bayesian linear regression of pseudo-data: moments, sampled log-ratio and analytic KL
against dense references (weight space, any prior precision)."""
import numpy as np
import pytest
import scipy.stats
import tensorflow_probability as tfp

from deepgp_gi.posteriors.pseudo_data import analytic_kl, log_ratio, pseudo_data_posterior, sample_weights

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
            np.testing.assert_allclose(W[s, :, u], mean + np.linalg.solve(chol.T, z[s, :, u]), rtol=1e-10)
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
            ref += tfd.kl_divergence(q, tfd.MultivariateNormalDiag(np.zeros(D), np.full(D, p**-0.5))).numpy()
        np.testing.assert_allclose(kl_an[s], ref, rtol=1e-10)
