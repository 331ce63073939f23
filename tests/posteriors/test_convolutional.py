"""Oracles for convolutional global inducing (docs/algorithms.md, "Convolutional global inducing",
oracle O12) and the conv networks.

* O12: ``G`` and ``R`` by autocorrelation equal the explicit patch-matrix products (circular
  boundaries for "same"; also "valid") to 1e-10.
* A conv GI layer whose kernel covers the whole image ("valid") equals a dense GI layer on the
  flattened image: same samples, same log-ratio under the same noise.
* A 1x1 conv GI layer equals a dense GI layer applied per pixel (its rows are the pixels).
* A full prior precision (spatial prior): log-ratio, analytic KL and the factorised KL equal
  direct Gaussian densities / TFP's KL.
* Global inducing predicts per point; the inducing batch norm uses inducing rows only.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_probability as tfp
from scipy.stats import multivariate_normal

import deepgp_gi as dg
from deepgp_gi.autocorrelation import patch_cross, patch_gram, patch_matrix
from deepgp_gi.conv_bnn import build_conv_bnn
from deepgp_gi.layers import Conv2DLayer, DenseLayer, Flatten, InducingBatchNorm
from deepgp_gi.noise import SeededNoise
from deepgp_gi.posteriors.convolutional import ConvNetPosterior
from deepgp_gi.posteriors.inducing import GlobalInducingPosterior
from deepgp_gi.posteriors.pseudo_data import (
    analytic_kl,
    gram_posterior,
    log_ratio,
    pseudo_data_posterior,
    sample_weights,
)
from deepgp_gi.posteriors.weight_space import factorised_kl
from fit_checks import assert_xla_fit_matches_plain  # tests/ is on sys.path under pytest


def _reference(X, V, lam, k, padding):
    """``X'^T Lambda X'`` and ``X'^T Lambda V`` from explicit circular patches."""
    Xp = patch_matrix(tf.constant(X), k, padding, boundary="circular").numpy()
    M, D = Xp.shape[0], Xp.shape[-1]
    Xf = Xp.reshape(M, -1, D)
    Vf = V.reshape(M, -1, V.shape[-1])
    return np.einsum("i,iud,iue->de", lam, Xf, Xf), np.einsum("i,iud,iup->dp", lam, Xf, Vf)


@pytest.mark.parametrize("padding", ["same", "valid"])
@pytest.mark.parametrize("bias", [True, False])
def test_o12_autocorrelation_equals_patch_products(padding, bias):
    rng = np.random.default_rng(0)
    S, B, H, W, C, k, P = 2, 3, 6, 5, 2, 3, 4
    X = rng.standard_normal((S, B, H, W, C))
    lam = np.exp(rng.standard_normal(B))
    Ho, Wo = (H, W) if padding == "same" else (H - k + 1, W - k + 1)
    V = rng.standard_normal((B, Ho, Wo, P))
    G = patch_gram(tf.constant(X), tf.constant(lam), k, padding, bias).numpy()
    R = patch_cross(tf.constant(X), tf.constant(V), tf.constant(lam), k, padding, bias).numpy()
    for s in range(S):
        G_ref, R_ref = _reference(X[s], V, lam, k, padding)
        if not bias:
            G_ref, R_ref = G_ref[:-1, :-1], R_ref[:-1]
        np.testing.assert_allclose(G[s], G_ref, atol=1e-10, rtol=0)
        np.testing.assert_allclose(R[s], R_ref, atol=1e-10, rtol=0)


def test_circular_boundary_differs_from_zero_padding():
    """The posterior's circular Gram is not the forward pass's zero-padded one (the test above
    would pass for a wrong boundary only if they coincided)."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((1, 2, 5, 5, 1))
    lam = np.ones(2)
    G = patch_gram(tf.constant(X), tf.constant(lam), 3, "same").numpy()[0]
    Xp = patch_matrix(tf.constant(X[0]), 3, "same", boundary="zeros").numpy().reshape(-1, 10)
    assert np.abs(G - Xp.T @ Xp).max() > 1e-2


def test_forward_convolution_is_patch_regression():
    """``Conv2DLayer.apply`` equals the zero-padded patch matrix times the weights."""
    rng = np.random.default_rng(2)
    layer = Conv2DLayer((5, 4, 2), 3, kernel_size=3)
    F = rng.standard_normal((2, 3, 5, 4, 2))
    W = rng.standard_normal((2, layer.fan_in, 3))
    out = layer.apply(tf.constant(F), tf.constant(W)).numpy()
    for s in range(2):
        Xp = patch_matrix(tf.constant(F[s]), 3, "same", boundary="zeros").numpy()
        np.testing.assert_allclose(out[s], Xp @ W[s], atol=1e-12)


def _dense_twin_pair(M=6, N=4, P=3, out=2, seed=0):
    """A conv net whose kernel covers the 4x4x2 image ('valid': 1x1 output) and the dense net on
    the flattened image, with the same U_0, V, Lambda."""
    rng = np.random.default_rng(seed)
    H, W, C = 4, 4, 2
    U0 = rng.standard_normal((M, H, W, C))
    X = rng.standard_normal((N, H, W, C))
    V1 = rng.standard_normal((M, P))
    V2 = rng.standard_normal((M, out))
    conv = Conv2DLayer((H, W, C), P, kernel_size=4, padding="valid", name="conv")
    conv_net = [conv, Flatten(conv.output_shape), DenseLayer(P, out, activation="relu")]
    conv_post = ConvNetPosterior(
        conv_net,
        "global",
        U0,
        pseudo_outputs=[V1.reshape(M, 1, 1, P), V2],
        log_precision_init=[-1.0, 0.5],
    )
    dense_net = [DenseLayer(H * W * C, P), DenseLayer(P, out, activation="relu")]
    dense_post = GlobalInducingPosterior(
        dense_net,
        inducing_inputs=U0.reshape(M, -1),
        pseudo_outputs=[V1, V2],
        log_precision_init=[-1.0, 0.5],
        precision="shared_diagonal",
        last_layer="sampled",
    )  # the convolutional GI samples its last layer
    lam = rng.uniform(0.5, 2.0, size=(2, M))
    for post in (conv_post, dense_post):
        for j in range(2):
            post.pseudo_data[j].precision.assign(lam[j][None])
    return X, conv_post, dense_post


def test_whole_image_valid_conv_gi_equals_dense_gi():
    X, conv_post, dense_post = _dense_twin_pair()
    S = 3
    a = conv_post.propagate(X, S, seed=SeededNoise(5))
    b = dense_post.propagate(X.reshape(X.shape[0], -1), S, seed=SeededNoise(5))
    np.testing.assert_allclose(
        a.samples[0].numpy().reshape(S, X.shape[0], -1), b.samples[0].numpy(), atol=1e-10
    )
    np.testing.assert_allclose(a.mean.numpy(), b.mean.numpy(), atol=1e-10)
    np.testing.assert_allclose(a.kl.numpy(), b.kl.numpy(), atol=1e-9)


def test_one_by_one_conv_gi_equals_dense_gi_per_pixel():
    rng = np.random.default_rng(3)
    S, M, H, W, C, P = 2, 3, 4, 3, 2, 5
    layer = Conv2DLayer((H, W, C), P, kernel_size=1)
    U = rng.standard_normal((S, M, H, W, C))
    V = rng.standard_normal((M, H, W, P))
    lam = np.exp(rng.standard_normal(M))
    p = tf.constant([2.0, 3.5], tf.float64)
    L, mean = gram_posterior(
        layer.gram(tf.constant(U), tf.constant(lam)),
        layer.cross(tf.constant(U), tf.constant(V), tf.constant(lam)),
        p,
    )
    pixels = np.concatenate([U.reshape(S, M * H * W, C), np.ones((S, M * H * W, 1))], axis=-1)
    lam_pixels = np.repeat(lam, H * W)[None]
    L_d, mean_d = pseudo_data_posterior(
        tf.constant(pixels),
        tf.constant(V.reshape(-1, P)),
        p,
        diag_precision=tf.constant(lam_pixels),
    )
    np.testing.assert_allclose(L.numpy(), L_d.numpy(), atol=1e-10)
    np.testing.assert_allclose(mean.numpy(), mean_d.numpy(), atol=1e-10)
    z = tf.constant(rng.standard_normal((S, C + 1, P)))
    Wt = sample_weights(L, mean, z)
    F = rng.standard_normal((S, 4, H, W, C))
    conv_out = layer.apply(tf.constant(F), Wt).numpy()
    dense_out = np.concatenate([F, np.ones(F.shape[:-1] + (1,))], -1) @ Wt.numpy()[:, None, None]
    np.testing.assert_allclose(conv_out, dense_out, atol=1e-10)


def _random_precision(rng, S, D):
    A = rng.standard_normal((S, D, D))
    return A @ np.transpose(A, (0, 2, 1)) + D * np.eye(D)


def test_full_prior_precision_log_ratio_and_kls():
    rng = np.random.default_rng(4)
    S, M, D, P = 2, 5, 4, 3
    Phi = rng.standard_normal((S, M, D))
    V = rng.standard_normal((M, P))
    lam = np.exp(rng.standard_normal((1, M)))
    Pm = _random_precision(rng, S, D)
    L, mean = pseudo_data_posterior(
        tf.constant(Phi), tf.constant(V), tf.constant(Pm), diag_precision=tf.constant(lam)
    )
    z = rng.standard_normal((S, D, P))
    w = sample_weights(L, mean, tf.constant(z)).numpy()
    lr = log_ratio(L, tf.constant(w), tf.constant(z), tf.constant(Pm)).numpy()
    kl = analytic_kl(L, mean, tf.constant(Pm)).numpy()
    for s in range(S):
        prec = Pm[s] + Phi[s].T @ (lam[0][:, None] * Phi[s])
        cov = np.linalg.inv(prec)
        m = np.linalg.solve(prec, Phi[s].T @ (lam[0][:, None] * V))
        np.testing.assert_allclose(mean.numpy()[s], m, atol=1e-10)
        prior_cov = np.linalg.inv(Pm[s])
        direct = sum(
            multivariate_normal(np.zeros(D), prior_cov).logpdf(w[s, :, u])
            - multivariate_normal(m[:, u], cov).logpdf(w[s, :, u])
            for u in range(P)
        )
        np.testing.assert_allclose(lr[s], direct, atol=1e-9)
        q = tfp.distributions.MultivariateNormalFullCovariance(m.T, cov)
        prior = tfp.distributions.MultivariateNormalFullCovariance(np.zeros(D), prior_cov)
        np.testing.assert_allclose(
            kl[s], tf.reduce_sum(tfp.distributions.kl_divergence(q, prior)).numpy(), atol=1e-9
        )


def test_factorised_kl_with_full_prior_precision():
    rng = np.random.default_rng(5)
    S, D, P = 2, 4, 3
    mean = rng.standard_normal((D, P))
    var = np.exp(rng.standard_normal((D, P)))
    Pm = _random_precision(rng, S, D)
    kl = factorised_kl(tf.constant(mean), tf.constant(var), tf.constant(Pm)).numpy()
    for s in range(S):
        prior = tfp.distributions.MultivariateNormalFullCovariance(
            np.zeros(D), np.linalg.inv(Pm[s])
        )
        q = tfp.distributions.MultivariateNormalDiag(mean.T, np.sqrt(var.T))
        np.testing.assert_allclose(
            kl[s], tf.reduce_sum(tfp.distributions.kl_divergence(q, prior)).numpy(), atol=1e-9
        )
    # A scalar precision agrees with the matrix form p I.
    p = np.array([1.5, 4.0])
    np.testing.assert_allclose(
        factorised_kl(tf.constant(mean), tf.constant(var), tf.constant(p)).numpy(),
        factorised_kl(
            tf.constant(mean), tf.constant(var), tf.constant(p[:, None, None] * np.eye(D))
        ).numpy(),
        atol=1e-10,
    )


def _images(N=24, seed=0):
    """Three classes of 8x8 images: a class-specific pattern plus noise."""
    rng = np.random.default_rng(seed)
    patterns = np.random.default_rng(100).random((3, 8, 8, 1))
    Y = rng.integers(0, 3, (N, 1)).astype(float)
    X = patterns[Y[:, 0].astype(int)] + 0.3 * rng.standard_normal((N, 8, 8, 1))
    return X, Y


@pytest.mark.parametrize("posterior", ["global", "factorised_global", "local"])
def test_predictions_are_per_point(posterior):
    """A test image's predictive does not depend on the other images of its batch."""
    X, Y = _images()
    model = build_conv_bnn(
        X, Y, architecture="resnet", channels=4, posterior=posterior, num_inducing=6, seed=0
    )
    full = model.predict_f_components(X[:5], 3, seed=SeededNoise(7))[0].numpy()
    sub = model.predict_f_components(X[2:4], 3, seed=SeededNoise(7))[0].numpy()
    np.testing.assert_allclose(full[:, 2:4], sub, atol=1e-10)


def test_inducing_batch_norm_uses_inducing_rows_only():
    rng = np.random.default_rng(6)
    bn = InducingBatchNorm((3, 3, 2))
    F = rng.standard_normal((2, 7, 3, 3, 2)) * 3 + 1
    out = bn.apply(tf.constant(F), 4).numpy()
    top = out[:, :4]
    np.testing.assert_allclose(top.mean(axis=(1, 2, 3)), 0, atol=1e-12)
    np.testing.assert_allclose(top.var(axis=(1, 2, 3)), 1, atol=1e-4)
    F2 = F.copy()
    F2[:, 5] += 100.0  # change one data row: nothing else moves
    out2 = bn.apply(tf.constant(F2), 4).numpy()
    np.testing.assert_allclose(np.delete(out2, 5, axis=1), np.delete(out, 5, axis=1), atol=1e-12)
    with pytest.raises(ValueError, match="inducing rows"):
        bn.apply(tf.constant(F), 0)


@pytest.mark.slow  # a ResNet step compiled with XLA per family, then 40 steps: `make test-all`
@pytest.mark.parametrize("posterior", ["global", "factorised", "factorised_global", "local"])
def test_conv_training_step_compiles_and_equals_plain_step(posterior):
    """The conv net's training step runs under tf.function and under XLA (jit_compile=True) with
    the same ELBOs and parameters, and a short run raises the ELBO."""
    X, Y = _images(30)
    X = (X - X.mean()) / X.std()

    def build():
        return build_conv_bnn(
            X, Y, architecture="resnet", channels=4, posterior=posterior, num_inducing=8, seed=1
        )

    before = build().elbo((X, Y), 8, seed=SeededNoise(1)).numpy()
    plain, _ = assert_xla_fit_matches_plain(
        build,
        (X, Y),
        values_rtol=1e-7,
        steps=4,
        batch_size=15,
        learning_rate=1e-2,
        seed=3,
        log_every=1,
    )
    dg.fit(plain, (X, Y), steps=40, learning_rate=1e-2, seed=4, progress=False)
    after = plain.elbo((X, Y), 8, seed=SeededNoise(1)).numpy()
    assert np.isfinite(after) and after > before + 1.0, (before, after)


def test_bad_inputs_raise():
    X, Y = _images()
    with pytest.raises(ValueError, match="architecture"):
        build_conv_bnn(X, Y, architecture="vgg")
    with pytest.raises(ValueError, match="posterior"):
        build_conv_bnn(X, Y, posterior="ffg_w")
    with pytest.raises(ValueError, match="num_inducing"):
        build_conv_bnn(X, Y, num_inducing=0)
    with pytest.raises(ValueError, match="4-D"):
        build_conv_bnn(X.reshape(len(X), -1), Y)
    with pytest.raises(ValueError, match="batch_norm"):
        build_conv_bnn(X, Y, architecture="resnet", posterior="factorised", batch_norm=True)
    with pytest.raises(ValueError, match="odd kernel_size"):
        Conv2DLayer((8, 8, 1), 4, kernel_size=4)
    model = build_conv_bnn(
        X, Y, architecture="lenet", channels=(2, 2), hidden=(4,), num_inducing=4, seed=0
    )
    with pytest.raises(ValueError, match=r"shape \[N, 8, 8, 1\]"):
        model.predict_y(X[:, :7], 2)
    with pytest.raises(ValueError, match="does not accept option"):
        build_conv_bnn(X, Y, bogus=1)


def test_spatial_prior_conv_gi_at_the_prior_limit_has_zero_kl():
    """Spatial inverse-Wishart prior on conv layers: with every Lambda -> 0 the weights' q equals
    their prior given L (log-ratio exactly 0 per sample), and with q(L) = p(L) (weights of the
    pseudo-observations -> 0) the whole regulariser is 0; the conv layers get the full precision
    D (L kron I_C) of the sampled L."""
    X, Y = _images(12)
    model = build_conv_bnn(
        X,
        Y,
        architecture="lenet",
        channels=(2, 3),
        hidden=(5,),
        posterior="global",
        prior="spatial_iw",
        num_inducing=4,
        seed=0,
    )
    post = model.posterior
    for pd in post.pseudo_data:
        pd.set_log_precision(-800.0)
    conv0 = post.weighted[0]
    assert post.scale_posteriors[0].pseudo_observations.shape == (25, 25)  # p = k*k = 25
    p, _ = post.prior_precision(0, 2, SeededNoise(3), tf.float64)
    assert p.shape == (2, conv0.fan_in, conv0.fan_in)
    L, _ = post.scale_posteriors[0].sample(conv0.prior, 2, SeededNoise(3), "L/0", tf.float64)
    np.testing.assert_allclose(p.numpy(), conv0.prior.conv_precision(L, 1).numpy(), rtol=1e-12)
    kl_some = post.propagate(X, 3, seed=SeededNoise(4)).kl.numpy()
    assert np.all(np.abs(kl_some) > 1e-3)  # q(L) != p(L) at initialisation
    for q in post.scale_posteriors:
        q.log_weights.assign(np.full(q.log_weights.shape, -1e3))
    np.testing.assert_allclose(post.propagate(X, 3, seed=SeededNoise(4)).kl.numpy(), 0.0, atol=1e-8)


# make test: every posterior once and every prior twice; make test-all: the other four pairs
_FAST_PRIOR_PAIRS = {
    ("scale", "factorised"),
    ("scale", "global"),
    ("spatial_iw", "local"),
    ("spatial_iw", "factorised_global"),
}


@pytest.mark.parametrize(
    "prior, posterior",
    [
        pytest.param(
            prior,
            posterior,
            id=f"{prior}-{posterior}",
            marks=() if (prior, posterior) in _FAST_PRIOR_PAIRS else pytest.mark.slow,
        )
        for prior in ("scale", "spatial_iw")
        for posterior in ("factorised", "local", "global", "factorised_global")
    ],
)
def test_random_priors_on_conv_nets_give_finite_gradients(posterior, prior):
    X, Y = _images(10)
    model = build_conv_bnn(
        X,
        Y,
        architecture="resnet",
        channels=2,
        posterior=posterior,
        prior=prior,
        num_inducing=4,
        seed=0,
    )
    with tf.GradientTape() as tape:
        elbo = model.elbo((X, Y), 2, seed=SeededNoise(1))
    grads = tape.gradient(elbo, model.trainable_variables)
    assert np.isfinite(elbo.numpy())
    assert all(
        g is not None and np.all(np.isfinite(tf.convert_to_tensor(g).numpy())) for g in grads
    )
    scale_grads = [
        g
        for v, g in zip(model.trainable_variables, grads)
        if "log_weights" in v.name or "alpha" in v.name
    ]
    assert scale_grads and any(
        np.abs(tf.convert_to_tensor(g).numpy()).max() > 0 for g in scale_grads
    )


def test_parameter_count_per_weighted_layer():
    """``layer_j`` is weighted layer j: factorised means and variances (2 D P) plus q(L)
    (p x p pseudo-observations and p weights, p = k*k for a convolution, 1 for a dense layer)."""
    X, Y = _images(10)
    model = build_conv_bnn(
        X,
        Y,
        architecture="lenet",
        channels=(2, 3),
        hidden=(5,),
        posterior="factorised",
        prior="spatial_iw",
        num_inducing=4,
        seed=0,
    )
    counts = dg.parameter_count(model, per_layer=True)
    expected = [2 * 26 * 2 + 25 * 26, 2 * 51 * 3 + 25 * 26, 2 * 13 * 5 + 2, 2 * 6 * 3 + 2]
    assert [counts[f"layer_{j}"] for j in range(4)] == expected
    assert counts["shared"] == 0 and counts["total"] == sum(expected) == dg.parameter_count(model)
    local = build_conv_bnn(
        X,
        Y,
        architecture="lenet",
        channels=(2, 3),
        hidden=(5,),
        posterior="local",
        num_inducing=4,
        seed=0,
    )
    conv0 = local.posterior.weighted[0]
    # 1 inducing image (ceil(26 / 64)) of 8x8x1, its V [1, 8, 8, 2] and one precision
    assert (
        dg.parameter_count(local, per_layer=True)["layer_0"] == conv0.num_inducing * 64 + 64 * 2 + 1
    )
