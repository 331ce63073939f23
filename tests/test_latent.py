"""Latent-variable deep GPs and the importance-weighted bound (deepgp_gi.latent).

Oracles: the K = 1 bound against a NumPy computation of the ELBO with the same draws; q(w) = p(w)
makes the log-ratios exactly 0; an irrelevant latent coordinate gives GPflow's SVGP ELBO for any
K; with the hidden layers' q(U) collapsed, K = 1 equals the family's own ELBO on [x, w] with the
same seed (every family); the K rows of a point have the family's joint covariance; the bound's
mean grows with K (Burda et al.).
"""

import gpflow
import numpy as np
import pytest
import scipy.stats
import tensorflow as tf

import deepgp_gi as dg
from deepgp_gi.latent import LATENT_FAMILIES, LatentDeepGP
from deepgp_gi.layers.latent import Encoder
from deepgp_gi.models import DeepGP
from deepgp_gi.noise import FixedNoise, SeededNoise


def pm_sine(rng, n):
    """y = +-sin(2x) + noise, the sign random per point."""
    X = rng.uniform(-2.0, 2.0, (n, 1))
    sign = rng.choice([-1.0, 1.0], (n, 1))
    return X, sign * np.sin(2.0 * X) + 0.05 * rng.standard_normal((n, 1))


class ConstantEncoder(tf.Module):
    """q(w | x, y) = N(mean, scale^2) for every point (mean 0, scale 1: the prior)."""

    def __init__(self, latent_dim, mean=0.0, scale=1.0):
        super().__init__()
        self.latent_dim, self.mean_value, self.scale_value = latent_dim, mean, scale

    def __call__(self, inputs):
        shape = tf.stack([tf.shape(inputs)[0], self.latent_dim])
        return (
            tf.fill(shape, tf.cast(self.mean_value, inputs.dtype)),
            tf.fill(shape, tf.cast(self.scale_value, inputs.dtype)),
        )


def randomise(model, rng, scale=0.5):
    """Random values for the encoder's weights (so that q(w | x, y) varies with the point)."""
    for W in model.latent.encoder.weights + model.latent.encoder.biases:
        W.assign(scale * rng.standard_normal(W.shape))


def random_lower(rng, n, diag=0.3):
    L = np.tril(0.2 * rng.standard_normal((n, n)), -1)
    return L + np.diag(diag + 0.2 * rng.uniform(size=n))


def encoder_numpy(encoder, XY):
    h = XY
    for i, (W, b) in enumerate(zip(encoder.weights, encoder.biases)):
        h = h @ W.numpy() + b.numpy()
        if i < len(encoder.weights) - 1:
            h = np.tanh(h)
    D = h.shape[1] // 2
    return h[:, :D], np.log1p(np.exp(h[:, D:] - 3.0)) + 1e-6


def svgp_moments(kernel, Z, q_mu, q_sqrt, Xnew, jitter):
    """Mean and variance of a non-whitened SVGP at Xnew (NumPy, GPflow's kernel)."""
    Kuu = kernel.K(Z).numpy() + jitter * np.eye(Z.shape[0])
    Kuf = kernel.K(Z, Xnew).numpy()
    a = np.linalg.solve(Kuu, Kuf)
    S = q_sqrt @ q_sqrt.T
    mean = a.T @ q_mu[:, 0]
    var = kernel.K_diag(Xnew).numpy() - np.sum(Kuf * a, 0) + np.sum(a * (S @ a), 0)
    return mean, var


def gauss_kl(q_mu, q_sqrt, Kuu):
    M = Kuu.shape[0]
    S = q_sqrt @ q_sqrt.T
    Kinv = np.linalg.inv(Kuu)
    return 0.5 * (
        np.trace(Kinv @ S)
        + q_mu[:, 0] @ Kinv @ q_mu[:, 0]
        - M
        + np.linalg.slogdet(Kuu)[1]
        - np.linalg.slogdet(S)[1]
    )


def test_k1_bound_equals_hand_computed_elbo(rng):
    """Depth 1, mean-field: sum_n (E[log p(y_n | f)] + log p(w_n) - log q(w_n)) - KL, in NumPy from
    the same draws of w, equals elbo_per_sample with K = 1, sample by sample."""
    X, Y = pm_sine(rng, 7)
    model = dg.build_deep_gp(
        X, Y, depth=1, posterior="mean_field", num_inducing=4, latent_dim=1, seed=0
    )
    randomise(model, rng)
    post = model.posterior
    post.q_mu[0].assign(rng.standard_normal((4, 1)))
    q_sqrt = random_lower(rng, 4)
    post.q_sqrt[0].assign(q_sqrt[None])
    model.likelihood.variance.assign(0.3)
    S = 3
    eps = rng.standard_normal((S, 7, 1, 1))
    noise = FixedNoise({"f/latent": eps}, fallback=SeededNoise(0))
    got = model.elbo_per_sample((X, Y), S, noise, importance_samples=1).numpy()

    mu, sigma = encoder_numpy(model.latent.encoder, np.concatenate([X, Y], 1))
    layer, jitter = model.layers[0], gpflow.config.default_jitter()
    Z = layer.Z.numpy()
    Kuu = layer.kernel.K(Z).numpy() + jitter * np.eye(4)
    kl = gauss_kl(post.q_mu[0].numpy(), q_sqrt, Kuu)
    s2 = 0.3
    for s in range(S):
        w = mu + sigma * eps[s, :, 0]
        mean, var = svgp_moments(
            layer.kernel, Z, post.q_mu[0].numpy(), q_sqrt, np.concatenate([X, w], 1), jitter
        )
        ell = -0.5 * np.log(2 * np.pi * s2) - 0.5 * ((Y[:, 0] - mean) ** 2 + var) / s2
        log_ratio = scipy.stats.norm.logpdf(w) - scipy.stats.norm.logpdf(w, mu, sigma)
        np.testing.assert_allclose(got[s], np.sum(ell) + np.sum(log_ratio) - kl, rtol=1e-9)


def test_q_equal_to_p_makes_log_ratios_vanish(rng):
    """With q(w | x, y) = p(w) the log-ratios are exactly 0 and the bound is
    sum_n (logsumexp_k E[log p(y_n | f(x_n, w_k))] - log K) - KL over prior draws w_k."""
    X, Y = pm_sine(rng, 6)
    model = dg.build_deep_gp(
        X,
        Y,
        depth=1,
        posterior="mean_field",
        num_inducing=4,
        latent_dim=2,
        encoder=ConstantEncoder(2),
        seed=0,
    )
    post = model.posterior
    post.q_mu[0].assign(rng.standard_normal((4, 1)))
    q_sqrt = random_lower(rng, 4)
    post.q_sqrt[0].assign(q_sqrt[None])
    S, K = 2, 5
    eps = rng.standard_normal((S, 6, K, 2))
    noise = FixedNoise({"f/latent": eps}, fallback=SeededNoise(0))
    g = model.grouped_propagate(tf.constant(X), S, K, noise, Y=tf.constant(Y))
    assert np.array_equal(g.log_ratio.numpy(), np.zeros((S, 6, K)))
    np.testing.assert_array_equal(g.latent.numpy(), eps)
    got = model.elbo_per_sample((X, Y), S, noise, importance_samples=K).numpy()

    layer, jitter = model.layers[0], gpflow.config.default_jitter()
    Z = layer.Z.numpy()
    kl = gauss_kl(post.q_mu[0].numpy(), q_sqrt, layer.kernel.K(Z).numpy() + jitter * np.eye(4))
    s2 = float(model.likelihood.variance.numpy())
    for s in range(S):
        ell = np.zeros((6, K))
        for k in range(K):
            mean, var = svgp_moments(
                layer.kernel,
                Z,
                post.q_mu[0].numpy(),
                q_sqrt,
                np.concatenate([X, eps[s, :, k]], 1),
                jitter,
            )
            ell[:, k] = -0.5 * np.log(2 * np.pi * s2) - 0.5 * ((Y[:, 0] - mean) ** 2 + var) / s2
        expected = np.sum(scipy.special.logsumexp(ell, axis=1) - np.log(K)) - kl
        np.testing.assert_allclose(got[s], expected, rtol=1e-9)


@pytest.mark.parametrize("K", [1, 7])
def test_irrelevant_latent_coordinate_gives_svgp_elbo(rng, K):
    """Depth 1 identity: with q(w) = p(w) and a latent lengthscale so long that f ignores w, every
    l_nk equals E[log p(y_n | f(x_n))], so the bound is GPflow's SVGP ELBO for any K."""
    X, Y = pm_sine(rng, 8)
    model = dg.build_deep_gp(
        X,
        Y,
        depth=1,
        posterior="mean_field",
        num_inducing=5,
        latent_dim=1,
        encoder=ConstantEncoder(1),
        seed=0,
    )
    kernel = model.layers[0].kernel
    kernel.lengthscales.assign([0.7, 1e10])
    post = model.posterior
    post.q_mu[0].assign(rng.standard_normal((5, 1)))
    q_sqrt = random_lower(rng, 5)
    post.q_sqrt[0].assign(q_sqrt[None])
    got = model.elbo((X, Y), 3, seed=4, importance_samples=K).numpy()

    svgp_kernel = gpflow.kernels.SquaredExponential(
        variance=kernel.variance.numpy(), lengthscales=0.7
    )
    Z = model.layers[0].Z.numpy()[:, :1]
    svgp = gpflow.models.SVGP(
        svgp_kernel,
        gpflow.likelihoods.Gaussian(variance=model.likelihood.variance.numpy()),
        Z,
        q_mu=post.q_mu[0].numpy(),
        q_sqrt=q_sqrt[None],
        whiten=False,
    )
    np.testing.assert_allclose(got, svgp.elbo((X, Y)).numpy(), rtol=1e-9)


def _collapse_hidden(model, rng, tiny=1e-100):
    """Give q(U) of the hidden layers (almost) no spread, so that a draw of U is its mean; the last
    layer keeps a random full covariance (integrated out by both paths)."""
    post = model.posterior
    L = model.depth
    if isinstance(post, dg.posteriors.MeanFieldPosterior):
        for l in range(L):
            M = post.q_mu[l].shape[0]
            post.q_mu[l].assign(0.5 * rng.standard_normal(post.q_mu[l].shape))
            R = random_lower(rng, M) if l == L - 1 else tiny * np.eye(M)
            post.q_sqrt[l].assign(np.tile(R[None], [post.q_sqrt[l].shape[0], 1, 1]))
    elif isinstance(post, dg.posteriors.FullyCoupledPosterior):
        TM = post.num_latent
        start = post.offsets[-2]
        R = tiny * np.eye(TM)
        R[start:, start:] = random_lower(rng, TM - start)
        post.q_mu.assign(0.5 * rng.standard_normal(TM))
        post.q_sqrt.assign(R)
    elif isinstance(post, dg.posteriors.StripesArrowPosterior):
        M = post.num_inducing
        diag = np.stack([tiny * np.eye(M)] * (post.num_units - 1) + [random_lower(rng, M)])
        post.diag.assign(diag)
        post.q_mu.assign(0.5 * rng.standard_normal(post.q_mu.shape))
    # global and local inducing draw U from the same noise as their own propagate: no change needed


@pytest.mark.parametrize(
    "family",
    [
        f
        if f in ("mean_field", "global", "fully_coupled")
        else pytest.param(f, marks=pytest.mark.slow)
        for f in LATENT_FAMILIES
    ],
)
def test_k1_bound_equals_family_elbo_on_latent_inputs(rng, family):
    """K = 1 with the hidden layers' draws of U at their mean: the grouped propagation gives the
    family's own ELBO of the plain model on the inputs [x, w] (same seed, same w), plus the sampled
    log p(w) - log q(w). Global and local inducing draw U exactly as their propagate does."""
    X, Y = pm_sine(rng, 9)
    options = {
        "fully_coupled": {"precondition_offdiagonal": False},
        "local": {"kl": "sampled"},
    }.get(family, {})
    model = dg.build_deep_gp(
        X, Y, depth=2, posterior=family, num_inducing=5, latent_dim=1, seed=0, **options
    )
    randomise(model, rng)
    _collapse_hidden(model, rng)
    S, seed = 2, [3, 4]
    g = model.grouped_propagate(tf.constant(X), S, 1, seed, Y=tf.constant(Y))
    ell, kl = model.elbo_terms((X, Y), S, seed)
    w = g.latent.numpy()[:, :, 0]
    # the plain model on [x, w] sees one w per sample: evaluate each sample on its own w
    plain = DeepGP(model.layers, model.likelihood, model.posterior, num_data=9)
    for s in range(S):
        noise = _SampleSlice(SeededNoise(seed), s)
        ell_p, kl_p = plain.elbo_terms((np.concatenate([X, w[s]], 1), Y), 1, noise)
        np.testing.assert_allclose(
            ell[s].numpy() - np.sum(g.log_ratio.numpy()[s]), ell_p.numpy()[0], rtol=1e-9
        )
        np.testing.assert_allclose(kl[s].numpy(), kl_p.numpy()[0], rtol=1e-9)


class _SampleSlice(dg.noise.NoiseSource):
    """Sample ``s`` of an S-sample source's draws (names "f/..", "u/..": leading axis S)."""

    def __init__(self, source, s, S=2):
        self.source, self.s, self.S = source, s, S

    def normal(self, name, shape, dtype):
        full = tf.concat([[self.S], tf.convert_to_tensor(shape, tf.int32)[1:]], 0)
        if name.startswith("f/") and name != "f/latent":  # the grouped draws are [S, N, K, P]
            return tf.reshape(
                self.source.normal(name, tf.concat([full[:2], [1], full[2:]], 0), dtype)[self.s],
                shape,
            )
        return self.source.normal(name, full, dtype)[self.s : self.s + 1]


def test_hidden_rows_of_a_point_have_the_joint_covariance_of_q(rng):
    """The K rows of a point in a hidden layer are one function's values: over many draws their
    covariance is the mean-field q's, k(a, b) - k_aU K^-1 k_Ub + k_aU K^-1 S K^-1 k_Ub."""
    X, Y = pm_sine(rng, 8)
    model = dg.build_deep_gp(
        X, Y, depth=2, posterior="mean_field", num_inducing=6, latent_dim=1, seed=0
    )
    post, layer = model.posterior, model.layers[0]
    assert layer.output_dim == 2  # D + D_w wide; unit 0 is checked
    post.q_mu[0].assign(rng.standard_normal((6, 2)))
    q_sqrt = random_lower(rng, 6, diag=0.5)
    post.q_sqrt[0].assign(np.stack([q_sqrt, random_lower(rng, 6)]))
    K, S = 4, 20000
    w = np.array([-1.5, -0.3, 0.4, 1.2])
    noise = FixedNoise(
        {"f/latent": np.broadcast_to(w[None, None, :, None], (S, 1, K, 1))}, fallback=SeededNoise(1)
    )
    x = X[:1]
    F = (
        model.grouped_propagate(tf.constant(x), S, K, noise).samples[0].numpy()[:, 0, :, 0]
    )  # [S, K]

    inputs = np.concatenate([np.repeat(x, K, 0), w[:, None]], 1)
    jitter = gpflow.config.default_jitter()
    Z = layer.Z.numpy()
    Kuu = layer.kernel.K(Z).numpy() + jitter * np.eye(6)
    Kuf = layer.kernel.K(Z, inputs).numpy()
    a = np.linalg.solve(Kuu, Kuf)
    cov = layer.kernel.K(inputs).numpy() - Kuf.T @ a + a.T @ (q_sqrt @ q_sqrt.T) @ a
    mean = layer.mean(inputs).numpy()[:, 0] + a.T @ post.q_mu[0].numpy()[:, 0]
    se = np.sqrt((np.outer(np.diag(cov), np.diag(cov)) + cov**2) / S)
    assert np.all(np.abs(np.cov(F.T) - cov) < 5 * se + 1e-6), (np.cov(F.T), cov)
    assert np.all(np.abs(F.mean(0) - mean) < 5 * np.sqrt(np.diag(cov) / S) + 1e-6)
    assert (
        np.min(np.abs(cov - np.diag(np.diag(cov)))[np.triu_indices(K, 1)]) > 0.05
    )  # rows really coupled


def test_bound_mean_does_not_decrease_with_k(rng):
    """Burda et al.: E[L_K] grows with K. The encoder is the prior and f depends strongly on the
    sign of w, so one draw of w explains half the points badly; K = 1, 5, 20, 160 draws each."""
    X, Y = pm_sine(rng, 20)
    model = dg.build_deep_gp(
        X,
        Y,
        depth=1,
        posterior="mean_field",
        num_inducing=12,
        latent_dim=1,
        encoder=ConstantEncoder(1),
        seed=0,
    )
    layer = model.layers[0]
    Z = layer.Z.numpy()
    model.posterior.q_mu[0].assign((np.sin(2 * Z[:, 0]) * np.tanh(3 * Z[:, 1]))[:, None])
    model.likelihood.variance.assign(0.05)
    means, ses = [], []
    for K in (1, 5, 20):  # 160 independent draws of (U, w), one seed per K
        values = model.elbo_per_sample((X, Y), 160, [K, 0], importance_samples=K).numpy()
        means.append(np.mean(values))
        ses.append(np.std(values, ddof=1) / np.sqrt(len(values)))
    assert means[0] + 3 * (ses[0] + ses[1]) < means[1], (means, ses)
    assert means[1] + 3 * (ses[1] + ses[2]) < means[2], (means, ses)


def test_predictions_draw_w_from_the_prior_and_mix(rng):
    """sample_layers gives [w, F_1, .., F_L] with w the prior draws of the seed; the predictive
    density is the log-mean-exp over samples of the Gaussian densities of predict_f_components."""
    X, Y = pm_sine(rng, 10)
    model = dg.build_deep_gp(
        X, Y, depth=2, posterior="global", num_inducing=6, latent_dim=2, seed=0
    )
    layers = model.sample_layers(X, 7, seed=5)
    assert [t.shape.as_list() for t in layers] == [[7, 10, 2], [7, 10, 3], [7, 10, 1]]
    w = SeededNoise(5).normal("f/latent", [7, 10, 1, 2], tf.float64).numpy()[:, :, 0]
    np.testing.assert_array_equal(layers[0].numpy(), w)
    mean, var = (t.numpy() for t in model.predict_f_components(X, 7, seed=5))
    s2 = float(model.likelihood.variance.numpy())
    logp = scipy.stats.norm.logpdf(Y[None, :, 0], mean[..., 0], np.sqrt(var[..., 0] + s2))
    expected = scipy.special.logsumexp(logp, axis=0) - np.log(7)
    np.testing.assert_allclose(
        model.predict_log_density((X, Y), 7, seed=5).numpy(), expected, rtol=1e-10
    )
    ymean, _ = model.predict_y(X, 7, seed=5)
    np.testing.assert_allclose(ymean.numpy()[:, 0], mean[..., 0].mean(0), rtol=1e-10)


@pytest.mark.slow  # four fits, each traced (about 20 s); make test keeps the fast oracles
def test_fit_is_seeded_and_resumes_exactly(rng, tmp_path):
    X, Y = pm_sine(rng, 24)

    def build():
        return dg.build_deep_gp(
            X, Y, depth=1, posterior="mean_field", num_inducing=6, latent_dim=1, seed=0
        )

    options = dict(
        steps=12, batch_size=12, seed=3, importance_samples=3, progress=False, log_every=3
    )
    straight = build()
    h1 = dg.fit(straight, (X, Y), **options)
    again = build()
    assert dg.fit(again, (X, Y), **options).elbo == h1.elbo
    dg.fit(build(), (X, Y), **dict(options, steps=6), checkpoint_dir=tmp_path, checkpoint_every=3)
    fresh = build()
    h2 = dg.fit(fresh, (X, Y), **options, checkpoint_dir=tmp_path, checkpoint_every=3)
    assert h2.resumed_from == 6
    for a, b in zip(straight.trainable_variables, fresh.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(h2.elbo[-1], h1.elbo[-1], rtol=1e-12)
    assert any(
        v is w
        for v in straight.trainable_variables
        for w in straight.latent.encoder.trainable_variables
    )


@pytest.mark.slow  # XLA compiles the step (about 20 s)
def test_xla_step_equals_plain_step(rng):
    X, Y = pm_sine(rng, 16)
    runs = []
    for jit in (False, True):
        model = dg.build_deep_gp(
            X, Y, depth=2, posterior="global", num_inducing=5, latent_dim=1, seed=0
        )
        runs.append(
            dg.fit(
                model,
                (X, Y),
                steps=4,
                seed=2,
                importance_samples=4,
                progress=False,
                log_every=1,
                jit_compile=jit,
            ).elbo
        )
    np.testing.assert_allclose(runs[1], runs[0], rtol=1e-8)


@pytest.mark.slow  # a traced float32 step (about 6 s)
def test_float32_model_trains(rng):
    X, Y = pm_sine(rng, 12)
    with gpflow.config.as_context(gpflow.config.Config(float=np.float32, jitter=1e-4)):
        model = dg.build_deep_gp(
            X, Y, depth=2, posterior="mean_field", num_inducing=4, latent_dim=1, seed=0
        )
        assert model.dtype == tf.float32 and model.latent.encoder.weights[0].dtype == tf.float32
        h = dg.fit(
            model,
            (X.astype(np.float32), Y.astype(np.float32)),
            steps=3,
            seed=0,
            importance_samples=2,
            progress=False,
            log_every=1,
        )
    assert np.all(np.isfinite(h.elbo))


def test_bad_input_is_refused_with_the_argument_named(rng):
    X, Y = pm_sine(rng, 10)
    with pytest.raises(ValueError, match="latent_dim must be at least 1"):
        dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=4, latent_dim=0)
    with pytest.raises(ValueError, match="encoder must return a pair .* \\[N, 2\\]"):
        dg.build_deep_gp(
            X,
            Y,
            depth=1,
            posterior="mean_field",
            num_inducing=4,
            latent_dim=2,
            encoder=ConstantEncoder(3),
        )
    with pytest.raises(ValueError, match="give latent_dim too"):
        dg.build_deep_gp(
            X, Y, depth=1, posterior="mean_field", num_inducing=4, encoder=ConstantEncoder(1)
        )
    with pytest.raises(ValueError, match="'sghmc'.*no closed form"):
        dg.build_deep_gp(X, Y, depth=1, posterior="sghmc", num_inducing=4, latent_dim=1)
    model = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=4, latent_dim=1)
    assert (
        isinstance(model, LatentDeepGP) and model.input_dim == 1 and model.layers[0].input_dim == 2
    )
    with pytest.raises(ValueError, match="importance_samples must be at least 1"):
        model.elbo((X, Y), importance_samples=0)
    with pytest.raises(ValueError, match="importance_samples must be at least 1"):
        dg.fit(model, (X, Y), steps=1, importance_samples=0, progress=False)
    plain = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=4)
    with pytest.raises(ValueError, match="importance_samples=2 needs a latent-variable model"):
        dg.fit(plain, (X, Y), steps=1, importance_samples=2, progress=False)
    with pytest.raises(ValueError, match="X has 2 columns|2 columns"):
        model.elbo((np.concatenate([X, X], 1), Y))


def test_default_encoder_contract():
    enc = Encoder(3, 2, seed=0)
    mean, scale = enc(tf.zeros([5, 3], tf.float64))
    assert mean.shape == (5, 2) and scale.shape == (5, 2)
    np.testing.assert_allclose(
        scale.numpy(), np.log1p(np.exp(-3.0)) + 1e-6
    )  # zero input, zero biases
    assert [W.shape for W in enc.weights] == [(3, 20), (20, 20), (20, 4)]


@pytest.mark.slow  # two fits of 2,000 steps on 300 points (a few minutes)
def test_latent_model_beats_plain_on_pm_sine(rng):
    """The issue's oracle: on y = +-sin(2x) (300 training points) the latent deep GP's test
    log-likelihood exceeds the plain deep GP's by more than 0.3 nats per point."""
    X, Y = pm_sine(rng, 300)
    Xt, Yt = pm_sine(rng, 500)
    plain = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=30, seed=0)
    dg.fit(plain, (X, Y), steps=2000, seed=0, progress=False, learning_rate=0.01)
    latent = dg.build_deep_gp(
        X, Y, depth=2, posterior="mean_field", num_inducing=30, latent_dim=1, seed=0
    )
    dg.fit(
        latent, (X, Y), steps=2000, seed=0, progress=False, learning_rate=0.01, importance_samples=5
    )
    lp_plain = float(np.mean(plain.predict_log_density((Xt, Yt), 200, seed=1)))
    lp_latent = float(np.mean(latent.predict_log_density((Xt, Yt), 200, seed=1)))
    assert lp_latent > lp_plain + 0.3, (lp_latent, lp_plain)


def test_benchmark_configurations_keep_latent_models_apart():
    """latent_dim and importance_samples are configuration keys: normalised, refused where they do
    not apply, and a report row of a latent model is not merged with the plain one."""
    from benchmarks import uci
    from deepgp_gi.uci_protocol import config_key, normalise_config

    plain = normalise_config({"dataset": "kin8nm", "posterior": "mean_field"})
    latent = normalise_config(
        {"dataset": "kin8nm", "posterior": "mean_field", "latent_dim": 1, "importance_samples": 5}
    )
    assert (plain["latent_dim"], plain["importance_samples"]) == (None, None)
    assert (latent["latent_dim"], latent["importance_samples"]) == (1, 5)
    assert normalise_config({"dataset": "kin8nm", "latent_dim": 2})["importance_samples"] == 1
    assert config_key(plain) != config_key(latent)
    old_line = {k: v for k, v in plain.items() if k not in ("latent_dim", "importance_samples")}
    assert config_key(old_line) == config_key(
        plain
    )  # lines written before the keys are plain models
    with pytest.raises(ValueError, match="needs a latent-variable deep GP"):
        normalise_config({"dataset": "kin8nm", "importance_samples": 5})
    with pytest.raises(ValueError, match="latent_dim applies to deep GPs"):
        normalise_config({"dataset": "kin8nm", "model": "bnn", "latent_dim": 1})
    rows = [dict(cfg, split=0, elbo_per_datapoint=0.0) for cfg in (plain, latent)]
    assert len(uci.select_runs(rows)) == 2
    assert [uci._method(r) for r in rows] == ["mean_field", "mean_field (latent 1, K=5)"]
