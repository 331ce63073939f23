"""Inducing weights (Ritter et al. 2021): O11 (docs/algorithms.md, "Test oracles"), the KL terms,
gradients, training, parameter counts."""

import gpflow
import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp

from deepgp_gi.bnn import build_bnn
from deepgp_gi.layers import DenseLayer
from deepgp_gi.noise import FixedNoise, SeededNoise
from deepgp_gi.posteriors.inducing_weights import (
    EnsembleInducingPosterior,
    EnsembleWeightPosterior,
    FFGInducingPosterior,
    conditional_kl,
    conditional_projections,
    effective_diagonal,
    ensemble_members,
    extended_matheron_sample,
    matheron_factors,
    matheron_noise_shapes,
    whitened_gaussian_kl,
    whitened_log_prior,
)
from deepgp_gi.priors import NealPrior

tfd = tfp.distributions


def _problem(rng, d_out, d_in, M_out, M_in):
    Z_r = rng.normal(size=(M_out, d_out)) / np.sqrt(M_out)
    Z_c = rng.normal(size=(M_in, d_in)) / np.sqrt(M_in)
    D_r = np.exp(rng.normal(size=M_out) * 0.3) * 0.5
    D_c = np.exp(rng.normal(size=M_in) * 0.3) * 0.5
    return Z_r, Z_c, D_r, D_c


def _np_conditional_cov(Z_r, Z_c, D_r, D_c):
    """``I - Z_c^T Psi_c^-1 Z_c kron Z_r^T Psi_r^-1 Z_r`` for column-stacked vec W
    (NumPy solves)."""
    Psi_r = Z_r @ Z_r.T + np.diag(D_r**2)
    Psi_c = Z_c @ Z_c.T + np.diag(D_c**2)
    Kr = Z_r.T @ np.linalg.solve(Psi_r, Z_r)
    Kc = Z_c.T @ np.linalg.solve(Psi_c, Z_c)
    return np.eye(Kr.shape[0] * Kc.shape[0]) - np.kron(Kc, Kr)


def _linear_map(factors, lam, sigma, shapes, with_u):
    """Columns = ``vec W`` (column-stacked) for a unit vector of each noise entry (E1..E4, and
    the whitened U if ``with_u``): W is linear in the noise, so Cov W = A A^T."""
    sizes = [int(np.prod(s)) for s in shapes]
    n_u = int(np.prod(shapes[3])) if with_u else 0
    n = sum(sizes) + n_u
    eye = np.eye(n)
    parts, start = [], 0
    for s, size in zip(shapes, sizes):
        parts.append(eye[:, start : start + size].reshape((n, *s)))
        start += size
    U = eye[:, start:].reshape((n, *shapes[3])) if with_u else np.zeros((n, *shapes[3]))
    W = extended_matheron_sample(
        tf.constant(U),
        factors,
        tf.constant(lam, tf.float64),
        tf.fill([n], tf.constant(sigma, tf.float64)),
        *map(tf.constant, parts),
    ).numpy()
    return np.stack([w.flatten(order="F") for w in W], axis=1)  # [d_out d_in, n]


@pytest.mark.parametrize("dims", [(3, 4, 2, 3), (4, 3, 4, 3), (2, 5, 3, 2), (3, 2, 5, 4)])
def test_O11_matheron_covariance_is_scaled_conditional(rng, dims):
    """Exact covariance of the sampled W (a linear map of E1..E4) = lam^2 sigma^2 Cov
    p(W|U)/sigma^2; covers M < d, M = d and M > d (the long-root branch of matheron_factors)."""
    d_out, d_in, M_out, M_in = dims
    Z_r, Z_c, D_r, D_c = _problem(rng, *dims)
    factors = matheron_factors(*map(tf.constant, (Z_r, Z_c, D_r, D_c)))
    shapes = matheron_noise_shapes(d_out, d_in, M_out, M_in)
    lam, sigma = 0.37, 1.7
    A = _linear_map(factors, lam, sigma, shapes, with_u=False)
    ref = lam**2 * sigma**2 * _np_conditional_cov(Z_r, Z_c, D_r, D_c)
    np.testing.assert_allclose(A @ A.T, ref, atol=1e-12)


@pytest.mark.parametrize("dims", [(3, 4, 2, 3), (3, 2, 5, 4)])
def test_O11_prior_marginal_is_isotropic(rng, dims):
    """lam = 1 and U ~ p(U) (whitened U~ ~ N(0, I)): Cov W = sigma^2 I exactly."""
    d_out, d_in, M_out, M_in = dims
    Z_r, Z_c, D_r, D_c = _problem(rng, *dims)
    factors = matheron_factors(*map(tf.constant, (Z_r, Z_c, D_r, D_c)))
    A = _linear_map(factors, 1.0, 0.8, matheron_noise_shapes(*dims), with_u=True)
    np.testing.assert_allclose(A @ A.T, 0.64 * np.eye(d_out * d_in), atol=1e-12)


def test_O11_with_jitter_is_exact_for_the_effective_diagonal(rng):
    Z_r, Z_c, D_r, D_c = _problem(rng, 3, 4, 3, 2)
    jitter = 1e-2
    factors = matheron_factors(*map(tf.constant, (Z_r, Z_c, D_r, D_c)), jitter=jitter)
    D_r_eff = np.sqrt(D_r**2 + jitter * np.mean(np.sum(Z_r**2, 1) + D_r**2))
    D_c_eff = np.sqrt(D_c**2 + jitter * np.mean(np.sum(Z_c**2, 1) + D_c**2))
    np.testing.assert_allclose(effective_diagonal(Z_r, D_r, jitter), D_r_eff, rtol=1e-14)
    A = _linear_map(factors, 0.5, 1.0, matheron_noise_shapes(3, 4, 3, 2), with_u=False)
    np.testing.assert_allclose(
        A @ A.T, 0.25 * _np_conditional_cov(Z_r, Z_c, D_r_eff, D_c_eff), atol=1e-12
    )


def test_O11_monte_carlo_mean_is_TrUTc(rng):
    """Unwhitened U: the MC mean of W equals sigma T_r U T_c within 4 standard errors, and the
    whitened path gives the same W for U~ = L_r^-1 U L_c^-T."""
    d_out, d_in, M_out, M_in = 3, 4, 2, 3
    Z_r, Z_c, D_r, D_c = _problem(rng, d_out, d_in, M_out, M_in)
    factors = matheron_factors(*map(tf.constant, (Z_r, Z_c, D_r, D_c)))
    U = rng.normal(size=(M_out, M_in))
    T_r, T_c = conditional_projections(*map(tf.constant, (Z_r, Z_c, D_r, D_c)))
    sigma, lam, S = 1.3, 0.6, 20_000
    noise = SeededNoise(3)
    e = [
        noise.normal(f"e{i}", [S, *s], tf.float64)
        for i, s in enumerate(matheron_noise_shapes(d_out, d_in, M_out, M_in))
    ]
    W = extended_matheron_sample(
        tf.constant(np.broadcast_to(U, (S, M_out, M_in))),
        factors,
        tf.constant(lam, tf.float64),
        tf.fill([S], tf.constant(sigma, tf.float64)),
        *e,
        whitened=False,
    ).numpy()
    mean = sigma * T_r.numpy() @ U @ T_c.numpy()
    Psi_r, Psi_c = Z_r @ Z_r.T + np.diag(D_r**2), Z_c @ Z_c.T + np.diag(D_c**2)
    np.testing.assert_allclose(T_r, Z_r.T @ np.linalg.inv(Psi_r), rtol=1e-10)
    np.testing.assert_allclose(T_c, np.linalg.inv(Psi_c) @ Z_c, rtol=1e-10)
    se = W.std(0) / np.sqrt(S)
    assert np.all(np.abs(W.mean(0) - mean) < 4 * se)
    L_r, L_c = np.linalg.cholesky(Psi_r), np.linalg.cholesky(Psi_c)
    U_w = np.linalg.solve(L_r, np.linalg.solve(L_c, U.T).T)
    W_w = extended_matheron_sample(
        tf.constant(np.broadcast_to(U_w, (S, M_out, M_in))),
        factors,
        tf.constant(lam, tf.float64),
        tf.fill([S], tf.constant(sigma, tf.float64)),
        *e,
        whitened=True,
    ).numpy()
    np.testing.assert_allclose(W_w, W, atol=1e-10)


def test_conditional_kl_equals_tfp_mvn_kl(rng):
    d_out, d_in, M_out, M_in = 3, 2, 2, 2
    Z_r, Z_c, D_r, D_c = _problem(rng, d_out, d_in, M_out, M_in)
    T_r, T_c = conditional_projections(*map(tf.constant, (Z_r, Z_c, D_r, D_c)))
    U = rng.normal(size=(M_out, M_in))
    sigma, lam = 0.7, 0.3
    mean = (sigma * T_r.numpy() @ U @ T_c.numpy()).flatten(order="F")
    cov = sigma**2 * _np_conditional_cov(Z_r, Z_c, D_r, D_c)
    p = tfd.MultivariateNormalTriL(mean, np.linalg.cholesky(cov))
    q = tfd.MultivariateNormalTriL(mean, np.linalg.cholesky(lam**2 * cov))
    ref = tfd.kl_divergence(q, p).numpy()
    np.testing.assert_allclose(
        conditional_kl(tf.constant(lam, tf.float64), d_out, d_in), ref, rtol=1e-10
    )


def test_ffg_u_kl_equals_tfp_and_posterior_kl(rng):
    layers = [DenseLayer(2, 4, "identity"), DenseLayer(4, 1, "tanh")]
    post = FFGInducingPosterior(layers, num_inducing=3, lambda_init=0.2, sd_init=0.3, seed=1)
    for sd in post.u_sds:
        sd.assign(np.exp(rng.normal(size=sd.shape) * 0.3) * 0.4)
    ref = 0.0
    for l, iw in enumerate(post.inducing_weights):
        m, s = post.u_means[l].numpy(), post.u_sds[l].numpy()
        kl_u = tf.reduce_sum(
            tfd.kl_divergence(tfd.Normal(m, s), tfd.Normal(0 * m, 1 + 0 * m))
        ).numpy()
        np.testing.assert_allclose(whitened_gaussian_kl(m, s), kl_u, rtol=1e-12)
        lam = iw.lam.numpy()
        ref += kl_u + iw.d_in * iw.d_out * (lam**2 / 2 - np.log(lam) - 0.5)
    np.testing.assert_allclose(
        post.propagate(rng.normal(size=(5, 2)), 3, seed=0).kl, ref, rtol=1e-12
    )


def test_at_the_prior_kl_is_zero_and_weights_are_prior_samples(rng):
    """lam = 1 and q(U~) = N(0, I): zero KL; the sampled weights have Cov sigma^2 I (MC)."""
    layer = DenseLayer(3, 2, "identity", prior=NealPrior(sd=2.0))
    post = FFGInducingPosterior(
        [layer], num_inducing=2, lambda_init=1.0, sd_init=1.0, means=[np.zeros((2, 2))], seed=0
    )
    X = np.eye(3)
    np.testing.assert_allclose(post.propagate(X, 2, seed=0).kl, 0.0, atol=1e-12)
    S = 40_000
    F = post.propagate(
        np.concatenate([X, np.zeros((1, 3))]), S, seed=4
    ).mean.numpy()  # rows = W rows (+ bias)
    W = np.concatenate([F[:, :3] - F[:, 3:4], F[:, 3:4]], axis=1).reshape(S, -1)  # [S, 4*2] weights
    var = 4.0 / layer.fan_in
    emp = np.cov(W.T)
    assert np.all(np.abs(np.diag(emp) - var) < 4 * var * np.sqrt(2 / S))
    off = emp[~np.eye(8, dtype=bool)]
    assert np.all(np.abs(off) < 4.5 * var / np.sqrt(S))


def _fd_check(post, X, Y, noise, rtol=1e-5):
    lik = gpflow.likelihoods.Gaussian(variance=0.3)

    @tf.function(autograph=False)  # traced once: the ~100 evaluations below reuse the graph
    def objective():
        prop = post.propagate(X, 2, seed=noise)
        ell = tf.reduce_sum(lik.variational_expectations(X, prop.mean, prop.var, Y[None]), axis=-1)
        return tf.reduce_mean(ell - prop.kl)

    variables = post.trainable_variables
    with tf.GradientTape() as tape:
        value = objective()
    grads = tape.gradient(value, variables)
    h = 1e-6
    checked = 0
    for var, g in zip(variables, grads):
        flat = var.numpy().ravel()
        for i in range(min(flat.size, 3)):
            orig = flat.copy()
            up, down = orig.copy(), orig.copy()
            up[i] += h
            down[i] -= h
            var.assign(up.reshape(var.shape))
            f_up = objective().numpy()
            var.assign(down.reshape(var.shape))
            f_down = objective().numpy()
            var.assign(orig.reshape(var.shape))
            fd = (f_up - f_down) / (2 * h)
            np.testing.assert_allclose(
                tf.convert_to_tensor(g).numpy().ravel()[i],
                fd,
                rtol=rtol,
                atol=1e-6,
                err_msg=var.name,
            )
            checked += 1
    assert checked >= len(variables) == len(grads)
    return [v.name for v in variables]


def test_finite_difference_gradients_ffg_u(rng):
    layers = [DenseLayer(2, 3, "identity"), DenseLayer(3, 1, "tanh")]
    post = FFGInducingPosterior(
        layers, num_inducing=2, lambda_init=0.3, sd_init=0.2, d_init=0.5, seed=2
    )
    X, Y = rng.normal(size=(4, 2)), rng.normal(size=(4, 1))
    names = _fd_check(post, X, Y, SeededNoise(7))
    for key in ("z_rows", "z_cols", "d_rows", "d_cols", "lambda", "u_mean", "u_sd"):
        assert any(key in n for n in names), key


@pytest.mark.slow  # moved to `make test-all` for the fast suite's time
def test_finite_difference_gradients_ensemble_u(rng):
    layers = [DenseLayer(2, 3, "identity"), DenseLayer(3, 1, "tanh")]
    post = EnsembleInducingPosterior(
        layers,
        num_inducing=2,
        num_members=3,
        lambda_init=0.3,
        d_init=0.5,
        prior_regulariser=True,
        seed=2,
    )
    X, Y = rng.normal(size=(4, 2)), rng.normal(size=(4, 1))
    _fd_check(post, X, Y, SeededNoise(8))


def test_ensemble_members_cycle_and_prediction_averages_members(rng):
    K = 4
    for z in (-3.0, -0.1, 0.2, 2.5):
        m = ensemble_members(K, 9, FixedNoise({"member": np.array([z])}), tf.float64).numpy()
        offset = min(int(np.floor(K * __import__("scipy").stats.norm.cdf(z))), K - 1)
        np.testing.assert_array_equal(m, (offset + np.arange(9)) % K)
    # The training noise gives every member ~1/K of the steps.
    counts = np.bincount(
        [int(ensemble_members(K, 1, SeededNoise([5, t]), tf.float64)[0]) for t in range(400)],
        minlength=K,
    )
    assert counts.min() > 60
    layers = [DenseLayer(1, 3, "identity"), DenseLayer(3, 1, "tanh")]
    for post in (
        EnsembleWeightPosterior(layers, num_members=K, seed=0),
        EnsembleInducingPosterior(layers, num_inducing=2, num_members=K, lambda_init=1e-6, seed=0),
    ):
        X = rng.normal(size=(5, 1))
        F = post.propagate(X, 2 * K, seed=3).mean.numpy()
        np.testing.assert_allclose(F[:K], F[K:], atol=1e-5)  # member s and s + K coincide (lam ~ 0)
        assert np.std(F[:K], axis=0).min() > 1e-3  # members differ


def test_ensemble_w_forward_and_regulariser(rng):
    layer = DenseLayer(2, 3, "identity", prior=NealPrior(sd=1.5))
    post = EnsembleWeightPosterior([layer], num_members=3, prior_regulariser=True, seed=0)
    X = rng.normal(size=(4, 2))
    prop = post.propagate(X, 3, seed=FixedNoise({"member": np.array([-5.0])}))
    Ws = post.weight_members[0].numpy() / np.sqrt(3)
    Phi = np.concatenate([X, np.ones((4, 1))], 1)
    for s in range(3):
        np.testing.assert_allclose(prop.mean[s], Phi @ Ws[s], rtol=1e-12)
        ref = -tf.reduce_sum(tfd.Normal(0.0, 1.5 / np.sqrt(3)).log_prob(Ws[s])).numpy()
        np.testing.assert_allclose(prop.kl[s], ref, rtol=1e-12)


def test_ensemble_u_regulariser_is_matrix_normal_log_prob(rng):
    Z_r, Z_c, D_r, D_c = _problem(rng, 3, 4, 2, 3)
    f = matheron_factors(*map(tf.constant, (Z_r, Z_c, D_r, D_c)))
    U_w = rng.normal(size=(2, 2, 3))
    U = f.chol_r.numpy() @ U_w @ f.chol_c.numpy().T
    Psi_r, Psi_c = Z_r @ Z_r.T + np.diag(D_r**2), Z_c @ Z_c.T + np.diag(D_c**2)
    ref = (
        tfd.MultivariateNormalFullCovariance(np.zeros(6), np.kron(Psi_c, Psi_r))
        .log_prob(np.stack([u.flatten(order="F") for u in U]))
        .numpy()
    )
    np.testing.assert_allclose(whitened_log_prior(U_w, f.chol_r, f.chol_c), ref, rtol=1e-10)


def test_float32_runs():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 1)).astype(np.float32)
    Y = np.cos(X).astype(np.float32)
    with gpflow.config.as_context(gpflow.config.Config(float=np.float32, jitter=1e-5)):
        for name in ("ffg_u", "ensemble_u", "ensemble_w"):
            model = build_bnn(
                X, Y, hidden=(6,), posterior=name, num_inducing=4, activation="tanh", seed=0
            )
            assert all(v.dtype == tf.float32 for v in model.trainable_variables)
            prop = model.propagate(X, 3, seed=1)
            assert prop.mean.dtype == tf.float32 and prop.kl.dtype == tf.float32
            assert np.all(np.isfinite(prop.mean.numpy())) and np.all(np.isfinite(prop.kl.numpy()))
            elbo = tf.function(lambda: model.elbo((X, Y), 2, seed=2), autograph=False)()
            assert elbo.dtype == tf.float32 and np.isfinite(elbo.numpy())


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(num_inducing=0), "num_inducing"),
        (dict(lambda_max=-1.0), "lambda_max"),
        (dict(lambda_init=0.5, lambda_max=0.1), "lambda_init"),
        (dict(sd_max=0.0), "sd_max"),
        (dict(sd_init=2.0, sd_max=1.0), "sd_init"),
        (dict(d_init=float("nan")), "d_init"),
        (dict(jitter=-1e-3), "jitter"),
        (dict(means=[np.zeros((9, 9)), None]), "means"),
    ],
)
def test_bad_ffg_u_options_raise(kwargs, argument):
    layers = [DenseLayer(2, 3, "identity"), DenseLayer(3, 1, "tanh")]
    with pytest.raises(ValueError, match=argument):
        FFGInducingPosterior(layers, **kwargs)


@pytest.mark.parametrize(
    "cls, kwargs, argument",
    [
        (EnsembleInducingPosterior, dict(num_members=0), "num_members"),
        (EnsembleInducingPosterior, dict(member_spread=-1.0), "member_spread"),
        (EnsembleInducingPosterior, dict(prior_regulariser="yes"), "prior_regulariser"),
        (EnsembleWeightPosterior, dict(num_members=1.5), "num_members"),
    ],
)
def test_bad_ensemble_options_raise(cls, kwargs, argument):
    layers = [DenseLayer(2, 3, "identity"), DenseLayer(3, 1, "tanh")]
    with pytest.raises((ValueError, TypeError), match=argument):
        cls(layers, **kwargs)


def test_build_bnn_unknown_option_names_it():
    X, Y = np.zeros((4, 1)), np.zeros((4, 1))
    with pytest.raises(ValueError, match="sd_max"):
        build_bnn(X, Y, hidden=(3,), posterior="ensemble_u", sd_max=0.1)


@pytest.mark.slow  # 200 Adam steps per family: `make test-all`
@pytest.mark.parametrize("posterior", ["ffg_u", "ensemble_u"])
def test_build_bnn_trains(rng, posterior):
    """build_bnn(posterior=...) on a small regression set: the ELBO rises over 200 Adam steps."""
    X = rng.uniform(-2, 2, size=(40, 1))
    Y = np.sin(2 * X) + 0.1 * rng.normal(size=(40, 1))
    model = build_bnn(
        X, Y, hidden=(20,), posterior=posterior, num_inducing=8, activation="tanh", seed=0
    )
    assert (
        type(model.posterior)
        is {"ffg_u": FFGInducingPosterior, "ensemble_u": EnsembleInducingPosterior}[posterior]
    )
    assert model.posterior.num_inducing == 8
    assert [iw.M_out for iw in model.posterior.inducing_weights] == [8, 1]
    Xt, Yt = tf.constant(X), tf.constant(Y)
    opt = tf.optimizers.Adam(0.01)
    variables = model.trainable_variables

    @tf.function(
        autograph=False
    )  # the model has no Python control flow on tensors; tracing is 3-4x faster
    def step(seed):
        with tf.GradientTape() as tape:
            loss = -model.elbo((Xt, Yt), 1, seed=seed)
        opt.apply_gradients(zip(tape.gradient(loss, variables), variables))

    before = model.elbo((X, Y), 32, seed=99).numpy()
    for t in range(200):
        step(tf.constant([t, 1], tf.int64))
    after = model.elbo((X, Y), 32, seed=99).numpy()
    assert np.isfinite(after) and after > before + 0.1 * abs(before), (before, after)


def test_build_bnn_defaults_are_the_papers_initial_values(rng):
    """``build_bnn``'s inducing-weight defaults are Ritter et al.'s App. J / reference-code values
    (docs/algorithms.md, "Inducing weights"):
    Z ~ N(0, 1/M), D = lambda = sd(U~) = 1e-3, caps lambda_max = sd_max = 1,
    whitened means N(0, 1), Ensemble-U members one shared N(0, 1) draw plus N(0, 0.1^2) each,
    relative jitter 1e-4, and sigma = prior sd / sqrt(d_in) with the bias in d_in."""
    M = 32
    X, Y = rng.normal(size=(10, 99)), rng.normal(size=(10, 1))  # d_in = 100 (bias included)
    ffg = build_bnn(
        X, Y, hidden=(200,), posterior="ffg_u", num_inducing=M, prior=NealPrior(sd=4.0), seed=0
    )
    post = ffg.posterior
    iw = post.inducing_weights[0]
    assert (iw.M_out, iw.M_in, iw.d_out, iw.d_in) == (M, M, 200, 100)
    for Z in (
        iw.z_rows.numpy(),
        iw.z_cols.numpy(),
    ):  # 6400 and 3200 entries: var 1/M within ~6 s.e.
        assert abs(Z.mean()) < 6 / np.sqrt(M * Z.size) and abs(Z.var() * M - 1) < 6 * np.sqrt(
            2 / Z.size
        )
    for layer_iw in post.inducing_weights:
        np.testing.assert_allclose(layer_iw.lam.numpy(), 1e-3, rtol=1e-12)
        np.testing.assert_allclose(layer_iw.d_rows.numpy(), 1e-3, rtol=1e-12)
        np.testing.assert_allclose(layer_iw.d_cols.numpy(), 1e-3, rtol=1e-12)
        assert layer_iw.jitter == 1e-4 and layer_iw.lam.transform.cap == 1.0
    assert post.lambda_max == post.sd_max == 1.0
    for mean, sd in zip(post.u_means, post.u_sds):
        np.testing.assert_allclose(sd.numpy(), 1e-3, rtol=1e-12)
        assert sd.transform.cap == 1.0
    m = post.u_means[0].numpy()
    assert abs(m.mean()) < 6 / np.sqrt(m.size) and abs(m.var() - 1) < 6 * np.sqrt(2 / m.size)
    p0 = ffg.layers[0].prior.fixed_precision(ffg.layers[0].fan_in)
    np.testing.assert_allclose(1 / np.sqrt(p0), 4.0 / np.sqrt(100), rtol=1e-12)

    ens = build_bnn(X, Y, hidden=(200,), posterior="ensemble_u", num_inducing=M, seed=0).posterior
    members = ens.u_members[0].numpy()  # [K, M, M]
    assert members.shape == (5, M, M)
    spread = members - members.mean(0)  # the per-member N(0, 0.1^2) draws about their mean
    np.testing.assert_allclose(spread.var() * 5 / 4, 0.01, rtol=6 * np.sqrt(2 / spread.size))
    shared = members.mean(0)
    assert abs(shared.var() - 1) < 6 * np.sqrt(2 / shared.size) + 0.01
    for layer_iw in ens.inducing_weights:
        np.testing.assert_allclose(layer_iw.lam.numpy(), 1e-3, rtol=1e-12)


def test_parameter_count_per_layer_sums_and_matches_shapes(rng):
    import deepgp_gi as dg

    X, Y = rng.normal(size=(30, 3)), rng.normal(size=(30, 1))
    for name in dg.families.BNN_FAMILIES:
        model = build_bnn(
            X, Y, hidden=(5, 4), posterior=name, num_inducing=6, prior="scale", seed=0
        )
        counts = dg.parameter_count(model, per_layer=True)
        assert (
            sum(v for k, v in counts.items() if k != "total")
            == counts["total"]
            == dg.parameter_count(model)
        )
        assert counts["total"] == dg.parameter_count(model.posterior)
        expected = sum(int(np.prod(v.shape)) for v in model.posterior.variables)
        expected += sum(
            int(np.prod(l.inducing_features.shape))
            for l in model.layers
            if l.inducing_features is not None
        )
        assert counts["total"] == expected, name
        # U_0 of the global families is shared; everything else (q(s) included) is per layer
        assert counts["shared"] == (
            6 * 3 if name in ("global", "factorised_global", "random_global") else 0
        ), name
        if name == "random_global":  # pseudo-data of the last layer only, plus q(s) (2 per layer)
            assert counts["layer_0"] == counts["layer_1"] == 2 and counts["layer_2"] == 2 + 6 + 6
    ffg_u = build_bnn(X, Y, hidden=(5, 4), posterior="ffg_u", num_inducing=3, seed=0)
    c = dg.parameter_count(ffg_u, per_layer=True)
    # layer 0: d_out 5, d_in 4 -> M_out = M_in = 3: Z_r 3x5, Z_c 3x4, D 3+3, lambda, mean and sd 3x3
    assert c["layer_0"] == 15 + 12 + 6 + 1 + 18 and c["shared"] == 0
    assert c["layer_2"] == 1 + 3 * 5 + 1 + 3 + 1 + 2 * 3  # d_out = 1 -> M_out = 1
    fac = build_bnn(X, Y, hidden=(5, 4), posterior="factorised", seed=0)
    assert dg.parameter_count(fac) == 2 * (4 * 5 + 6 * 4 + 5 * 1)


def test_ffg_u_m64_is_at_most_15_percent_of_ffg_w_on_1024_1024_1():
    import deepgp_gi as dg

    rng = np.random.default_rng(0)
    X, Y = rng.normal(size=(4, 1024)), rng.normal(size=(4, 1))
    ffg_w = build_bnn(X, Y, hidden=(1024,), posterior="factorised", seed=0)
    ffg_u = build_bnn(X, Y, hidden=(1024,), posterior="ffg_u", num_inducing=64, seed=0)
    n_w, n_u = dg.parameter_count(ffg_w), dg.parameter_count(ffg_u)
    assert n_w == 2 * (1025 * 1024 + 1025)
    assert n_u <= 0.15 * n_w, (n_u, n_w)
    table = dg.parameter_table({"FFG-W": ffg_w, "FFG-U M=64": ffg_u}, reference="FFG-W")
    assert f"{n_u:,}" in table and "100.0" in table
