"""Wishart / inverse-Wishart densities and Bartlett draws for real degrees of freedom (O10 in
docs/algorithms.md, "Test oracles")."""

import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
import tensorflow_probability as tfp

from deepgp_gi.noise import RandomNoise, SeededNoise
from deepgp_gi.wishart import (
    bartlett_factor,
    bartlett_inverse_wishart_log_prob,
    bartlett_log_jacobian,
    bartlett_log_prob,
    inverse_wishart_log_prob,
    kron_identity,
    log_multivariate_gamma,
    wishart_log_prob,
)

tfd = tfp.distributions


def _spd(rng, m, shift=1.0):
    B = rng.normal(size=(m, m))
    return B @ B.T + shift * np.eye(m)


def _tr(A):
    return np.swapaxes(A, -1, -2)


def test_log_multivariate_gamma_matches_scipy():
    for a, m in [(1.3, 1), (1.7, 3), (4.25, 4)]:
        np.testing.assert_allclose(
            log_multivariate_gamma(a, m).numpy(),
            scipy.special.multigammaln(a, m),
            rtol=0,
            atol=1e-12,
        )


@pytest.mark.parametrize("dof", [2.4, 3.0, 3.7, 5.0, 11.0])
def test_O10_wishart_log_prob_matches_scipy_and_tfp(rng, dof):
    m = 3
    V = _spd(rng, m)
    C = np.linalg.cholesky(V)
    X = scipy.stats.wishart(df=max(dof, 3.0), scale=V).rvs(6, random_state=rng.integers(1e9))
    ours = wishart_log_prob(X, C, dof).numpy()
    # scipy accepts any real dof > m - 1.
    np.testing.assert_allclose(
        ours, scipy.stats.wishart(df=dof, scale=V).logpdf(_tr(X).T), rtol=0, atol=1e-10
    )
    if dof >= m:  # TFP refuses dof < m (docs/algorithms.md, "Paper versus reference code", item 9)
        tfp_value = (
            tfd.WishartTriL(tf.constant(dof, tf.float64), tf.constant(C)).log_prob(X).numpy()
        )
        np.testing.assert_allclose(ours, tfp_value, rtol=0, atol=1e-10)
    # X_tril given = computed
    np.testing.assert_allclose(
        wishart_log_prob(X, C, dof, X_tril=np.linalg.cholesky(X)).numpy(), ours, atol=1e-12
    )


def test_wishart_log_prob_batches_dof_and_scale(rng):
    m, S = 2, 4
    X = np.stack([_spd(rng, m) for _ in range(S)])
    Vs = np.stack([_spd(rng, m) for _ in range(S)])
    dofs = np.array([1.2, 2.0, 3.5, 7.0])
    ours = wishart_log_prob(X, np.linalg.cholesky(Vs), tf.constant(dofs)).numpy()
    expected = [scipy.stats.wishart(df=d, scale=V).logpdf(x) for x, V, d in zip(X, Vs, dofs)]
    np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("dof", [2.3, 4.0, 6.6])
def test_O10_inverse_wishart_log_prob_matches_scipy_and_the_inversion_identity(rng, dof):
    m = 3
    Psi = _spd(rng, m)
    X = np.stack([_spd(rng, m, 0.5) for _ in range(5)])
    ours = inverse_wishart_log_prob(X, np.linalg.cholesky(Psi), dof).numpy()
    np.testing.assert_allclose(
        ours, scipy.stats.invwishart(df=dof, scale=Psi).logpdf(_tr(X).T), rtol=0, atol=1e-10
    )
    # log IW(X; Psi, nu) = log W(X^{-1}; Psi^{-1}, nu) - (m + 1) log|X|
    Xinv = np.linalg.inv(X)
    via_wishart = wishart_log_prob(Xinv, np.linalg.cholesky(np.linalg.inv(Psi)), dof).numpy()
    np.testing.assert_allclose(
        ours, via_wishart - (m + 1) * np.linalg.slogdet(X)[1], rtol=0, atol=1e-10
    )


@pytest.mark.parametrize("dof", [2.2, 2.9, 4.5])
def test_O10_bartlett_density_minus_jacobian_is_the_wishart_density(dof):
    m, S = 3, 7
    A = bartlett_factor(dof, m, S, SeededNoise(4), "A", tf.float64)
    a = A.numpy()
    assert np.all(np.triu(a, 1) == 0) and np.all(np.diagonal(a, axis1=1, axis2=2) > 0)
    # Bartlett density by hand: A_jj^2 ~ chi2(nu - j + 1), A_jk ~ N(0, 1).
    diag = np.diagonal(a, axis1=1, axis2=2)
    k = dof - np.arange(m)
    by_hand = np.sum(scipy.stats.chi2(k).logpdf(diag**2) + np.log(2 * diag), axis=1)
    rows, cols = np.tril_indices(m, -1)
    by_hand = by_hand + np.sum(scipy.stats.norm.logpdf(a[:, rows, cols]), axis=1)
    log_density = bartlett_log_prob(A, dof).numpy()
    np.testing.assert_allclose(log_density, by_hand, rtol=0, atol=1e-10)
    jac = np.log(2.0**m * np.prod(diag ** np.arange(m, 0, -1), axis=1))
    np.testing.assert_allclose(bartlett_log_jacobian(A).numpy(), jac, rtol=0, atol=1e-12)
    G = a @ _tr(a)
    # chol(A A^T) = A exactly; small dof gives nearly singular G (A_mm^2 ~ chi2(nu - m + 1) can
    # be ~1e-13), where a recomputed Cholesky factor would lose digits.
    wishart = wishart_log_prob(G, np.eye(m), dof, X_tril=a).numpy()
    np.testing.assert_allclose(log_density - jac, wishart, rtol=0, atol=1e-10)
    conditioned = diag.min(axis=1) > 1e-3
    assert conditioned.sum() >= 4
    np.testing.assert_allclose(
        wishart[conditioned],
        scipy.stats.wishart(df=dof, scale=np.eye(m)).logpdf(_tr(G[conditioned]).T),
        atol=1e-10,
    )


def test_bartlett_factor_noise_names_and_layout():
    """``{name}/chi`` are Gamma((nu - j + 1)/2, 1) draws g with A_jj = sqrt(2 g); ``{name}/normal``
    fills the strictly lower triangle row by row."""
    from deepgp_gi.noise import FixedNoise

    m, S = 3, 2
    g = np.array([[1.0, 2.0, 0.5], [3.0, 0.25, 4.0]])
    z = np.arange(1.0, 7.0).reshape(S, 3)
    A = bartlett_factor(
        3.5, m, S, FixedNoise({"L/2/chi": g, "L/2/normal": z}), "L/2", tf.float64
    ).numpy()
    expected = np.zeros((S, m, m))
    for s in range(S):
        expected[s] = np.diag(np.sqrt(2 * g[s]))
        expected[s, 1, 0], expected[s, 2, 0], expected[s, 2, 1] = z[s]
    np.testing.assert_array_equal(A, expected)
    # m = 1 draws no normals.
    A1 = bartlett_factor(1.5, 1, S, FixedNoise({"s/chi": g[:, :1]}), "s", tf.float64).numpy()
    np.testing.assert_allclose(A1[:, 0, 0], np.sqrt(2 * g[:, 0]))


@pytest.mark.slow  # many Bartlett draws (about 12 s on two cores)
def test_O10_bartlett_sampler_moments_for_non_integer_dof(rng):
    """Monte Carlo: for real nu in (m - 1, m) -- where TFP refuses -- C A A^T C^T has the
    Wishart mean nu V and variances nu (V_ij^2 + V_ii V_jj)."""
    m, S, dof = 3, 200_000, 2.6
    V = _spd(rng, m)
    C = np.linalg.cholesky(V)
    A = bartlett_factor(dof, m, S, SeededNoise(2024), "W", tf.float64).numpy()
    CA = C @ A
    X = CA @ _tr(CA)
    mean = X.mean(0)
    se_mean = X.std(0) / np.sqrt(S)
    assert np.all(np.abs(mean - dof * V) < 5 * se_mean), (mean, dof * V, se_mean)
    np.testing.assert_allclose(mean, dof * V, rtol=0.02)
    centred_sq = (X - dof * V) ** 2
    var = centred_sq.mean(0)
    se_var = centred_sq.std(0) / np.sqrt(S)
    expected_var = dof * (V**2 + np.outer(np.diag(V), np.diag(V)))
    assert np.all(np.abs(var - expected_var) < 5 * se_var), (var, expected_var, se_var)


def test_bartlett_factor_with_random_noise_and_tensor_dof():
    """RandomNoise broadcasts a tensor of Gamma shapes (tf.random.gamma alone would not); a
    per-sample dof [S] gives per-sample shapes."""
    S, m = 40_000, 2
    dof = tf.constant(np.where(np.arange(S) % 2 == 0, 1.5, 6.0))
    A = bartlett_factor(dof, m, S, RandomNoise(), "W", tf.float64).numpy()
    assert A.shape == (S, m, m)
    c = np.diagonal(A, axis1=1, axis2=2) ** 2  # chi-squared with nu - j + 1 degrees of freedom
    for parity, nu in [(0, 1.5), (1, 6.0)]:
        sub = c[parity::2]
        expected = nu - np.arange(m)
        assert np.all(np.abs(sub.mean(0) - expected) < 5 * np.sqrt(2 * expected / sub.shape[0]))


def test_bartlett_dof_gradient_is_the_implicit_reparameterisation():
    """d E[tr(A A^T)] / d nu = d (m nu) / d nu = m, through the Gamma draws' implicit gradients."""
    m = 3
    dof = tf.Variable(3.3, dtype=tf.float64)
    with tf.GradientTape() as tape:
        A = bartlett_factor(dof, m, 100_000, SeededNoise(9), "W", tf.float64)
        mean_trace = tf.reduce_mean(tf.reduce_sum(tf.square(A), axis=[-2, -1]))
    assert abs(float(tape.gradient(mean_trace, dof)) - m) < 0.05


def test_bartlett_inverse_wishart_log_prob_without_inversion(rng):
    """log IW at X = C (A A^T)^{-1} C^T from the factors = the direct density of X."""
    m, S = 3, 5
    C = np.linalg.cholesky(_spd(rng, m))
    B = np.linalg.cholesky(_spd(rng, m))
    A = bartlett_factor(4.2, m, S, SeededNoise(1), "W", tf.float64).numpy()
    X = C @ np.linalg.inv(A @ _tr(A)) @ C.T
    for dof in (2.5, 7.0):
        np.testing.assert_allclose(
            bartlett_inverse_wishart_log_prob(A, C, dof).numpy(),
            scipy.stats.invwishart(df=dof, scale=C @ C.T).logpdf(_tr(X).T),
            atol=1e-10,
        )
        np.testing.assert_allclose(
            bartlett_inverse_wishart_log_prob(A, C, dof, scale_tril=B).numpy(),
            inverse_wishart_log_prob(X, B, dof).numpy(),
            atol=1e-10,
        )


def test_float32_densities_and_draws():
    m = 3
    A = bartlett_factor(2.7, m, 10, SeededNoise(3), "W", tf.float32)
    assert A.dtype == tf.float32
    G = tf.linalg.matmul(A, A, transpose_b=True)
    ours = wishart_log_prob(G, tf.eye(m), 2.7)
    assert ours.dtype == tf.float32
    np.testing.assert_allclose(
        ours.numpy(),
        scipy.stats.wishart(df=2.7, scale=np.eye(m)).logpdf(_tr(G.numpy().astype(np.float64)).T),
        rtol=1e-4,
        atol=1e-3,
    )
    iw = inverse_wishart_log_prob(G, tf.eye(m), 4.5)
    assert iw.dtype == tf.float32 and np.all(np.isfinite(iw.numpy()))
    assert bartlett_log_prob(A, 2.7).dtype == tf.float32


def test_kron_identity_is_offset_major():
    rng = np.random.default_rng(0)
    L = rng.normal(size=(2, 3, 3))
    out = kron_identity(L, 4).numpy()
    assert out.shape == (2, 12, 12)
    for s in range(2):
        np.testing.assert_array_equal(out[s], np.kron(L[s], np.eye(4)))
    # feature (offset a, channel c) = a * C + c
    assert out[0, 1 * 4 + 2, 2 * 4 + 2] == L[0, 1, 2] and out[0, 1 * 4 + 2, 2 * 4 + 3] == 0


def test_bad_input_raises():
    X = np.eye(3)[None]
    with pytest.raises(ValueError, match="greater than dim - 1 = 2"):
        wishart_log_prob(X, np.eye(3), 2.0)
    with pytest.raises(ValueError, match="greater than dim - 1 = 2"):
        inverse_wishart_log_prob(X, np.eye(3), tf.constant([1.5], tf.float64))
    with pytest.raises(ValueError, match="greater than dim - 1 = 2"):
        bartlett_factor(1.9, 3, 4, SeededNoise(0), "W", tf.float64)
    with pytest.raises(ValueError, match="finite"):
        bartlett_factor(np.nan, 3, 4, SeededNoise(0), "W", tf.float64)
    with pytest.raises(ValueError, match="positive integer"):
        bartlett_factor(3.0, 0, 4, SeededNoise(0), "W", tf.float64)
    with pytest.raises(ValueError, match="channels"):
        kron_identity(np.eye(2)[None], 0)
