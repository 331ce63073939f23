"""Numerical oracles for the fully-coupled and STAR posteriors (docs/algorithms.md, "Fully-coupled
and STAR posteriors"; O4-O8 as numbered in its "Test oracles")."""

import gpflow
import numpy as np
import pytest
import scipy.linalg
import tensorflow as tf
from gpflow.kullback_leiblers import gauss_kl

from deepgp_gi.layers import GPLayer
from deepgp_gi.models import DeepGP
from deepgp_gi.noise import FixedNoise
from deepgp_gi.posteriors.conditionals import inducing_cholesky
from deepgp_gi.posteriors.mean_field import MeanFieldPosterior
from deepgp_gi.posteriors.stripes_arrow import StripesArrowPosterior
from deepgp_gi.posteriors.structured import FullyCoupledPosterior
from deepgp_gi.posteriors.structured_linalg import (
    append_to_cholesky,
    draw_and_copy,
    gram_and_copy,
    half_squared_norm,
    project_rows_and_means,
    whiten_cross_covariance,
    with_diagonal,
)

ATOL = 1e-10


# --------------------------------------------------------------------------- helpers
def make_layers(widths, D=2, M=4, seed=0, white=1e-3):
    """Layers with SE-ARD (+White on inner layers) kernels, random linear means on inner layers."""
    rng = np.random.default_rng(seed)
    Ms = [M] * len(widths) if np.isscalar(M) else list(M)
    layers, d_in = [], D
    for i, w in enumerate(widths):
        last = i == len(widths) - 1
        kernel = gpflow.kernels.SquaredExponential(
            variance=rng.uniform(0.7, 1.3), lengthscales=rng.uniform(0.8, 1.6, size=d_in)
        )
        if not last:
            kernel = kernel + gpflow.kernels.White(white)
        mean = None
        if not last:
            mean = gpflow.mean_functions.Linear(
                A=0.5 * rng.normal(size=(d_in, w)), b=0.1 * rng.normal(size=w)
            )
        Z = rng.normal(size=(Ms[i], d_in))
        layers.append(GPLayer(kernel, w, d_in, mean_function=mean, inducing_inputs=Z))
        d_in = w
    return layers


def make_data(N=6, D=2, P=1, seed=1):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(N, D)), rng.normal(size=(N, P))


def fixed_noise(S, N, widths, seed=2):
    rng = np.random.default_rng(seed)
    return FixedNoise({f"f/{l}": rng.normal(size=(S, N, w)) for l, w in enumerate(widths)})


def random_tril(rng, n, scale=0.3):
    R = np.tril(scale * rng.normal(size=(n, n)), -1)
    return R + np.diag(scale * (0.5 + rng.uniform(size=n)) * rng.choice([-1.0, 1.0], size=n))


def model_for(layers, posterior, num_data=20):
    return DeepGP(
        layers, gpflow.likelihoods.Gaussian(variance=0.1), posterior=posterior, num_data=num_data
    )


def assert_props_close(p, q, atol=ATOL):
    assert len(p.samples) == len(q.samples)
    for a, b in zip(p.samples, q.samples):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0, atol=atol)
    np.testing.assert_allclose(p.mean.numpy(), q.mean.numpy(), rtol=0, atol=atol)
    np.testing.assert_allclose(p.var.numpy(), q.var.numpy(), rtol=0, atol=atol)
    np.testing.assert_allclose(p.kl.numpy(), q.kl.numpy(), rtol=1e-10, atol=atol)


def max_prop_error(p, q):
    errs = [np.max(np.abs(a.numpy() - b.numpy())) for a, b in zip(p.samples, q.samples)]
    errs += [
        np.max(np.abs(p.mean.numpy() - q.mean.numpy())),
        np.max(np.abs(p.var.numpy() - q.var.numpy())),
    ]
    return max(errs)


def block_prior(layers, whiten):
    """Dense block-diagonal prior covariance of f_M (None when whitened)."""
    if whiten:
        return None
    blocks = []
    for layer in layers:
        K = layer.K(layer.Z).numpy() + gpflow.config.default_jitter() * np.eye(layer.num_inducing)
        blocks += [K] * layer.output_dim
    return scipy.linalg.block_diag(*blocks)


def randomise_mean_field(mf, rng):
    for l, layer in enumerate(mf.layers):
        M, P = layer.num_inducing, layer.output_dim
        mf.q_mu[l].assign(0.5 * rng.normal(size=(M, P)))
        mf.q_sqrt[l].assign(np.stack([random_tril(rng, M) for _ in range(P)]))


def mean_field_to_fc(mf, fc):
    fc.q_mu.assign(np.concatenate([q.numpy().T.ravel() for q in mf.q_mu]))
    fc.q_sqrt.assign(scipy.linalg.block_diag(*[b for q in mf.q_sqrt for b in q.numpy()]))


# --------------------------------------------------------------------------- O4
@pytest.mark.parametrize("whiten", [False, True])
def test_o4_fully_coupled_block_diagonal_equals_mean_field(whiten):
    widths, S = (3, 3, 1), 3
    layers = make_layers(widths, M=5)
    X, Y = make_data(N=7)
    mf = MeanFieldPosterior(layers, whiten=whiten)
    randomise_mean_field(mf, np.random.default_rng(3))
    fc = FullyCoupledPosterior(layers, whiten=whiten, precondition_offdiagonal=False)
    mean_field_to_fc(mf, fc)
    noise = fixed_noise(S, len(X), widths)
    p_mf, p_fc = mf.propagate(X, S, noise), fc.propagate(X, S, noise)
    assert_props_close(p_mf, p_fc)
    e_mf = model_for(layers, mf).elbo_per_sample((X, Y), S, noise).numpy()
    e_fc = model_for(layers, fc).elbo_per_sample((X, Y), S, noise).numpy()
    np.testing.assert_allclose(e_fc, e_mf, rtol=0, atol=ATOL)
    print(
        f"O4 whiten={whiten}: max |FC - MF| = {max_prop_error(p_mf, p_fc):.2e}, "
        f"ELBO {np.max(np.abs(e_fc - e_mf)):.2e}"
    )


def test_star_without_stripes_and_arrow_equals_mean_field():
    widths, S = (3, 3, 3, 1), 2
    layers = make_layers(widths, M=4)
    X, Y = make_data(N=5)
    rng = np.random.default_rng(4)
    for whiten in (False, True):
        star = StripesArrowPosterior(layers, whiten=whiten, stripes=False, arrow=False)
        assert star.stripes is None and star.arrow is None
        star.q_mu.assign(0.5 * rng.normal(size=star.q_mu.shape))
        star.diag.assign(np.stack([random_tril(rng, 4) for _ in range(star.num_units)]))
        mf = MeanFieldPosterior(layers, whiten=whiten)
        mu, diag, tau = star.q_mu.numpy(), star.diag.numpy(), 3
        for l in range(len(widths)):
            units = range(tau * l, tau * l + widths[l])
            mf.q_mu[l].assign(mu[list(units)].T)
            mf.q_sqrt[l].assign(diag[list(units)])
        noise = fixed_noise(S, len(X), widths)
        assert_props_close(mf.propagate(X, S, noise), star.propagate(X, S, noise))
        e_mf = model_for(layers, mf).elbo((X, Y), S, noise).numpy()
        e_star = model_for(layers, star).elbo((X, Y), S, noise).numpy()
        np.testing.assert_allclose(e_star, e_mf, rtol=0, atol=ATOL)


# --------------------------------------------------------------------------- O5
def star_mask(L, tau, M, stripes, arrow):
    """The STAR pattern of R, from the rules of docs/algorithms.md, "STAR sparsity and storage"
    (1-based units (l, t))."""
    units = [(l, t) for l in range(1, L) for t in range(1, tau + 1)] + ["out"]
    T = len(units)
    mask = np.zeros((T * M, T * M))
    for i, u in enumerate(units):
        for j, v in enumerate(units):
            if i == j:
                keep = np.tril(np.ones((M, M)))
            elif u != "out" and v != "out" and stripes and u[1] == v[1] and v[0] < u[0]:
                keep = np.ones((M, M))
            elif u == "out" and v != "out" and arrow:
                keep = np.ones((M, M))
            else:
                continue
            mask[i * M : (i + 1) * M, j * M : (j + 1) * M] = keep
    return mask, units


def load_star_from_dense(star, R, mu, L, tau, M):
    """Fill the STAR blocks from a dense R using the storage indices (1-based) of
    docs/algorithms.md, "STAR sparsity and storage"."""

    def unit(l, t):
        return tau * (l - 1) + (t - 1)

    def blk(i, j):
        return R[i * M : (i + 1) * M, j * M : (j + 1) * M]

    if star.precondition_offdiagonal:  # stored B = sqrt(n) L_K^{-1} R_{i,j}, row unit's layer
        chols = [
            np.eye(M) if star.whiten else inducing_cholesky(layer, layer.Z).numpy()
            for layer in star.layers
        ]

        def count(l):  # blocks in the row
            return tau * (L - 1) if l == L - 1 else l

        def white(l, b):
            return np.sqrt(count(l)) * scipy.linalg.solve_triangular(chols[l], b, lower=True)
    else:

        def white(l, b):
            return b

    T = tau * (L - 1) + 1
    star.q_mu.assign(mu.reshape(T, M))
    star.diag.assign(np.stack([blk(i, i) for i in range(T)]))
    if star.stripes is not None:
        stripes = np.zeros(star.stripes.shape)
        for l in range(2, L):
            for lp in range(1, l):
                for t in range(1, tau + 1):
                    stripes[tau * ((l - 1) * (l - 2) // 2 + (lp - 1)) + (t - 1)] = white(
                        l - 1, blk(unit(l, t), unit(lp, t))
                    )
        star.stripes.assign(stripes)
    if star.arrow is not None:
        arrow = np.zeros(star.arrow.shape)
        for lp in range(1, L):
            for t in range(1, tau + 1):
                arrow[tau * (lp - 1) + (t - 1)] = white(L - 1, blk(T - 1, unit(lp, t)))
        star.arrow.assign(arrow)


@pytest.mark.parametrize(
    "stripes,arrow", [(True, True), (True, False), (False, True), (False, False)]
)
# make test: each storage (preconditioned, plain) and each of whitened / not whitened once, for all
# four (stripes, arrow) switches; make test-all: the other two combinations too
@pytest.mark.parametrize(
    "L,tau,whiten,precondition_offdiagonal",
    [
        (4, 2, False, True),
        pytest.param(4, 2, False, False, marks=pytest.mark.slow),
        pytest.param(3, 3, True, True, marks=pytest.mark.slow),
        (3, 3, True, False),
    ],
)
def test_o5_star_recursion_equals_dense_fully_coupled(
    L, tau, whiten, precondition_offdiagonal, stripes, arrow
):
    M, S = 3, 2
    widths = (tau,) * (L - 1) + (1,)
    layers = make_layers(widths, M=M, seed=L)
    X, _ = make_data(N=5)
    rng = np.random.default_rng(5)
    mask, _ = star_mask(L, tau, M, stripes, arrow)
    TM = mask.shape[0]
    R = mask * np.tril(0.4 * rng.normal(size=(TM, TM)))
    R[np.diag_indices(TM)] = 0.2 + 0.3 * rng.uniform(size=TM)
    mu = 0.5 * rng.normal(size=TM)
    star = StripesArrowPosterior(
        layers,
        whiten=whiten,
        stripes=stripes,
        arrow=arrow,
        precondition_offdiagonal=precondition_offdiagonal,
    )
    load_star_from_dense(star, R, mu, L, tau, M)
    np.testing.assert_allclose(star.dense_sqrt().numpy(), R, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(star.dense_mean().numpy(), mu)
    fc = FullyCoupledPosterior(layers, whiten=whiten, precondition_offdiagonal=False)
    fc.q_mu.assign(mu)
    fc.q_sqrt.assign(R)
    noise = fixed_noise(S, len(X), widths)
    p_star, p_fc = star.propagate(X, S, noise), fc.propagate(X, S, noise)
    assert_props_close(p_star, p_fc)
    print(f"O5 L={L} tau={tau} stripes={stripes} arrow={arrow}: {max_prop_error(p_star, p_fc):.2e}")


# --------------------------------------------------------------------------- O6
def numpy_kernel(layer):
    k = layer.kernel
    se, white = (
        (k.kernels[0], k.kernels[1].variance.numpy())
        if isinstance(k, gpflow.kernels.Sum)
        else (k, 0.0)
    )
    var, ls = se.variance.numpy(), se.lengthscales.numpy()

    def cross(A, B):
        d = (A[:, None, :] - B[None, :, :]) / ls
        return var * np.exp(-0.5 * np.sum(d**2, axis=-1))

    return cross, var + white, white


def numpy_mean(layer, x):
    mf = layer.mean_function
    if mf is None:
        return np.zeros(layer.output_dim)
    return x @ mf.A.numpy() + mf.b.numpy()


def brute_force_last_layer(layers, mu, R, X_n, inner_samples, whiten):
    """Condition q(f_M) on the sampled inner layers as linear-Gaussian observations (Kalman),
    then predict the last layer: O6 in docs/algorithms.md, "Test oracles". Explicit dense numpy
    algebra for one point."""
    jitter = gpflow.config.default_jitter()
    TM = R.shape[0]
    S_M = R @ R.T
    Hs, ys, noises = [], [], []
    x, off = X_n, 0
    for l, layer in enumerate(layers):
        cross, kxx, white = numpy_kernel(layer)
        Z = layer.Z.numpy()
        M, P = Z.shape[0], layer.output_dim
        Kuu = cross(Z, Z) + (white + jitter) * np.eye(M)
        kzx = cross(Z, x[None])[:, 0]
        Lk = np.linalg.cholesky(Kuu)
        if whiten:
            a = scipy.linalg.solve_triangular(Lk, kzx, lower=True)
            c = kxx - a @ a
        else:
            a = scipy.linalg.cho_solve((Lk, True), kzx)
            c = kxx - kzx @ a
        H = np.zeros((P, TM))
        for lam in range(P):
            H[lam, off + lam * M : off + (lam + 1) * M] = a
        off += P * M
        m = numpy_mean(layer, x)
        if l < len(layers) - 1:
            f = inner_samples[l]
            Hs.append(H)
            ys.append(f - m)
            noises.append(np.full(P, c + jitter))
            x = f
            continue
        Hh = np.vstack(Hs)
        Syy = Hh @ S_M @ Hh.T + np.diag(np.concatenate(noises))
        gain = np.linalg.solve(Syy, Hh @ S_M).T  # S_M H^T Syy^{-1}
        mu_post = mu + gain @ (np.concatenate(ys) - Hh @ mu)
        S_post = S_M - gain @ Hh @ S_M
        return m + H @ mu_post, np.diag(H @ S_post @ H.T) + c


@pytest.mark.parametrize("whiten", [False, True])
def test_o6_theorem1_equals_kalman_brute_force(whiten):
    widths, Ms, S = (3, 2, 2), (4, 3, 5), 2  # unequal inducing counts are supported by FC
    layers = make_layers(widths, M=Ms, seed=6)
    X, _ = make_data(N=4)
    fc = FullyCoupledPosterior(layers, whiten=whiten, precondition_offdiagonal=False)
    rng = np.random.default_rng(7)
    R = random_tril(rng, fc.num_latent, scale=0.4)
    mu = 0.5 * rng.normal(size=fc.num_latent)
    fc.q_mu.assign(mu)
    fc.q_sqrt.assign(R)
    prop = fc.propagate(X, S, fixed_noise(S, len(X), widths))
    err = 0.0
    for s in range(S):
        for n in range(len(X)):
            inner = [prop.samples[l][s, n].numpy() for l in range(len(widths) - 1)]
            m, v = brute_force_last_layer(layers, mu, R, X[n], inner, whiten)
            np.testing.assert_allclose(prop.mean[s, n].numpy(), m, rtol=0, atol=ATOL)
            np.testing.assert_allclose(prop.var[s, n].numpy(), v, rtol=0, atol=ATOL)
            err = max(
                err,
                np.max(np.abs(prop.mean[s, n].numpy() - m)),
                np.max(np.abs(prop.var[s, n].numpy() - v)),
            )
    print(f"O6 whiten={whiten}: max error {err:.2e}")


# --------------------------------------------------------------------------- O8
@pytest.mark.parametrize(
    "whiten,precondition_offdiagonal", [(False, True), (False, False), (True, True), (True, False)]
)
def test_o8_blockwise_kl_equals_gauss_kl(whiten, precondition_offdiagonal):
    rng = np.random.default_rng(8)
    layers = make_layers((2, 3, 1), M=(3, 4, 3), seed=9)
    fc = FullyCoupledPosterior(layers, whiten=whiten, precondition_offdiagonal=False)
    fc.q_mu.assign(0.5 * rng.normal(size=fc.num_latent))
    fc.q_sqrt.assign(random_tril(rng, fc.num_latent))
    K = block_prior(layers, whiten)
    ref = gauss_kl(fc.q_mu[:, None], fc.q_sqrt[None], K=K).numpy()
    np.testing.assert_allclose(fc.kl_divergence().numpy(), ref, rtol=1e-10)

    L, tau, M = 4, 2, 3
    star_layers = make_layers((tau,) * (L - 1) + (1,), M=M, seed=10)
    star = StripesArrowPosterior(
        star_layers, whiten=whiten, precondition_offdiagonal=precondition_offdiagonal
    )
    mask, _ = star_mask(L, tau, M, True, True)
    R = mask * random_tril(rng, mask.shape[0])
    load_star_from_dense(star, R, 0.5 * rng.normal(size=mask.shape[0]), L, tau, M)
    K = block_prior(star_layers, whiten)
    ref_star = gauss_kl(star.dense_mean()[:, None], star.dense_sqrt()[None], K=K).numpy()
    np.testing.assert_allclose(star.kl_divergence().numpy(), ref_star, rtol=1e-10)
    print(
        f"O8 whiten={whiten}: FC rel err {abs(fc.kl_divergence().numpy() / ref - 1):.1e}, "
        f"STAR rel err {abs(star.kl_divergence().numpy() / ref_star - 1):.1e}"
    )


def test_kl_is_zero_at_the_prior():
    layers = make_layers((2, 1), M=3)
    for whiten in (False, True):
        fc = FullyCoupledPosterior(
            layers, whiten=whiten, inner_scale=1.0, precondition_offdiagonal=False
        )
        star = StripesArrowPosterior(layers, whiten=whiten, inner_scale=1.0)
        np.testing.assert_allclose(fc.kl_divergence().numpy(), 0.0, atol=1e-10)
        np.testing.assert_allclose(star.kl_divergence().numpy(), 0.0, atol=1e-10)


# --------------------------------------------------------------------------- one layer = SVGP
@pytest.mark.parametrize("whiten", [False, True])
@pytest.mark.parametrize("P", [1, 2])
def test_one_layer_fully_coupled_equals_svgp(whiten, P):
    rng = np.random.default_rng(11)
    layers = make_layers((P,), M=5, seed=12)
    X, Y = make_data(N=8, P=P)
    fc = FullyCoupledPosterior(layers, whiten=whiten, precondition_offdiagonal=False)
    M = 5
    q_mu = 0.5 * rng.normal(size=(M, P))
    q_sqrt = np.stack([random_tril(rng, M) for _ in range(P)])
    fc.q_mu.assign(q_mu.T.ravel())
    fc.q_sqrt.assign(scipy.linalg.block_diag(*q_sqrt))
    lik = gpflow.likelihoods.Gaussian(variance=0.1)
    svgp = gpflow.models.SVGP(
        layers[0].kernel,
        lik,
        layers[0].inducing_variable,
        whiten=whiten,
        q_mu=q_mu,
        q_sqrt=q_sqrt,
        num_latent_gps=P,
    )
    model = DeepGP(layers, lik, posterior=fc)
    np.testing.assert_allclose(
        model.elbo((X, Y), 1, seed=0).numpy(), svgp.elbo((X, Y)).numpy(), rtol=1e-10
    )
    m, v = model.predict_f(X, 1, seed=0)
    m_ref, v_ref = svgp.predict_f(X)
    np.testing.assert_allclose(m.numpy(), m_ref.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(v.numpy(), v_ref.numpy(), rtol=1e-10, atol=1e-12)


def test_one_layer_fully_coupled_dense_equals_svgp():
    rng = np.random.default_rng(13)
    layers = make_layers((1,), M=6, seed=14)
    X, Y = make_data(N=8)
    for whiten in (False, True):
        fc = FullyCoupledPosterior(layers, whiten=whiten, precondition_offdiagonal=False)
        q_mu, q_sqrt = 0.5 * rng.normal(size=(6, 1)), random_tril(rng, 6)[None]
        fc.q_mu.assign(q_mu[:, 0])
        fc.q_sqrt.assign(q_sqrt[0])
        lik = gpflow.likelihoods.Gaussian(variance=0.1)
        svgp = gpflow.models.SVGP(
            layers[0].kernel,
            lik,
            layers[0].inducing_variable,
            whiten=whiten,
            q_mu=q_mu,
            q_sqrt=q_sqrt,
        )
        model = DeepGP(layers, lik, posterior=fc)
        np.testing.assert_allclose(
            model.elbo((X, Y), 1, seed=0).numpy(), svgp.elbo((X, Y)).numpy(), rtol=1e-10
        )


# --------------------------------------------------------------------------- initialisation
@pytest.mark.parametrize("whiten", [False, True])
def test_initialisation(whiten):
    layers = make_layers((2, 2, 1), M=3)
    fc = FullyCoupledPosterior(
        layers, whiten=whiten, inner_scale=1e-3, precondition_offdiagonal=False
    )
    star = StripesArrowPosterior(layers, whiten=whiten, inner_scale=1e-3)
    blocks = []
    for l, layer in enumerate(layers):
        chol = np.eye(3) if whiten else inducing_cholesky(layer, layer.Z).numpy()
        blocks += [(1.0 if l == 2 else 1e-3) * chol] * layer.output_dim
    expected = scipy.linalg.block_diag(*blocks)
    np.testing.assert_allclose(fc.q_sqrt.numpy(), expected, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(star.dense_sqrt().numpy(), expected, rtol=1e-12, atol=1e-15)
    assert np.all(fc.q_mu.numpy() == 0) and np.all(star.q_mu.numpy() == 0)
    assert np.all(star.stripes.numpy() == 0) and np.all(star.arrow.numpy() == 0)
    assert (
        star.diag.shape == (5, 3, 3)
        and star.stripes.shape == (2, 3, 3)
        and star.arrow.shape == (4, 3, 3)
    )
    X, _ = make_data(N=4)
    noise = fixed_noise(2, 4, (2, 2, 1))
    assert_props_close(fc.propagate(X, 2, noise), star.propagate(X, 2, noise))


# --------------------------------------------------------------------------- gradients
def _directional_check(model, data, noise, param, rng, num_dirs=2, h=1e-5):
    var = param.unconstrained_variable
    with tf.GradientTape() as tape:
        value = model.elbo(data, 2, noise)
    grad = tape.gradient(value, var).numpy()
    assert np.all(np.isfinite(grad))
    x0 = var.numpy().copy()
    for _ in range(num_dirs):
        d = rng.normal(size=x0.shape)
        var.assign(x0 + h * d)
        up = model.elbo(data, 2, noise).numpy()
        var.assign(x0 - h * d)
        down = model.elbo(data, 2, noise).numpy()
        var.assign(x0)
        fd = (up - down) / (2 * h)
        np.testing.assert_allclose(np.sum(grad * d), fd, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("whiten", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_star_gradients_match_finite_differences(whiten):
    L, tau, M = 3, 2, 3
    widths = (tau,) * (L - 1) + (1,)
    layers = make_layers(widths, M=M, seed=15)
    X, Y = make_data(N=4)
    rng = np.random.default_rng(16)
    mask, _ = star_mask(L, tau, M, True, True)
    R = mask * random_tril(rng, mask.shape[0], scale=0.5)
    star = StripesArrowPosterior(layers, whiten=whiten)
    load_star_from_dense(star, R, 0.5 * rng.normal(size=mask.shape[0]), L, tau, M)
    model = model_for(layers, star)
    noise = fixed_noise(2, len(X), widths)
    for param in (star.diag, star.stripes, star.arrow, star.q_mu):
        _directional_check(model, (X, Y), noise, param, rng)


def test_fully_coupled_gradients_match_finite_differences():
    widths = (2, 2, 1)
    layers = make_layers(widths, M=3, seed=21)
    X, Y = make_data(N=4)
    rng = np.random.default_rng(22)
    fc = FullyCoupledPosterior(layers, precondition_offdiagonal=False)
    fc.q_mu.assign(0.5 * rng.normal(size=fc.num_latent))
    fc.q_sqrt.assign(random_tril(rng, fc.num_latent))
    model = model_for(layers, fc)
    noise = fixed_noise(2, len(X), widths)
    for param in (fc.q_sqrt, fc.q_mu):
        _directional_check(model, (X, Y), noise, param, rng)


# --------------------------------------------------------------------------- float32, tf.function
def test_float32_end_to_end_finite():
    config = gpflow.config.Config(float=np.float32, jitter=1e-5)
    with gpflow.config.as_context(config):
        layers = make_layers((2, 2, 1), M=4, seed=17)
        X, Y = make_data(N=5)
        for post in (
            FullyCoupledPosterior(layers, precondition_offdiagonal=False),
            StripesArrowPosterior(layers, whiten=True),
        ):
            assert post.dtype == tf.float32
            model = model_for(layers, post)
            with tf.GradientTape() as tape:
                elbo = model.elbo((X, Y), 2, seed=3)
            grads = tape.gradient(elbo, model.trainable_variables)
            assert elbo.dtype == tf.float32 and np.isfinite(elbo.numpy())
            assert all(g is not None and np.all(np.isfinite(g.numpy())) for g in grads)


def test_compiled_propagation_matches_eager():
    """propagate has no Python branching on tensor values: it traces and gives the same result."""
    layers = make_layers((2, 2, 1), M=3, seed=18)
    X, _ = make_data(N=4)
    noise = fixed_noise(2, 4, (2, 2, 1))
    rng = np.random.default_rng(19)
    for post in (
        FullyCoupledPosterior(layers, precondition_offdiagonal=False),
        StripesArrowPosterior(layers),
    ):
        if isinstance(post, FullyCoupledPosterior):
            post.q_sqrt.assign(random_tril(rng, post.num_latent))
        else:
            post.arrow.assign(0.3 * rng.normal(size=post.arrow.shape))
        compiled = tf.function(lambda: post.propagate(X, 2, noise), autograph=False)
        assert_props_close(compiled(), post.propagate(X, 2, noise), atol=1e-12)


def test_incremental_cholesky_helpers():
    rng = np.random.default_rng(20)
    A = rng.normal(size=(5, 5))
    Sigma = A @ A.T + np.eye(5)
    L1 = np.linalg.cholesky(Sigma[:3, :3])
    G, _ = whiten_cross_covariance(L1, Sigma[3:, :3], np.zeros(3))
    L2 = np.linalg.cholesky(Sigma[3:, 3:] - G.numpy() @ G.numpy().T)
    np.testing.assert_allclose(
        append_to_cholesky(L1, G, L2).numpy(), np.linalg.cholesky(Sigma), atol=1e-12
    )


# --------------------------------------------------------------------------- bad shapes
def test_bad_shapes_raise():
    with pytest.raises(ValueError, match=r"layers.*equal hidden widths.*\(3, 2, 1\)"):
        StripesArrowPosterior(make_layers((3, 2, 1)))
    with pytest.raises(ValueError, match=r"layers.*one output GP.*output_dim 2"):
        StripesArrowPosterior(make_layers((2, 2)))
    with pytest.raises(ValueError, match=r"layers.*same number of inducing points"):
        StripesArrowPosterior(make_layers((2, 2, 1), M=(3, 4, 3)))
    no_inducing = make_layers((2, 1))
    no_inducing[1] = GPLayer(gpflow.kernels.SquaredExponential(), 1, 2)
    for cls in (FullyCoupledPosterior, StripesArrowPosterior):
        with pytest.raises(ValueError, match=r"layers\[1\].*inducing_inputs"):
            cls(no_inducing)
        with pytest.raises(ValueError, match="inner_scale"):
            cls(make_layers((2, 1)), inner_scale=0.0)
    with pytest.raises(TypeError, match="precondition_offdiagonal must be a bool"):
        StripesArrowPosterior(make_layers((2, 2, 1)), precondition_offdiagonal="no")


def test_star_switches_and_small_depths():
    two = make_layers((2, 1), M=3)
    star = StripesArrowPosterior(two)  # L = 2: no stripes exist
    assert star.stripes is None and star.arrow.shape == (2, 3, 3)
    one = make_layers((1,), M=3)
    star1 = StripesArrowPosterior(one)
    assert star1.stripes is None and star1.arrow is None and star1.diag.shape == (1, 3, 3)
    X, _ = make_data(N=3)
    prop = star1.propagate(X, 2, fixed_noise(2, 3, (1,)))
    assert prop.mean.shape == (2, 3, 1) and prop.kl.shape == (2,)
    three = make_layers((2, 2, 1), M=3)
    assert StripesArrowPosterior(three, stripes=False).stripes is None
    assert StripesArrowPosterior(three, arrow=False).arrow is None


# ------------------------------------------------------- fully-coupled, preconditioned storage
@pytest.mark.parametrize("whiten", [False, True])
def test_fully_coupled_preconditioned_storage_is_the_same_distribution(whiten):
    # store R's off-diagonal blocks as sqrt(n_i) L_K^{-1} R_{i,j} (numpy, by hand): dense_sqrt,
    # the propagation and the KL must be those of the plain storage of R
    widths, M, S = (2, 3, 1), 3, 2
    layers = make_layers(widths, M=M, seed=7)
    X, _ = make_data(N=5)
    rng = np.random.default_rng(8)
    TM = M * sum(widths)
    R, mu = random_tril(rng, TM), 0.5 * rng.normal(size=TM)
    plain = FullyCoupledPosterior(layers, whiten=whiten, precondition_offdiagonal=False)
    plain.q_mu.assign(mu)
    plain.q_sqrt.assign(R)
    P = R.copy()
    unit = 0
    for l, width in enumerate(widths):
        Lk = np.eye(M) if whiten else inducing_cholesky(layers[l], layers[l].Z).numpy()
        for _ in range(width):
            r = slice(unit * M, (unit + 1) * M)
            if unit > 0:
                P[r, : unit * M] = np.sqrt(unit) * scipy.linalg.solve_triangular(
                    Lk, R[r, : unit * M], lower=True
                )
            unit += 1
    assert not np.allclose(P, R)  # the two storages differ as parameters
    pre = FullyCoupledPosterior(layers, whiten=whiten, precondition_offdiagonal=True)
    pre.q_mu.assign(mu)
    pre.q_sqrt.assign(P)
    np.testing.assert_allclose(pre.dense_sqrt().numpy(), R, rtol=0, atol=1e-12)
    noise = fixed_noise(S, len(X), widths)
    assert_props_close(pre.propagate(X, S, noise), plain.propagate(X, S, noise))
    np.testing.assert_allclose(
        pre.kl_divergence().numpy(), plain.kl_divergence().numpy(), rtol=1e-12
    )
    with pytest.raises(ValueError, match="precondition_offdiagonal=False"):
        pre.natural_gradient_blocks()
    with pytest.raises(TypeError, match="precondition_offdiagonal"):
        FullyCoupledPosterior(layers, precondition_offdiagonal="yes")
    assert FullyCoupledPosterior(layers).precondition_offdiagonal  # the default storage


# ------------------------------------------------ STAR: Adam's step on the off-diagonal blocks
@pytest.mark.parametrize("whiten", [False, True])
def test_offdiagonal_step_changes_only_the_optimiser_variables(whiten):
    # the stored blocks B (and so R, the propagation and the KL) are the same for any step; the
    # unconstrained variable is B / step with a leading axis of length 1 (steps other than 1)
    L, tau, M, S = 3, 2, 3, 2
    layers = make_layers((tau,) * (L - 1) + (1,), M=M, seed=11)
    X, _ = make_data(N=5)
    rng = np.random.default_rng(12)
    mask, _ = star_mask(L, tau, M, True, True)
    TM = mask.shape[0]
    R = mask * np.tril(0.4 * rng.normal(size=(TM, TM)))
    R[np.diag_indices(TM)] = 0.2 + 0.3 * rng.uniform(size=TM)
    mu = 0.5 * rng.normal(size=TM)
    full = StripesArrowPosterior(layers, whiten=whiten, offdiagonal_step=1.0)
    default = StripesArrowPosterior(layers, whiten=whiten)
    assert default.offdiagonal_step == pytest.approx(1 / np.sqrt(M))
    assert StripesArrowPosterior(layers, precondition_offdiagonal=False).offdiagonal_step == 1.0
    for star in (full, default):
        load_star_from_dense(star, R, mu, L, tau, M)
        np.testing.assert_allclose(star.dense_sqrt().numpy(), R, rtol=0, atol=1e-12)
    for name in ("stripes", "arrow"):
        a, b = getattr(full, name), getattr(default, name)
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-12)
        assert a.unconstrained_variable.shape == a.shape
        assert b.unconstrained_variable.shape == [1] + list(b.shape)
        np.testing.assert_allclose(
            b.unconstrained_variable.numpy()[0] * default.offdiagonal_step, b.numpy(), rtol=1e-12
        )
    noise = fixed_noise(S, len(X), (tau,) * (L - 1) + (1,))
    assert_props_close(default.propagate(X, S, noise), full.propagate(X, S, noise))
    np.testing.assert_allclose(
        default.kl_divergence().numpy(), full.kl_divergence().numpy(), rtol=1e-12
    )
    with pytest.raises(ValueError, match="offdiagonal_step"):
        StripesArrowPosterior(layers, offdiagonal_step=0.0)


def test_a_checkpoint_with_full_offdiagonal_steps_fails_to_restore_into_the_default(tmp_path):
    # STAR checkpoints written before offdiagonal_step existed hold B itself as the variable: they
    # restore into offdiagonal_step=1.0 and raise a shape error with the default (never blocks of
    # the wrong size)
    layers = make_layers((2, 2, 1), M=3, seed=13)
    old = StripesArrowPosterior(layers, offdiagonal_step=1.0)
    old.arrow.assign(np.random.default_rng(14).normal(size=old.arrow.shape))
    path = tf.train.Checkpoint(posterior=old).save(str(tmp_path / "ckpt"))
    same = StripesArrowPosterior(layers, offdiagonal_step=1.0)
    tf.train.Checkpoint(posterior=same).restore(path).expect_partial()
    np.testing.assert_array_equal(same.arrow.numpy(), old.arrow.numpy())
    with pytest.raises(ValueError, match="incompatible tensor with shape"):
        tf.train.Checkpoint(posterior=StripesArrowPosterior(layers)).restore(path).expect_partial()


@pytest.mark.slow  # 100 Adam steps for each of two depth-3 models: `make test-all`
def test_star_first_adam_steps_keep_up_with_mean_field():
    # benchmarks/star_warmup.py's toy, seed 0, 100 steps of dg.fit's Adam: with full steps on the
    # preconditioned blocks (offdiagonal_step=1) STAR's ELBO was 3.0 nats per point below
    # mean-field's (-11.24 against -8.22); with the default 1/sqrt(M) it is 0.05 above (-8.17)
    import deepgp_gi as dg

    rng = np.random.default_rng(20261122)
    X = rng.normal(size=(100, 2))
    Y = np.sin(X[:, :1]) + 0.5 * X[:, 1:2] ** 2 + 0.05 * rng.normal(size=(100, 1))
    Y = (Y - Y.mean()) / Y.std()
    elbo = {}
    for posterior in ("mean_field", "stripes_arrow"):
        model = dg.build_deep_gp(X, Y, depth=3, posterior=posterior, num_inducing=16, seed=0)
        dg.fit(model, (X, Y), steps=100, learning_rate=0.01, num_samples=2, seed=0, progress=False)
        elbo[posterior] = float(model.elbo((X, Y), 64, tf.constant([20261122, 7], tf.int64))) / len(
            X
        )
    assert elbo["stripes_arrow"] > elbo["mean_field"] - 1.0, elbo


# ------------------------------------------------------- the ELBO of the batched STAR recursion
@pytest.mark.parametrize("L,whiten", [(3, False), (4, True)])
def test_star_elbo_equals_the_dense_fully_coupled_elbo(L, whiten):
    """STAR's propagation takes each block column's products for all positions at once and keeps
    them per column (StripesArrowPosterior.propagate); its ELBO on fixed noise equals the
    ELBO of the fully-coupled posterior holding the same dense R (Lindinger's Theorem 1 applied
    to the whole matrix, a separate implementation) to 1e-10, with every block non-zero, more
    positions than layers and more points than inducing inputs."""
    tau, M, S = 4, 6, 2
    widths = (tau,) * (L - 1) + (1,)
    layers = make_layers(widths, M=M, seed=10 + L)
    X, Y = make_data(N=30, seed=3)
    rng = np.random.default_rng(L)
    mask, _ = star_mask(L, tau, M, True, True)
    TM = mask.shape[0]
    R = mask * np.tril(0.3 * rng.normal(size=(TM, TM)))
    R[np.diag_indices(TM)] = 0.3 + 0.3 * rng.uniform(size=TM)
    mu = 0.5 * rng.normal(size=TM)
    star = StripesArrowPosterior(layers, whiten=whiten)
    load_star_from_dense(star, R, mu, L, tau, M)
    fc = FullyCoupledPosterior(layers, whiten=whiten, precondition_offdiagonal=False)
    fc.q_mu.assign(mu)
    fc.q_sqrt.assign(R)
    noise = fixed_noise(S, len(X), widths, seed=L)
    e_star = model_for(layers, star).elbo_per_sample((X, Y), S, noise).numpy()
    e_fc = model_for(layers, fc).elbo_per_sample((X, Y), S, noise).numpy()
    np.testing.assert_allclose(e_star, e_fc, rtol=0, atol=1e-10)
    assert np.ptp(e_star) > 1e-3  # the two samples differ: the noise reaches the ELBO


# --------------------------------------------------------------------------- helpers of the step
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_half_squared_norm_value_and_written_out_gradient(dtype):
    """The KL's ``sum_i |t_i|^2 / 2`` (one product over the concatenated tensors) and its
    written-out gradient ``g t_i`` against numpy, automatic differentiation of
    ``sum(square(t_i)) / 2`` and finite differences."""
    rng = np.random.default_rng(0)
    ts = [tf.constant(rng.normal(size=shape).astype(dtype)) for shape in [(3,), (2, 4), (2, 3, 3)]]
    expected = 0.5 * sum(np.sum(t.numpy().astype(np.float64) ** 2) for t in ts)
    rtol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(half_squared_norm(*ts).numpy(), expected, rtol=rtol)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(ts)
        ours = 3.0 * half_squared_norm(*ts)
        auto = 3.0 * 0.5 * tf.add_n([tf.reduce_sum(tf.square(t)) for t in ts])
    for g, h in zip(tape.gradient(ours, ts), tape.gradient(auto, ts)):
        np.testing.assert_allclose(g.numpy(), h.numpy(), rtol=rtol)
    if dtype == np.float64:
        theoretical, numerical = tf.test.compute_gradient(half_squared_norm, ts)
        for th, nu in zip(theoretical, numerical):
            np.testing.assert_allclose(th, nu, atol=1e-7)


def _grads_agree(ours, plain, inputs, rtol=1e-12):
    """Values and gradients of ``sum_i w_i * out_i`` (fixed random weights, every output used)
    of ``ours(*inputs)`` and ``plain(*inputs)``, which return the same tuple of tensors."""
    inputs = [tf.constant(x) for x in inputs]
    results = []
    for f in (ours, plain):
        with tf.GradientTape() as tape:
            tape.watch(inputs)
            outs = f(*inputs)
            loss = tf.add_n(
                [
                    tf.reduce_sum(tf.constant(np.random.default_rng(i).normal(size=o.shape)) * o)
                    for i, o in enumerate(outs)
                ]
            )
        grads = tape.gradient(loss, inputs)  # None (an input no output depends on) as zeros
        results.append(
            (
                [o.numpy() for o in outs],
                [np.zeros(x.shape) if g is None else g.numpy() for g, x in zip(grads, inputs)],
            )
        )
    for a, b in zip(results[0][0] + results[0][1], results[1][0] + results[1][1]):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=1e-13)


def test_gram_and_copy_gradient_equals_automatic():
    """(B B^T, B) with the written-out gradient (g + g^T) B + g_copy, against autodiff, with the
    copy used and unused, and against finite differences."""
    rng = np.random.default_rng(0)
    B = rng.normal(size=(2, 3, 4, 5))
    _grads_agree(gram_and_copy, lambda B: (tf.linalg.matmul(B, B, transpose_b=True), B), [B])
    _grads_agree(
        lambda B: gram_and_copy(B)[:1], lambda B: (tf.linalg.matmul(B, B, transpose_b=True),), [B]
    )
    theoretical, numerical = tf.test.compute_gradient(
        lambda B: gram_and_copy(B)[0], [tf.constant(B)]
    )
    np.testing.assert_allclose(theoretical[0], numerical[0], atol=1e-7)


def test_draw_and_copy_gradient_equals_automatic():
    rng = np.random.default_rng(1)
    chol, eps = np.tril(rng.normal(size=(2, 3, 4, 4))), rng.normal(size=(2, 3, 4))
    _grads_agree(draw_and_copy, lambda L, e: (tf.linalg.matvec(L, e), L), [chol, eps])
    _grads_agree(
        lambda L, e: draw_and_copy(L, e)[:1], lambda L, e: (tf.linalg.matvec(L, e),), [chol, eps]
    )


def test_project_rows_and_means_gradient_equals_automatic():
    rng = np.random.default_rng(2)
    A, rows, mu = rng.normal(size=(2, 5, 7)), rng.normal(size=(3, 5, 6)), rng.normal(size=(3, 5))

    def plain(A, r, m):
        return tf.einsum("smn,umj->snuj", A, r), tf.einsum("smn,um->snu", A, m)

    _grads_agree(project_rows_and_means, plain, [A, rows, mu])
    _grads_agree(lambda *x: project_rows_and_means(*x)[:1], lambda *x: plain(*x)[:1], [A, rows, mu])
    _grads_agree(lambda *x: project_rows_and_means(*x)[1:], lambda *x: plain(*x)[1:], [A, rows, mu])


def test_with_diagonal_equals_add_clamp_and_jitter():
    """cov + diag(c), diagonal clamped at zero, + jitter, as one diagonal addition."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(2, 3, 4, 4))
    cov = X @ np.swapaxes(X, -1, -2)
    c = rng.normal(size=(2, 3))  # some negative: the clamp acts
    expected = cov + c[..., None, None] * np.eye(4)
    d = np.diagonal(expected, axis1=-2, axis2=-1)
    expected = expected + (np.maximum(d, 0.0) - d)[..., None] * np.eye(4) + 1e-6 * np.eye(4)
    np.testing.assert_allclose(
        with_diagonal(tf.constant(cov), tf.constant(c), 1e-6).numpy(),
        expected,
        rtol=1e-13,
        atol=1e-13,
    )
