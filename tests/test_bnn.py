"""BNN oracles (ALGORITHMS.md §2.4 and §3: O9, O13-O16, weight vs function space).

Every identity here fails if the maths of the weight-space posteriors is wrong: the global-
inducing layer with the true data as pseudo-data is Bayesian linear regression (O9, O14), the
factorised KL is the Normal KL (O13, O15), the local reparameterisation has the moments of
explicit weight samples (O16), and weight-space global inducing is the function-space posterior
with the weight-induced kernel.
"""
import gpflow
import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
import tensorflow_probability as tfp

from deepgp_gi.bnn import BNN_POSTERIORS, build_bnn
from deepgp_gi.datasets import deep_linear, deep_linear_log_evidence
from deepgp_gi.kernels import WeightKernel, batched_K, batched_K_diag, batched_K_sym
from deepgp_gi.layers import DenseLayer
from deepgp_gi.models import DeepGP
from deepgp_gi.noise import FixedNoise, SeededNoise
from deepgp_gi.posteriors import GlobalInducingPosterior, LocalInducingPosterior, ScalePosterior
from deepgp_gi.posteriors.factorised import (
    FactorisedGlobalPosterior,
    FactorisedWeightPosterior,
    RandomGlobalPosterior,
    factorised_kl,
    local_reparameterisation_moments,
)
from deepgp_gi.posteriors.pseudo_data import analytic_kl, log_ratio, pseudo_data_posterior, sample_weights
from deepgp_gi.priors import NealPrior, ScalePrior, StandardPrior

tfd = tfp.distributions


def _blr_log_evidence(Phi, Y, prior_var, noise_var):
    """sum_p log N(Y[:, p]; 0, prior_var Phi Phi^T + noise_var I)."""
    N = Phi.shape[0]
    C = prior_var * Phi @ Phi.T + noise_var * np.eye(N)
    return sum(scipy.stats.multivariate_normal(np.zeros(N), C).logpdf(Y[:, p]) for p in range(Y.shape[1]))


# ------------------------------------------------------------------------------ kernel, layer
def test_weight_kernel_is_feature_inner_product(rng):
    kern = WeightKernel(3, "relu", bias=True)
    F = rng.normal(size=(2, 5, 3))
    G = rng.normal(size=(2, 4, 3))
    Phi_F = np.concatenate([np.maximum(F, 0), np.ones((2, 5, 1))], -1)
    Phi_G = np.concatenate([np.maximum(G, 0), np.ones((2, 4, 1))], -1)
    np.testing.assert_allclose(kern.features(F), Phi_F)
    np.testing.assert_allclose(batched_K(kern, F, G), Phi_F @ Phi_G.transpose(0, 2, 1) / 4, rtol=1e-12)
    np.testing.assert_allclose(batched_K_sym(kern, F), Phi_F @ Phi_F.transpose(0, 2, 1) / 4, rtol=1e-12)
    np.testing.assert_allclose(batched_K_diag(kern, F), (Phi_F**2).sum(-1) / 4, rtol=1e-12)
    np.testing.assert_allclose(kern(F[0], G[0]), Phi_F[0] @ Phi_G[0].T / 4, rtol=1e-12)
    with pytest.raises(ValueError, match="3 columns"):
        kern.features(rng.normal(size=(4, 5)))
    # Standard prior: K = Phi Phi^T; Scale prior: E[1/s] = 2 for Gamma(2, 2).
    assert DenseLayer(3, 2, prior="standard").kernel.weight_variance == 1.0
    np.testing.assert_allclose(DenseLayer(3, 2, prior="scale").kernel.weight_variance, 2.0 / 4)
    layer = DenseLayer(3, 2, activation="tanh")
    assert (layer.input_dim, layer.output_dim, layer.fan_in, layer.inducing_variable) == (3, 2, 4, None)
    np.testing.assert_array_equal(layer.mean(F), np.zeros((2, 5, 2)))


# ------------------------------------------------------------------------------ O9 / O14 exact
@pytest.mark.parametrize("per_unit", [True, False])
@pytest.mark.parametrize("prior", ["neal", "standard"])
def test_O9_gi_layer_is_bayesian_linear_regression(rng, per_unit, prior):
    N, D0, P, noise_var = 12, 3, 2, 0.3
    X, Y = rng.normal(size=(N, D0)), rng.normal(size=(N, P))
    layer = DenseLayer(D0, P, "identity", prior=prior)
    post = GlobalInducingPosterior(
        [layer], inducing_inputs=X, pseudo_outputs=[Y], log_precision_init=[np.log(1 / noise_var)],
        precision="diagonal" if per_unit else "shared_diagonal",
    )
    model = DeepGP([layer], gpflow.likelihoods.Gaussian(noise_var), post, num_data=N)
    elbos = model.elbo_per_sample((X, Y), 6).numpy()
    Phi = np.concatenate([X, np.ones((N, 1))], 1)
    prior_var = 1 / (D0 + 1) if prior == "neal" else 1.0
    np.testing.assert_allclose(elbos, _blr_log_evidence(Phi, Y, prior_var, noise_var), rtol=0, atol=1e-9)


def test_O14_one_layer_linear_gi_equals_true_evidence(rng):
    data = deep_linear(num_train=60, num_test=1, input_dim=5, noise_variance=0.1, seed=3)
    X, Y = data.X_train, data.Y_train
    layer = DenseLayer(5, 1, "identity", prior=NealPrior(), bias=False)
    post = GlobalInducingPosterior([layer], inducing_inputs=X, pseudo_outputs=[Y], log_precision_init=[np.log(10.0)])
    model = DeepGP([layer], gpflow.likelihoods.Gaussian(0.1), post, num_data=60)
    expected = deep_linear_log_evidence(X, Y, 5, 0.1)
    np.testing.assert_allclose(model.elbo_per_sample((X, Y), 5), expected, rtol=0, atol=1e-9)


# ------------------------------------------------------------------------------ GI maths
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


def test_O15_gi_zero_precision_is_prior(rng):
    X = rng.normal(size=(7, 2))
    layers = [DenseLayer(2, 4, "identity"), DenseLayer(4, 1, "relu")]
    post = GlobalInducingPosterior(layers, inducing_inputs=rng.normal(size=(5, 2)), log_precision_init=[-800.0, -800.0])
    kl = post.propagate(X, 4, seed=1).kl
    np.testing.assert_allclose(kl, 0.0, atol=1e-12)


# ------------------------------------------------------------------------------ O13 / O15 KLs
@pytest.mark.parametrize("prior_cls", [NealPrior, StandardPrior])
def test_O13_factorised_kl_equals_tfp(rng, prior_cls):
    layers = [DenseLayer(3, 5, "identity", prior=prior_cls()), DenseLayer(5, 2, "tanh", prior=prior_cls())]
    means = [rng.normal(size=(4, 5)), rng.normal(size=(6, 2))]
    variances = [np.exp(rng.normal(size=(4, 5))), np.exp(rng.normal(size=(6, 2)))]
    post = FactorisedWeightPosterior(layers, means=means, variances=variances)
    kl = post.propagate(rng.normal(size=(4, 3)), 3, seed=0).kl.numpy()
    ref = 0.0
    for layer, mu, var in zip(layers, means, variances):
        prior_sd = np.sqrt(layer.prior.weight_variance(layer.fan_in))
        ref += tf.reduce_sum(tfd.kl_divergence(tfd.Normal(mu, np.sqrt(var)), tfd.Normal(0.0 * mu, prior_sd))).numpy()
    np.testing.assert_allclose(kl, ref, rtol=1e-12)


@pytest.mark.parametrize("prior_cls", [NealPrior, StandardPrior])
def test_O15_factorised_at_prior_has_zero_kl(prior_cls):
    layer = DenseLayer(4, 3, prior=prior_cls())
    var = layer.prior.weight_variance(layer.fan_in)
    post = FactorisedWeightPosterior([layer], means=[np.zeros((5, 3))], variances=[var])
    np.testing.assert_allclose(post.propagate(np.ones((2, 4)), 2, seed=0).kl, 0.0, atol=1e-12)
    np.testing.assert_allclose(factorised_kl(np.zeros((5, 3)), np.full((5, 3), var), np.full(2, 1 / var)), 0.0, atol=1e-12)


def test_O13_scale_prior_log_ratio_is_minus_gamma_kl():
    prior = ScalePrior()
    q = ScalePosterior()
    q.alpha.assign(0.3)
    q.beta.assign(-0.4)
    S = 100_000
    _, log_ratio_s = q.sample_scale(prior, S, SeededNoise(11), "s/0", tf.float64)
    mean, se = np.mean(log_ratio_s), np.std(log_ratio_s) / np.sqrt(S)
    expected = -tfd.kl_divergence(q.distribution(), prior.prior_distribution(tf.float64)).numpy()
    assert abs(mean - expected) < 4 * se, (mean, expected, se)


def test_O15_local_inducing_analytic_kl_is_mean_log_ratio(rng):
    layers = [
        DenseLayer(2, 3, "identity", inducing_features=rng.normal(size=(3, 3))),
        DenseLayer(3, 2, "relu", inducing_features=rng.normal(size=(4, 4))),
    ]
    kwargs = dict(log_precision_init=[0.5, -0.5], seed=4)
    analytic = LocalInducingPosterior(layers, kl="analytic", **kwargs)
    sampled = LocalInducingPosterior(layers, kl="sampled", **kwargs)
    X = rng.normal(size=(3, 2))
    kl_an = analytic.propagate(X, 2, seed=0).kl.numpy()
    np.testing.assert_allclose(kl_an[0], kl_an[1])
    S = 20_000
    kls = sampled.propagate(X, S, seed=1).kl.numpy()
    assert abs(kls.mean() - kl_an[0]) < 4 * kls.std() / np.sqrt(S)


# ------------------------------------------------------------------------------ O16
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
    # Explicit weights are shared by the rows of a sample; the local trick samples rows independently.
    assert np.all(explicit.propagate(X, 3, seed=2).var.numpy() == 0)


# ------------------------------------------------------------------------------ fac->gi, rand->gi
def test_hybrids_share_weights_between_inducing_and_data_rows(rng):
    """With U_0 = X the data rows equal the inducing rows: the same weights act on both."""
    X = rng.normal(size=(4, 2))
    for cls in (FactorisedGlobalPosterior, RandomGlobalPosterior, GlobalInducingPosterior):
        layers = [DenseLayer(2, 3, "identity"), DenseLayer(3, 1, "relu")]
        post = cls(layers, inducing_inputs=X)
        S = 3
        noise = FixedNoise({f"w/{l}": rng.normal(size=(S, layers[l].fan_in, layers[l].output_dim)) for l in range(2)})
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
    rand = RandomGlobalPosterior([DenseLayer(2, 3), DenseLayer(3, 1, "relu")], X, log_precision_init=-800.0)
    np.testing.assert_allclose(rand.propagate(X, 3, seed=0).kl, 0.0, atol=1e-12)


# ------------------------------------------------------------------------------ weight vs function space
def test_weight_and_function_space_gi_agree_on_q_of_inducing_outputs(rng):
    """One layer, same U_0, V, Lambda: the same Gaussian Q(U_1); and, for M <= D, the same
    per-sample log-ratio log q(W) - log p(W) = log Q(U) - log P(U) at U = Phi_u W."""
    M, D0, P = 3, 3, 2
    layer = DenseLayer(D0, P, "identity")
    U0, V = rng.normal(size=(M, D0)), rng.normal(size=(M, P))
    lam = np.exp(rng.normal(size=(P, M)))
    Phi_u = np.concatenate([U0, np.ones((M, 1))], 1)
    D = D0 + 1
    L, m = pseudo_data_posterior(Phi_u[None], V, np.array([float(D)]), diag_precision=lam)
    Kuu = Phi_u @ Phi_u.T / D
    L_K = np.linalg.cholesky(Kuu)[None]
    L_B, a_mean = pseudo_data_posterior(L_K, V, diag_precision=lam)
    mean_fs = L_K[0] @ a_mean[0].numpy()
    for u in range(P):
        mean_ws = Phi_u @ m[0, :, u].numpy()
        cov_ws = Phi_u @ np.linalg.inv(L[0, u] @ tf.transpose(L[0, u])) @ Phi_u.T
        LBinv = np.linalg.inv(L_B[0, u].numpy())
        cov_fs = L_K[0] @ LBinv.T @ LBinv @ L_K[0].T
        np.testing.assert_allclose(mean_ws, mean_fs[:, u], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(cov_ws, cov_fs, rtol=1e-9, atol=1e-12)
    # Per-sample log-ratio identity, with the function-space formula evaluated at U = Phi_u W.
    S = 5
    z = rng.normal(size=(S, D, P))
    L_S, m_S = tf.broadcast_to(L, [S, P, D, D]), tf.broadcast_to(m, [S, D, P])
    W = sample_weights(L_S, m_S, z)
    kl_ws = -log_ratio(L_S, W, z, np.full(S, float(D)))
    U = Phi_u[None] @ W.numpy()  # [S, M, P]
    for s in range(S):
        lr = 0.0
        for u in range(P):
            Sigma = np.linalg.inv(np.linalg.inv(Kuu) + np.diag(lam[u]))
            mu = Sigma @ (lam[u] * V[:, u])
            lr += scipy.stats.multivariate_normal(np.zeros(M), Kuu).logpdf(U[s, :, u])
            lr -= scipy.stats.multivariate_normal(mu, Sigma).logpdf(U[s, :, u])
        np.testing.assert_allclose(-kl_ws[s], lr, rtol=1e-8)


def test_weight_and_function_space_gi_agree_in_expectation(rng):
    """Two ReLU layers (M <= D_l): ELBO and predictive moments agree within Monte Carlo error."""
    N, D0, H, M = 8, 2, 4, 3
    X, Y = rng.normal(size=(N, D0)), rng.normal(size=(N, 1))
    Xs = rng.normal(size=(5, D0))
    U0 = rng.normal(size=(M, D0))
    V = [rng.normal(size=(M, H)), rng.normal(size=(M, 1))]
    log_prec = [-0.5, 1.0]
    layers = [DenseLayer(D0, H, "identity"), DenseLayer(H, 1, "relu")]
    ws = GlobalInducingPosterior(layers, inducing_inputs=U0, pseudo_outputs=V, log_precision_init=log_prec)
    fs = GlobalInducingPosterior(
        layers, inducing_inputs=U0, pseudo_outputs=V, log_precision_init=log_prec, precision="diagonal",
        space="function",
    )
    S = 4000
    lik = gpflow.likelihoods.Gaussian(0.2)
    out = {}
    for name, post in (("ws", ws), ("fs", fs)):
        model = DeepGP(layers, lik, post, num_data=N)
        elbo = model.elbo_per_sample((X, Y), S, seed=7).numpy()
        mean, var = model.predict_f_components(Xs, S, seed=8)
        out[name] = (elbo, mean.numpy()[..., 0], (mean**2 + var).numpy()[..., 0])
    for k in range(3):
        a, b = out["ws"][k], out["fs"][k]
        se = np.sqrt(a.var(0) / S + b.var(0) / S)
        assert np.all(np.abs(a.mean(0) - b.mean(0)) < 4.5 * se + 1e-6), (k, a.mean(0), b.mean(0), se)


# ------------------------------------------------------------------------------ gradients
def test_gi_weight_posterior_gradients_match_finite_differences(rng):
    N, D0 = 5, 2
    X, Y = rng.normal(size=(N, D0)), rng.normal(size=(N, 1))
    layers = [DenseLayer(D0, 3, "identity"), DenseLayer(3, 1, "tanh")]
    post = GlobalInducingPosterior(
        layers, inducing_inputs=rng.normal(size=(4, D0)),
        log_precision_init=[rng.normal(size=(3, 4)), rng.normal(size=(1, 4))], seed=1,
    )
    model = DeepGP(layers, gpflow.likelihoods.Gaussian(0.5), post, num_data=N)

    def f():
        return model.elbo((X, Y), 3, seed=5)

    params = [post.inducing_inputs, post.pseudo_data[0].pseudo_outputs, post.pseudo_data[0].precision,
              post.pseudo_data[1].pseudo_outputs, post.pseudo_data[1].precision]
    variables = [p.unconstrained_variable for p in params]
    with tf.GradientTape() as tape:
        value = f()
    grads = tape.gradient(value, variables)
    h = 1e-6
    for var, g in zip(variables, grads):
        flat = np.asarray(var.numpy()).ravel()
        for i in rng.choice(flat.size, size=min(3, flat.size), replace=False):
            delta = np.zeros(flat.size)
            delta[i] = h
            delta = delta.reshape(var.shape)
            var.assign_add(delta)
            up = f().numpy()
            var.assign_add(-2 * delta)
            down = f().numpy()
            var.assign_add(delta)
            fd = (up - down) / (2 * h)
            np.testing.assert_allclose(g.numpy().ravel()[i], fd, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------ O14 bound
def _adam(model, data, steps, num_samples=1):
    opt = tf.optimizers.Adam(0.01)
    variables = model.trainable_variables

    @tf.function
    def step(seed):
        with tf.GradientTape() as tape:
            loss = -model.elbo(data, num_samples, seed=tf.stack([seed, 0]))
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))

    for i in range(steps):
        step(tf.constant(i, tf.int64))


@pytest.mark.parametrize("posterior", BNN_POSTERIORS)
def test_O14_true_evidence_bounds_elbo(posterior):
    data = deep_linear(num_train=100, num_test=1, input_dim=5, noise_variance=0.1, seed=1)
    X, Y = data.X_train, data.Y_train
    log_true = deep_linear_log_evidence(X, Y, 5, 0.1)
    lik = gpflow.likelihoods.Gaussian(0.1)
    gpflow.set_trainable(lik, False)
    model = build_bnn(X, Y, hidden=(8,), posterior=posterior, activation="identity", num_inducing=10,
                      likelihood=lik, seed=0)
    Xt, Yt = tf.constant(X), tf.constant(Y)
    _adam(model, (Xt, Yt), 100)
    elbo = model.elbo((X, Y), 20, seed=123).numpy()
    assert np.isfinite(elbo)
    assert elbo / len(X) <= log_true / len(X) + 0.01, (elbo / len(X), log_true / len(X))


# ------------------------------------------------------------------------------ builder
def test_build_bnn_structure_and_initialisation(rng):
    X, Y = rng.normal(size=(30, 3)), rng.normal(size=(30, 2))
    m = build_bnn(X, Y, hidden=(6, 5), posterior="global", num_inducing=10, seed=0)
    assert [l.output_dim for l in m.layers] == [6, 5, 2] and m.num_data == 30
    assert m.layers[0].kernel.activation_name == "identity" and m.layers[1].kernel.activation_name == "relu"
    post = m.posterior
    # U_0 = a subset of the inputs, top pseudo-outputs = their targets.
    U0, V = post.inducing_inputs.numpy(), post.pseudo_data[-1].pseudo_outputs.numpy()
    idx = [int(np.argmin(np.abs(X - u).sum(1))) for u in U0]
    np.testing.assert_array_equal(X[idx], U0)
    np.testing.assert_array_equal(Y[idx], V)
    np.testing.assert_allclose(3 * post.pseudo_data[0].precision.unconstrained_variable.numpy(), -4.0)
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
    m = build_bnn(X, Y, hidden=(4,), num_inducing=5, likelihood=gpflow.likelihoods.Softmax(3), seed=0)
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


# ------------------------------------------------------------------------------ float32
@pytest.mark.parametrize("posterior", BNN_POSTERIORS)
def test_float32_end_to_end(rng, posterior):
    X = rng.normal(size=(20, 3)).astype(np.float32)
    Y = rng.normal(size=(20, 1)).astype(np.float32)
    with gpflow.config.as_context(gpflow.config.Config(float=np.float32, jitter=1e-4)):
        model = build_bnn(X, Y, hidden=(6, 6), posterior=posterior, prior="scale", num_inducing=8, seed=0)
        assert all(v.dtype == tf.float32 for v in model.trainable_variables)
        with tf.GradientTape() as tape:
            elbo = model.elbo((X, Y), 3, seed=0)
        grads = tape.gradient(elbo, model.trainable_variables)
        assert elbo.dtype == tf.float32 and np.isfinite(elbo.numpy())
        assert all(np.all(np.isfinite(g.numpy())) for g in grads)
        mean, var = model.predict_f(X, 4, seed=1)
        assert mean.dtype == tf.float32 and np.all(np.isfinite(mean.numpy())) and np.all(np.isfinite(var.numpy()))
