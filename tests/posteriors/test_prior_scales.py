"""q(s) of random-scale priors (O13 for the Gamma log-ratio) and q(L) of the spatial
inverse-Wishart prior (O10); oracles as numbered in docs/algorithms.md, "Test oracles"."""

import gpflow
import numpy as np
import pytest
import scipy.special
import scipy.stats
import tensorflow as tf
import tensorflow_probability as tfp

from deepgp_gi.bnn import BNN_POSTERIORS, build_bnn
from deepgp_gi.layers import DenseLayer
from deepgp_gi.noise import FixedNoise, NoiseSource, SeededNoise, _implicit_gamma
from deepgp_gi.posteriors import ScalePosterior, SpatialIWPosterior
from deepgp_gi.posteriors.prior_scales import SpatialIWSample, kron_identity
from deepgp_gi.priors import PRIORS, ScalePrior, SpatialIWPrior, make_prior
from deepgp_gi.wishart import inverse_wishart_log_prob

tfd = tfp.distributions


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


# ============================================================ spatial inverse-Wishart prior


def _wishart_kl(V1, n1, V2, n2):
    """KL(W(V1, n1) || W(V2, n2)) in closed form (NumPy/SciPy)."""
    m = V1.shape[0]
    ld1, ld2 = np.linalg.slogdet(V1)[1], np.linalg.slogdet(V2)[1]
    return (
        n2 / 2 * (ld2 - ld1)
        + n1 / 2 * (np.trace(np.linalg.solve(V2, V1)) - m)
        + scipy.special.multigammaln(n2 / 2, m)
        - scipy.special.multigammaln(n1 / 2, m)
        + (n1 - n2) / 2 * np.sum(scipy.special.digamma(n1 / 2 - np.arange(m) / 2))
    )


def _iw_kl(Psi1, n1, Psi2, n2):
    """KL(IW(Psi1, n1) || IW(Psi2, n2)) = KL(W(Psi1^{-1}, n1) || W(Psi2^{-1}, n2)) (inversion is a
    bijection)."""
    return _wishart_kl(np.linalg.inv(Psi1), n1, np.linalg.inv(Psi2), n2)


def _q_params(q):
    """nu0 I + Psi and nu0 + nu from q's parameters, by hand."""
    y, w, p = q.pseudo_observations.numpy(), np.exp(q.log_weights.numpy()), q.dim
    return (p + 1) * np.eye(p) + (y.T * w) @ y / p, p + 1 + w.sum()


def _spatial_q(p, omega, seed=0):
    q = SpatialIWPosterior(p, seed=seed)
    q.log_weights.assign(np.broadcast_to(omega, [p]))
    return q


def test_spatial_iw_prior_basics():
    prior = make_prior("spatial_iw")
    assert isinstance(prior, SpatialIWPrior) and PRIORS["spatial_iw"] is SpatialIWPrior
    assert prior.is_random and prior.is_spatial
    assert prior.dof(9) == 10.0 and prior.dof(1) == 2.0
    np.testing.assert_allclose(prior.scale_tril(3, tf.float64).numpy(), np.sqrt(4.0) * np.eye(3))
    assert prior.weight_variance(7) == 1.0 / 7
    assert DenseLayer(3, 2, prior="spatial_iw").kernel.weight_variance == 1.0 / 4
    L = np.stack([np.eye(2) * 2.0, [[1.0, 0.3], [0.3, 0.5]]])
    expected = scipy.stats.invwishart(df=3, scale=3 * np.eye(2)).logpdf(L.transpose(1, 2, 0))
    np.testing.assert_allclose(prior.log_prob(L).numpy(), expected, atol=1e-12)
    # p = 1: IW(2, 2) is InvGamma(1, 1).
    x = np.array([0.3, 1.0, 4.0])
    np.testing.assert_allclose(
        prior.log_prob(x[:, None, None]).numpy(),
        scipy.stats.invgamma(1.0, scale=1.0).logpdf(x),
        atol=1e-12,
    )


def test_spatial_iw_prior_weight_variance_is_the_mean_of_the_inverse():
    """E_p[L^{-1}] = I (so E[P^{-1}] = I/D): Monte Carlo over prior draws (q = p when w = 0)."""
    p, S = 3, 100_000
    q = _spatial_q(p, -1e3)
    L, _ = q.sample(SpatialIWPrior(), S, SeededNoise(5), "L/0", tf.float64)
    # TensorFlow's batched inverse: NumPy's calls LAPACK once per 3 x 3 matrix (minutes when the
    # cores are busy)
    Linv = tf.linalg.inv(L).numpy()
    mean, se = Linv.mean(0), Linv.std(0) / np.sqrt(S)
    assert np.all(np.abs(mean - np.eye(p)) < 5 * se), (mean, se)


def test_conv_precision_is_offset_major_kronecker_with_a_plain_bias():
    prior = SpatialIWPrior()
    rng = np.random.default_rng(1)
    B = rng.normal(size=(2, 4, 4))
    L = B @ B.transpose(0, 2, 1) + np.eye(4)
    C = 3
    D = 4 * C + 1
    P = prior.conv_precision(tf.constant(L), C).numpy()
    assert P.shape == (2, D, D)
    for s in range(2):
        np.testing.assert_allclose(P[s, :-1, :-1], D * np.kron(L[s], np.eye(C)))
        np.testing.assert_array_equal(P[s, -1, :-1], 0)
        assert P[s, -1, -1] == D
    np.testing.assert_allclose(
        prior.conv_precision(tf.constant(L), C, bias=False).numpy(),
        (D - 1) * kron_identity(L, C).numpy(),
    )
    np.testing.assert_allclose(
        prior.dense_precision(5, tf.constant([[[2.0]], [[0.5]]])).numpy(), [10.0, 2.5]
    )


def test_spatial_iw_posterior_parameters_and_initialisation():
    q = SpatialIWPosterior(4, seed=3)
    assert q.pseudo_observations.shape == (4, 4) and q.log_weights.shape == (4,)
    np.testing.assert_array_equal(q.log_weights.numpy(), -5.0)
    again = SpatialIWPosterior(4, seed=3)
    np.testing.assert_array_equal(q.pseudo_observations.numpy(), again.pseudo_observations.numpy())
    q.log_weights.assign([0.1, -0.2, 0.3, 1.0])
    scale, C, nu = q.parameters_for(SpatialIWPrior(), tf.float64)
    scale_hand, nu_hand = _q_params(q)
    np.testing.assert_allclose(scale.numpy(), scale_hand, rtol=1e-13)
    np.testing.assert_allclose(C.numpy(), np.linalg.cholesky(scale_hand), rtol=1e-13)
    np.testing.assert_allclose(nu.numpy(), nu_hand, rtol=1e-14)


@pytest.mark.parametrize("p", [1, 3])
def test_spatial_iw_log_densities_without_inversion_match_direct_ones(p):
    prior = SpatialIWPrior()
    q = _spatial_q(p, np.linspace(-0.5, 0.8, p), seed=2)
    draw = q.sample_full(prior, 6, SeededNoise(7), "L/0", tf.float64)
    assert isinstance(draw, SpatialIWSample)
    scale_hand, nu_hand = _q_params(q)
    L = draw.L.numpy()
    np.testing.assert_allclose(L, np.swapaxes(L, 1, 2), atol=0)
    np.testing.assert_allclose(
        draw.factor.numpy() @ np.swapaxes(draw.factor.numpy(), 1, 2), L, rtol=1e-12
    )
    A = draw.bartlett.numpy()
    C = np.linalg.cholesky(scale_hand)
    np.testing.assert_allclose(L, C @ np.linalg.inv(A @ np.swapaxes(A, 1, 2)) @ C.T, rtol=1e-10)
    np.testing.assert_allclose(draw.log_det.numpy(), np.linalg.slogdet(L)[1], atol=1e-12)
    # log q: the tr(G) formula = the direct inverse-Wishart density = SciPy's.
    direct_q = inverse_wishart_log_prob(L, np.linalg.cholesky(scale_hand), nu_hand).numpy()
    np.testing.assert_allclose(draw.log_posterior.numpy(), direct_q, atol=1e-10)
    scipy_q = (
        scipy.stats.invwishart(df=nu_hand, scale=scale_hand).logpdf(L.transpose(1, 2, 0))
        if p > 1
        else scipy.stats.invgamma(nu_hand / 2, scale=scale_hand[0, 0] / 2).logpdf(L[:, 0, 0])
    )
    np.testing.assert_allclose(draw.log_posterior.numpy(), scipy_q, atol=1e-10)
    scipy_p = (
        scipy.stats.invwishart(df=p + 1, scale=(p + 1) * np.eye(p)).logpdf(L.transpose(1, 2, 0))
        if p > 1
        else scipy.stats.invgamma(1.0, scale=1.0).logpdf(L[:, 0, 0])
    )
    np.testing.assert_allclose(draw.log_prior.numpy(), scipy_p, atol=1e-10)
    L2, log_ratio = q.sample(prior, 6, SeededNoise(7), "L/0", tf.float64)
    np.testing.assert_array_equal(L2.numpy(), L)
    np.testing.assert_allclose(log_ratio.numpy(), scipy_p - scipy_q, atol=1e-10)


@pytest.mark.parametrize("p", [1, 2, 4])
def test_spatial_iw_log_ratio_is_zero_at_the_prior(p):
    """omega -> -inf: w = 0, q = p, and log p(L) - log q(L) = 0 for every sample."""
    q = _spatial_q(p, -1e3, seed=4)
    L, log_ratio = q.sample(SpatialIWPrior(), 50, SeededNoise(1), "L/0", tf.float64)
    np.testing.assert_allclose(log_ratio.numpy(), 0.0, rtol=0, atol=1e-12)
    assert np.all(np.isfinite(L.numpy()))


def test_O10_inverse_wishart_sampler_mean():
    """L ~ IW(Psi_q, nu_q) by Bartlett with real dof: the sample mean is Psi_q / (nu_q - p - 1)."""
    p, S = 3, 200_000
    q = _spatial_q(p, [1.2, 0.4, 1.7], seed=6)  # nu_q = 4 + 3.3 + 1.5 + 5.5 (non-integer, > p + 3)
    scale_hand, nu_hand = _q_params(q)
    assert nu_hand > p + 3 and nu_hand % 1 != 0
    L, _ = q.sample(SpatialIWPrior(), S, SeededNoise(8), "L/0", tf.float64)
    L = L.numpy()
    expected = scale_hand / (nu_hand - p - 1)
    mean, se = L.mean(0), L.std(0) / np.sqrt(S)
    assert np.all(np.abs(mean - expected) < 5 * se), (mean, expected, se)
    np.testing.assert_allclose(mean, expected, rtol=0.02)


@pytest.mark.parametrize("p", [1, 3])
def test_spatial_iw_log_ratio_is_minus_kl(p):
    """The MC mean of log p(L) - log q(L) = -KL(q || p), in closed form (and from TFP for p = 1,
    where L^{-1} is Gamma)."""
    S = 200_000
    q = _spatial_q(p, np.linspace(-0.3, 0.9, p), seed=9)
    prior = SpatialIWPrior()
    _, log_ratio = q.sample(prior, S, SeededNoise(10), "L/0", tf.float64)
    scale_hand, nu_hand = _q_params(q)
    expected = -_iw_kl(scale_hand, nu_hand, (p + 1) * np.eye(p), p + 1)
    if p == 1:
        tfp_kl = tfd.kl_divergence(
            tfd.Gamma(np.float64(nu_hand / 2), scale_hand[0, 0] / 2),
            tfd.Gamma(np.float64(1.0), 1.0),
        )
        np.testing.assert_allclose(expected, -tfp_kl.numpy(), rtol=1e-12)
    mean, se = np.mean(log_ratio), np.std(log_ratio) / np.sqrt(S)
    assert abs(mean - expected) < 4 * se, (mean, expected, se)


class _QuantileNoise(NoiseSource):
    """Gamma draws by the inverse CDF at fixed uniforms, with the implicit gradient, so a finite
    difference in the shape moves a draw exactly along its reparameterisation path."""

    def __init__(self, uniforms, normals):
        self.uniforms, self.normals = uniforms, normals

    def gamma(self, name, shape, alpha, dtype):
        alpha = tf.broadcast_to(tf.convert_to_tensor(alpha, dtype), shape)
        u = self.uniforms[name]
        g = tf.numpy_function(
            lambda a: scipy.stats.gamma.ppf(u, a).astype(a.dtype), [tf.stop_gradient(alpha)], dtype
        )
        return _implicit_gamma(alpha, tf.reshape(g, shape))

    def normal(self, name, shape, dtype):
        return tf.constant(self.normals[name], dtype)


def test_spatial_iw_gradients_match_finite_differences():
    p, S = 3, 4
    rng = np.random.default_rng(12)
    noise = _QuantileNoise(
        {"L/0/chi": rng.uniform(0.05, 0.95, size=(S, p))},
        {"L/0/normal": rng.normal(size=(S, p * (p - 1) // 2))},
    )
    R = rng.normal(size=(p, p))
    q = _spatial_q(p, [0.3, -0.4, 0.8], seed=13)
    prior = SpatialIWPrior()

    def objective():
        L, log_ratio = q.sample(prior, S, noise, "L/0", tf.float64)
        return tf.reduce_mean(log_ratio) + tf.reduce_sum(tf.reduce_mean(L, 0) * R)

    with tf.GradientTape() as tape:
        f = objective()
    grads = tape.gradient(
        f, [q.pseudo_observations.unconstrained_variable, q.log_weights.unconstrained_variable]
    )
    eps = 1e-6
    for var, grad in zip([q.pseudo_observations, q.log_weights], grads):
        base = var.numpy().copy()
        fd = np.zeros_like(base)
        for idx in np.ndindex(base.shape):
            for sign in (1, -1):
                shifted = base.copy()
                shifted[idx] += sign * eps
                var.assign(shifted)
                fd[idx] += sign * objective().numpy() / (2 * eps)
        var.assign(base)
        np.testing.assert_allclose(grad.numpy(), fd, rtol=1e-5, atol=1e-7)
        assert np.all(np.abs(fd) > 0)


def _elbo_pieces(model, S, g):
    """Hand-computed per-sample KL of a factorised BNN under SpatialIWPrior with Gamma
    draws g[l]."""
    kl_spatial = np.zeros(S)
    kl_neal = np.zeros(S)
    post = model.posterior
    for layer, weights, q, g_l in zip(model.layers, post.weights, post.scale_posteriors, g):
        D = layer.fan_in
        mean, var = (t.numpy() for t in weights.moments())
        psi_q, nu_q = _q_params(q)
        L = psi_q[0, 0] / (2 * g_l[:, 0])  # C^2 / A^2 with A_11^2 = 2 g
        P = D * L
        kl_w = 0.5 * np.sum(
            P[:, None, None] * (var + mean**2) - 1 - np.log(P[:, None, None] * var), axis=(1, 2)
        )
        log_p = scipy.stats.invgamma(1.0, scale=1.0).logpdf(L)  # IW(2, 2) = InvGamma(1, 1)
        log_q = scipy.stats.invgamma(nu_q / 2, scale=psi_q[0, 0] / 2).logpdf(L)
        kl_spatial += kl_w - (log_p - log_q)
        kl_neal += 0.5 * np.sum(D * (var + mean**2) - 1 - np.log(D * var))
    return kl_spatial, kl_neal


def test_factorised_bnn_with_spatial_iw_prior_elbo_by_hand():
    """p = 1 on DenseLayers: precision D L with L ~ q(L) = InvGamma(nu_q/2, psi_q/2); the ELBO is
    the NealPrior model's expected log-likelihood minus the hand-computed KL, sample by sample."""
    rng = np.random.default_rng(3)
    X, Y = rng.normal(size=(15, 2)), rng.normal(size=(15, 1))
    S = 5
    spatial = build_bnn(X, Y, hidden=(4,), posterior="factorised", prior="spatial_iw", seed=0)
    neal = build_bnn(X, Y, hidden=(4,), posterior="factorised", prior="neal", seed=0)
    for l, q in enumerate(spatial.posterior.scale_posteriors):
        assert isinstance(q, SpatialIWPosterior) and q.dim == 1
        q.log_weights.assign([0.7 - l])
        q.pseudo_observations.assign([[1.3 + l]])
    for a, b in zip(spatial.posterior.weights, neal.posterior.weights):
        np.testing.assert_array_equal(a.mean_scaled.numpy(), b.mean_scaled.numpy())
    g = [rng.gamma(2.0, size=(S, 1)) for _ in spatial.layers]
    fixed = FixedNoise({f"L/{l}/chi": g[l] for l in range(len(g))}, fallback=SeededNoise(21))
    elbo_spatial = spatial.elbo_per_sample((X, Y), S, seed=fixed).numpy()
    elbo_neal = neal.elbo_per_sample((X, Y), S, seed=SeededNoise(21)).numpy()
    kl_spatial, kl_neal = _elbo_pieces(spatial, S, g)
    np.testing.assert_allclose(
        elbo_spatial, elbo_neal + kl_neal - kl_spatial, rtol=1e-11, atol=1e-9
    )
    # The precision itself.
    p, _ = spatial.posterior.prior_precision(1, S, fixed, tf.float64)
    psi_q, _ = _q_params(spatial.posterior.scale_posteriors[1])
    np.testing.assert_allclose(
        p.numpy(), spatial.layers[1].fan_in * psi_q[0, 0] / (2 * g[1][:, 0]), rtol=1e-13
    )


@pytest.mark.parametrize("posterior", BNN_POSTERIORS)
def test_every_weight_space_family_trains_with_the_spatial_iw_prior(posterior):
    rng = np.random.default_rng(4)
    X, Y = rng.normal(size=(20, 2)), rng.normal(size=(20, 1))
    model = build_bnn(
        X, Y, hidden=(5,), posterior=posterior, prior="spatial_iw", num_inducing=6, seed=1
    )
    qs = [q for q in model.posterior.scale_posteriors if q is not None]
    assert len(qs) == 2 and all(isinstance(q, SpatialIWPosterior) for q in qs)
    opt = tf.optimizers.Adam(0.05)
    variables = model.trainable_variables
    before = [q.log_weights.numpy().copy() for q in qs]
    for step in range(3):
        with tf.GradientTape() as tape:
            loss = -model.elbo((X, Y), 2, seed=step)
        grads = tape.gradient(loss, variables)
        assert np.isfinite(loss.numpy()) and all(np.all(np.isfinite(g.numpy())) for g in grads)
        opt.apply_gradients(zip(grads, variables))
    assert all(np.any(q.log_weights.numpy() != b) for q, b in zip(qs, before))


def test_spatial_iw_float32():
    with gpflow.config.as_context(gpflow.config.Config(float=np.float32, jitter=1e-4)):
        q = _spatial_q(9, 0.5, seed=1)
        assert q.log_weights.dtype == tf.float32
        with tf.GradientTape() as tape:
            L, log_ratio = q.sample(SpatialIWPrior(), 8, SeededNoise(2), "L/0", tf.float32)
            loss = tf.reduce_sum(log_ratio)
        grads = tape.gradient(loss, q.trainable_variables)
        assert L.dtype == tf.float32 and log_ratio.dtype == tf.float32
        assert np.all(np.isfinite(log_ratio.numpy())) and all(
            np.all(np.isfinite(g.numpy())) for g in grads
        )
        scale, nu = _q_params(q)
        L64 = L.numpy().astype(np.float64).transpose(1, 2, 0)
        expected = scipy.stats.invwishart(df=10, scale=10 * np.eye(9)).logpdf(
            L64
        ) - scipy.stats.invwishart(df=nu, scale=scale).logpdf(L64)
        np.testing.assert_allclose(log_ratio.numpy(), expected, rtol=1e-3, atol=2e-2)
        X = np.random.default_rng(0).normal(size=(12, 2)).astype(np.float32)
        Y = X[:, :1] ** 2
        model = build_bnn(
            X, Y, hidden=(4,), posterior="global", prior="spatial_iw", num_inducing=5, seed=0
        )
        elbo = model.elbo((X, Y), 3, seed=0)
        assert elbo.dtype == tf.float32 and np.isfinite(elbo.numpy())


def test_spatial_iw_bad_input():
    with pytest.raises(ValueError, match="dim must be at least 1"):
        SpatialIWPosterior(0)
    with pytest.raises(TypeError, match="dim must be an integer"):
        SpatialIWPosterior(2.0)
    with pytest.raises(ValueError, match="dim must be at least 1"):
        SpatialIWPrior().dof(0)
    with pytest.raises(ValueError, match=r"pseudo_observations must have shape \[2, 2\]"):
        SpatialIWPosterior(2, pseudo_observations=np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"log_weights_init must have shape \[2\]"):
        SpatialIWPosterior(2, log_weights_init=[0.0, 1.0, 2.0])
    with pytest.raises(TypeError, match="needs a SpatialIWPrior"):
        SpatialIWPosterior(1).sample(ScalePrior(), 2, SeededNoise(0), "L/0", tf.float64)
    with pytest.raises(ValueError, match="1 x 1"):
        SpatialIWPrior().dense_precision(3, tf.eye(2, batch_shape=[1], dtype=tf.float64))
    with pytest.raises(ValueError, match="greater than dim - 1"):
        inverse_wishart_log_prob(np.eye(2)[None], np.eye(2), 0.5)


@pytest.mark.slow  # compiles the draw with XLA: `make test-all`
def test_spatial_iw_sample_is_the_same_under_xla():
    q = _spatial_q(4, 0.3, seed=0)

    def draw(seed):
        return q.sample(SpatialIWPrior(), 5, SeededNoise(seed), "L/0", tf.float64)

    seed = tf.constant([1, 0], tf.int64)
    L, log_ratio = draw(seed)
    L_xla, log_ratio_xla = tf.function(draw, jit_compile=True)(seed)
    np.testing.assert_allclose(L_xla.numpy(), L.numpy(), rtol=1e-10)
    np.testing.assert_allclose(log_ratio_xla.numpy(), log_ratio.numpy(), rtol=0, atol=1e-10)
