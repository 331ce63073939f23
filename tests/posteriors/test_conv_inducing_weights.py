"""Inducing weights (Ritter et al. 2021) on convolutional BNNs: numerical oracles (O11 as
numbered in docs/algorithms.md, "Test oracles").

* A conv layer whose kernel covers the whole image ("valid") with ffg_u / ensemble_u /
  ensemble_w equals the dense BNN on the flattened image under the same noise (outputs and KL).
* With lambda = 1 and q(U) = p(U) the regulariser of a conv network is zero; elsewhere it is the
  sum over its weighted layers of KL[q(U~)||N(0, I)] + d_in d_out (lambda^2/2 - log lambda - 1/2)
  with d_out = C_out, d_in = k k C_in + 1 (NumPy).
* O11 through the conv forward pass: the filter a convolution applies (read off its outputs on
  unit images) has mean sigma T_r U T_c and covariance lambda^2 sigma^2 Cov p(W|U) plus the
  q(U) term (NumPy solves and Kronecker products), and sigma^2 I at the prior.
* parameter_count per weighted layer (closed forms), FFG-U smaller than factorised.
* The compiled (XLA) training step equals the plain one; ensemble members cycle; bad input.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import gpflow
import numpy as np
import pytest
import tensorflow as tf

import deepgp_gi as dg
from deepgp_gi.conv_bnn import build_conv_bnn
from deepgp_gi.layers import (
    Activation,
    AveragePool2D,
    Conv2DLayer,
    DenseLayer,
    Flatten,
    InducingBatchNorm,
)
from deepgp_gi.noise import FixedNoise, SeededNoise
from deepgp_gi.posteriors.inducing_weights import (
    EnsembleInducingPosterior,
    EnsembleWeightPosterior,
    FFGInducingPosterior,
)
from deepgp_gi.priors import NealPrior
from fit_checks import assert_xla_fit_matches_plain  # tests/ is on sys.path under pytest
from test_convolutional import _images  # tests/posteriors is on sys.path under pytest

CLASSES = {
    "ffg_u": FFGInducingPosterior,
    "ensemble_u": EnsembleInducingPosterior,
    "ensemble_w": EnsembleWeightPosterior,
}


def _options(name):
    if name == "ffg_u":
        return dict(num_inducing=3, lambda_init=0.3, sd_init=0.2, d_init=0.5)
    if name == "ensemble_u":
        return dict(
            num_inducing=3, num_members=3, lambda_init=0.3, d_init=0.5, prior_regulariser=True
        )
    return dict(num_members=3, prior_regulariser=True)


@pytest.mark.parametrize("name", list(CLASSES))
def test_whole_image_valid_conv_equals_dense_on_flattened_images(name):
    """A 4x4 'valid' convolution on 4x4x2 images is a dense layer on the flattened image (the
    offset-major patch order is numpy's row-major flatten, the bias last): the same parameters
    (same seed), the same noise names, so the same outputs and regulariser to 1e-10."""
    rng = np.random.default_rng(0)
    H, W, C, P, out, N, S = 4, 4, 2, 3, 2, 5, 3
    X = rng.standard_normal((N, H, W, C))
    conv = Conv2DLayer((H, W, C), P, kernel_size=4, padding="valid", prior=NealPrior(sd=1.5))
    conv_net = [
        conv,
        Flatten(conv.output_shape),
        DenseLayer(P, out, activation="relu", prior=NealPrior(sd=1.5)),
    ]
    dense_net = [
        DenseLayer(H * W * C, P, prior=NealPrior(sd=1.5)),
        DenseLayer(P, out, activation="relu", prior=NealPrior(sd=1.5)),
    ]
    cls = CLASSES[name]
    conv_post = cls(conv_net, seed=1, **_options(name))
    dense_post = cls(dense_net, seed=1, **_options(name))
    assert conv_post.weighted == (conv, conv_net[-1])
    for a, b in zip(conv_post.trainable_variables, dense_post.trainable_variables):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    for v in conv_post.trainable_variables:  # move every parameter off its initial value
        v.assign(v + 0.1 * rng.standard_normal(v.shape))
    for a, b in zip(conv_post.trainable_variables, dense_post.trainable_variables):
        b.assign(a)
    pc = conv_post.propagate(X, S, seed=SeededNoise(5))
    pd = dense_post.propagate(X.reshape(N, -1), S, seed=SeededNoise(5))
    np.testing.assert_allclose(
        pc.samples[0].numpy().reshape(S, N, P), pd.samples[0].numpy(), atol=1e-10
    )
    np.testing.assert_allclose(pc.mean.numpy(), pd.mean.numpy(), atol=1e-10)
    np.testing.assert_allclose(pc.kl.numpy(), pd.kl.numpy(), atol=1e-10)
    assert np.all(np.abs(pc.kl.numpy()) > 1.0) and np.std(pc.mean.numpy(), axis=0).max() > 1e-2


def _lenet(X, Y, posterior, **options):
    return build_conv_bnn(
        X,
        Y,
        architecture="lenet",
        channels=(2, 3),
        hidden=(5,),
        posterior=posterior,
        seed=0,
        **options,
    )


def test_kl_is_zero_at_the_prior_and_the_closed_form_elsewhere():
    X, Y = _images(10)
    model = _lenet(X, Y, "ffg_u", num_inducing=4, lambda_init=1.0, sd_init=1.0)
    post = model.posterior
    for m in post.u_means:
        m.assign(np.zeros(m.shape))
    np.testing.assert_allclose(
        post.propagate(X, 3, seed=SeededNoise(2)).kl.numpy(), 0.0, atol=1e-10
    )

    rng = np.random.default_rng(1)
    for m, s, iw in zip(post.u_means, post.u_sds, post.inducing_weights):
        m.assign(rng.standard_normal(m.shape))
        s.assign(rng.uniform(0.1, 0.9, s.shape))
        iw.lam.assign(rng.uniform(0.05, 0.9))
    ref = 0.0
    for layer, m, s, iw in zip(post.weighted, post.u_means, post.u_sds, post.inducing_weights):
        m, s, lam = m.numpy(), s.numpy(), iw.lam.numpy()
        d_out = layer.output_dim
        is_conv = hasattr(layer, "kernel_size")
        d_in = layer.kernel_size**2 * layer.input_shape[-1] + 1 if is_conv else layer.input_dim + 1
        assert (iw.d_out, iw.d_in) == (d_out, d_in)
        ref += 0.5 * np.sum(s**2 + m**2 - 1 - np.log(s**2)) + d_out * d_in * (
            lam**2 / 2 - np.log(lam) - 0.5
        )
    np.testing.assert_allclose(
        post.propagate(X, 3, seed=SeededNoise(2)).kl.numpy(), ref, rtol=1e-12
    )


def _np_factors(iw):
    """NumPy ``T_r``, ``T_c``, ``L_r``, ``L_c`` with the jitter folded into ``D`` (independent of
    the library's solves)."""
    Z_r, Z_c = iw.z_rows.numpy(), iw.z_cols.numpy()

    def eff(Z, D):
        return D**2 + iw.jitter * np.mean(np.sum(Z**2, 1) + D**2)

    Psi_r = Z_r @ Z_r.T + np.diag(eff(Z_r, iw.d_rows.numpy()))
    Psi_c = Z_c @ Z_c.T + np.diag(eff(Z_c, iw.d_cols.numpy()))
    T_r = np.linalg.solve(Psi_r, Z_r).T
    T_c = np.linalg.solve(Psi_c, Z_c)
    cond = np.eye(iw.d_out * iw.d_in) - np.kron(Z_c.T @ T_c, Z_r.T @ T_r.T)  # column-stacked vec W
    return T_r, T_c, np.linalg.cholesky(Psi_r), np.linalg.cholesky(Psi_c), cond


def _filter_net(prior_sd=2.0):
    """A 3x3 'valid' convolution on 3x3x2 images (one output pixel, 3 filters, d_in = 19)."""
    conv = Conv2DLayer((3, 3, 2), 3, kernel_size=3, padding="valid", prior=NealPrior(sd=prior_sd))
    return [
        conv,
        Activation(conv.output_shape, "relu"),
        Flatten(conv.output_shape),
        DenseLayer(3, 1, activation="identity"),
    ]


def _filters(post, draws, S):
    """The filters ``[S, d_out, d_in]`` (paper layout) the convolution applied in sample s: its
    outputs on the zero image (bias) and on unit images (columns)."""
    X = np.concatenate([np.zeros((1, 3, 3, 2)), np.eye(18).reshape(18, 3, 3, 2)])
    out = post.propagate(X, S, seed=FixedNoise(draws, fallback=SeededNoise(0))).samples[0].numpy()
    out = out.reshape(S, 19, 3)  # conv output before the relu: [S, image, C_out]
    bias = out[:, 0]
    return np.concatenate(
        [np.transpose(out[:, 1:] - bias[:, None], (0, 2, 1)), bias[:, :, None]], axis=-1
    )


@pytest.mark.parametrize("at_prior", [False, True])
def test_O11_moments_of_the_filters_a_convolution_applies(at_prior):
    """The filter is affine in the noise (E1..E4 and the whitened draw of U~), so its exact mean
    (all noise 0) and covariance (unit noise vectors, one per sample) follow from two forward
    passes. Mean: sigma T_r U T_c with U = L_r m L_c^T; covariance: lambda^2 sigma^2 Cov p(W|U)
    + sigma^2 (T_c^T L_c kron T_r L_r) diag(s^2) (.)^T; at the prior (lambda = 1, m = 0, s = 1)
    sigma^2 I. sigma = 2 / sqrt(19) (NealPrior(sd=2), bias in d_in)."""
    layers = _filter_net()
    post = FFGInducingPosterior(layers, num_inducing=2, seed=3)
    iw = post.inducing_weights[0]
    assert (iw.d_out, iw.d_in, iw.M_out, iw.M_in) == (3, 19, 2, 2)
    rng = np.random.default_rng(4)
    iw.z_rows.assign(rng.standard_normal(iw.z_rows.shape) / 2)
    iw.z_cols.assign(rng.standard_normal(iw.z_cols.shape) / 2)
    iw.d_rows.assign(rng.uniform(0.3, 0.8, 2))
    iw.d_cols.assign(rng.uniform(0.3, 0.8, 2))
    if at_prior:
        lam, m, s = 1.0, np.zeros((2, 2)), np.ones((2, 2))
    else:
        lam, m, s = 0.6, rng.standard_normal((2, 2)), rng.uniform(0.2, 0.9, (2, 2))
    iw.lam.assign(lam)
    post.u_means[0].assign(m)
    post.u_sds[0].assign(s)
    sigma = 2.0 / np.sqrt(19)
    shapes = {
        "w/0/e1": (3, 19),
        "w/0/e2": (2, 2),
        "w/0/e3": (2, 2),
        "w/0/e4": (2, 2),
        "u/0": (2, 2),
    }

    zero = {k: np.zeros((1,) + v) for k, v in shapes.items()}
    mean = _filters(post, zero, 1)[0]
    T_r, T_c, L_r, L_c, cond = _np_factors(iw)
    np.testing.assert_allclose(mean, sigma * T_r @ (L_r @ m @ L_c.T) @ T_c, atol=1e-12)

    n = sum(int(np.prod(v)) for v in shapes.values())
    eye, draws, start = np.eye(n), {}, 0
    for k, v in shapes.items():
        size = int(np.prod(v))
        draws[k] = eye[:, start : start + size].reshape((n,) + v)
        start += size
    A = _filters(post, draws, n) - mean  # [n, 3, 19]: column s of the linear map
    A = np.stack([a.flatten(order="F") for a in A], axis=1)
    G = np.kron(T_c.T @ L_c, T_r @ L_r)  # vec(T_r L_r X L_c^T T_c) = G vec X
    ref = lam**2 * sigma**2 * cond + sigma**2 * G @ np.diag(s.flatten(order="F") ** 2) @ G.T
    np.testing.assert_allclose(A @ A.T, ref, atol=1e-12)
    if at_prior:
        np.testing.assert_allclose(A @ A.T, sigma**2 * np.eye(57), atol=1e-12)


def _closed_form_counts(post, name, K=5):
    counts = []
    for layer in post.weighted:
        d_out, d_in = layer.output_dim, layer.fan_in
        if name == "factorised":
            counts.append(2 * d_out * d_in)
        elif name == "ensemble_w":
            counts.append(K * d_out * d_in)
        else:
            M = post.num_inducing
            Mo, Mi = min(M, d_out), min(M, d_in)
            q_u = 2 * Mo * Mi if name == "ffg_u" else K * Mo * Mi
            counts.append(Mo * d_out + Mi * d_in + Mo + Mi + 1 + q_u)
    return counts


def test_parameter_count_per_weighted_layer():
    X, Y = _images(10)
    models = {
        name: build_conv_bnn(X, Y, architecture="lenet", posterior=name, num_inducing=4, seed=0)
        for name in ("factorised", "ffg_u", "ensemble_u", "ensemble_w")
    }
    totals = {}
    for name, model in models.items():
        counts = dg.parameter_count(model, per_layer=True)
        J = len(model.posterior.weighted)
        assert J == 5 and set(counts) == {f"layer_{j}" for j in range(J)} | {"shared", "total"}
        assert [counts[f"layer_{j}"] for j in range(J)] == _closed_form_counts(
            model.posterior, name
        ), name
        assert counts["shared"] == 0
        assert (
            sum(counts[f"layer_{j}"] for j in range(J))
            == counts["total"]
            == dg.parameter_count(model)
        )
        assert counts["total"] == sum(int(np.prod(v.shape)) for v in model.posterior.variables)
        totals[name] = counts["total"]
    # LeNet on 8x8x1 (C classes): 6 x 26 + 16 x 151 + 120 x 65 + 84 x 121 + C x 85 weights
    weights = 156 + 2_416 + 7_800 + 10_164 + models["ffg_u"].layers[-1].output_dim * 85
    assert totals["factorised"] == 2 * weights and totals["ensemble_w"] == 5 * weights
    assert totals["ffg_u"] < 0.2 * totals["factorised"], totals
    table = dg.parameter_table(models, reference="factorised")
    assert f"{totals['ffg_u']:,}" in table


def _small_net(X, Y, posterior):
    """conv(3x3, 2) - relu - avgpool2 - flatten - dense: two weighted layers (a small graph
    for XLA)."""
    conv = Conv2DLayer(X.shape[1:], 2, kernel_size=3, name="conv")
    pool = AveragePool2D(conv.output_shape, 2)
    layers = [
        conv,
        Activation(conv.output_shape, "relu"),
        pool,
        Flatten(pool.output_shape),
        DenseLayer(32, 3, activation="identity", name="dense"),
    ]
    post = CLASSES[posterior](layers, num_inducing=4, seed=0)
    return dg.DeepGP(layers, gpflow.likelihoods.Softmax(3), posterior=post, num_data=len(X))


@pytest.mark.slow  # a conv step compiled with XLA per family: `make test-all`
@pytest.mark.parametrize("posterior", ["ffg_u", "ensemble_u"])
def test_conv_training_step_compiles_and_equals_plain_step(posterior):
    """The conv net's training step under XLA (jit_compile=True) gives the same ELBOs and
    parameters as the plain tf.function step."""
    X, Y = _images(30)
    X = (X - X.mean()) / X.std()
    assert_xla_fit_matches_plain(
        lambda: _small_net(X, Y, posterior),
        (X, Y),
        values_rtol=1e-7,
        steps=3,
        batch_size=15,
        learning_rate=1e-2,
        seed=3,
        log_every=1,
    )


@pytest.mark.slow  # 40 training steps per family: `make test-all`
@pytest.mark.parametrize("posterior", ["ffg_u", "ensemble_u", "ensemble_w"])
def test_conv_inducing_weights_train(posterior):
    """A short run raises the ELBO (the KL-free objective for the ensembles)."""
    X, Y = _images(30)
    X = (X - X.mean()) / X.std()
    model = _lenet(X, Y, posterior, num_inducing=4)
    before = model.elbo((X, Y), 8, seed=SeededNoise(1)).numpy()
    dg.fit(model, (X, Y), steps=40, learning_rate=1e-2, seed=4, progress=False)
    after = model.elbo((X, Y), 8, seed=SeededNoise(1)).numpy()
    assert np.isfinite(after) and after > before + 1.0, (before, after)


# ensemble_u in `make test-all` for the fast suite's time (ensemble_w covers the cycling here)
@pytest.mark.parametrize(
    "posterior", [pytest.param("ensemble_u", marks=pytest.mark.slow), "ensemble_w"]
)
def test_ensemble_members_cycle_and_one_member_is_trained_per_step(posterior):
    """Prediction with 2K samples: sample s and s + K use the same member (for Ensemble-U the
    conditional noise is switched off with lambda -> 0) and the members differ. With one sample
    (a training step) the gradient reaches only the member the step's noise chose."""
    X, Y = _images(8)
    K = 3
    options = (
        dict(num_members=K, lambda_init=1e-8) if posterior == "ensemble_u" else dict(num_members=K)
    )
    model = build_conv_bnn(
        X,
        Y,
        architecture="resnet",
        channels=2,
        posterior=posterior,
        num_inducing=3,
        seed=0,
        **options,
    )
    F = model.posterior.propagate(X, 2 * K, seed=SeededNoise(3)).mean.numpy()
    np.testing.assert_allclose(F[:K], F[K:], atol=1e-6)
    assert np.std(F[:K], axis=0).max() > 1e-3
    members = (
        model.posterior.u_members if posterior == "ensemble_u" else model.posterior.weight_members
    )
    for z, chosen in ((-2.0, 0), (0.0, 1), (2.0, 2)):  # offset floor(K Phi(z))
        noise = FixedNoise({"member": np.array([z])}, fallback=SeededNoise(4))
        with tf.GradientTape() as tape:
            elbo = model.elbo((X, Y), 1, seed=noise)
        grads = tape.gradient(elbo, [m.unconstrained_variable for m in members])
        norms = np.stack(
            [np.abs(tf.convert_to_tensor(g).numpy()).reshape(K, -1).max(axis=1) for g in grads]
        )
        assert np.all(np.delete(norms, chosen, axis=1) == 0), (z, norms)  # [layer, member]
        assert norms[-1, chosen] > 0 and np.sum(norms[:, chosen] > 0) >= len(grads) // 2, (z, norms)


def test_random_scale_prior_on_conv_ffg_u_gives_finite_gradients():
    X, Y = _images(10)
    model = build_conv_bnn(
        X,
        Y,
        architecture="resnet",
        channels=2,
        posterior="ffg_u",
        prior="scale",
        num_inducing=3,
        seed=0,
    )
    with tf.GradientTape() as tape:
        elbo = model.elbo((X, Y), 2, seed=SeededNoise(1))
    grads = tape.gradient(elbo, model.trainable_variables)
    assert np.isfinite(elbo.numpy())
    assert all(
        g is not None and np.all(np.isfinite(tf.convert_to_tensor(g).numpy())) for g in grads
    )
    assert len(model.posterior.scale_posteriors) == len(model.posterior.weighted) == 8


@pytest.mark.parametrize(
    "kwargs, argument",
    [
        (dict(posterior="ffg_w"), "posterior"),
        (dict(posterior="ffg_u", num_inducing=0), "num_inducing"),
        (dict(posterior="ffg_u", lambda_init=0.5, lambda_max=0.1), "lambda_init"),
        (dict(posterior="ffg_u", sd_init=2.0), "sd_init"),
        (dict(posterior="ffg_u", num_members=3), "num_members"),
        (dict(posterior="ffg_u", rho=3.0), "rho"),
        (dict(posterior="ensemble_u", num_members=0), "num_members"),
        (dict(posterior="ensemble_u", sd_max=0.1), "sd_max"),
        (dict(posterior="ensemble_w", lambda_init=0.1), "lambda_init"),
        (dict(posterior="ffg_u", prior="spatial_iw"), "prior"),
        (dict(posterior="ensemble_w", architecture="resnet", batch_norm=True), "batch_norm"),
    ],
)
def test_bad_input_raises_naming_the_argument(kwargs, argument):
    X, Y = _images(6)
    with pytest.raises(ValueError, match=argument):
        build_conv_bnn(X, Y, **kwargs)


def test_inducing_weights_refuse_batch_norm_and_bad_stacks():
    conv = Conv2DLayer((4, 4, 1), 2, kernel_size=3)
    layers = [
        conv,
        InducingBatchNorm(conv.output_shape),
        Flatten(conv.output_shape),
        DenseLayer(32, 2),
    ]
    with pytest.raises(ValueError, match="InducingBatchNorm"):
        FFGInducingPosterior(layers, num_inducing=2)
    with pytest.raises(ValueError, match="last layer"):
        EnsembleWeightPosterior([conv])
    with pytest.raises(
        TypeError, match="DenseLayer"
    ):  # the dense families keep refusing conv stacks
        dg.posteriors.FactorisedWeightPosterior(
            [conv, Flatten(conv.output_shape), DenseLayer(32, 2)]
        )
