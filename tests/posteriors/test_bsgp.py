"""BSGP deep GPs (Rossi et al. 2021): the log prior of the whole state against a hand computation,
the per-sample kernels against a NumPy conditional, the chain over V against the exact posterior
of a one-layer model when Z and the hyperparameters are held (fixed or pinned by tight priors),
the state's moves and an exact resume, the stored samples that predictions mix over, and the
input checks."""

import math

import gpflow
import numpy as np
import pytest
import tensorflow as tf

import deepgp_gi as dg
from benchmarks.sampler_mixing import exact_posterior, oracle_problem
from deepgp_gi.families import DEEP_GP_FAMILIES
from deepgp_gi.noise import FixedNoise, SeededNoise
from deepgp_gi.posteriors.bsgp import BSGPPosterior
from deepgp_gi.training.loop import _trainable_variables


def _toy(rng, n=30, d=2):
    X = rng.normal(size=(n, d))
    return X, np.sin(X[:, :1]) + 0.1 * rng.normal(size=(n, 1))


def _normal_logpdf(x, loc, sd):
    return np.sum(-0.5 * ((x - loc) / sd) ** 2 - np.log(sd) - 0.5 * np.log(2 * np.pi))


def _se(X, Z, ell, var):
    d = ((X[:, None, :] - Z[None, :, :]) / ell) ** 2
    return var * np.exp(-0.5 * d.sum(-1))


def _random_state(post, rng, S=None):
    """A state in chain order, one value per variable (with a leading S when given)."""
    lead = [] if S is None else [S]
    out = []
    for v in post.chain_variables():
        shape = lead + v.shape.as_list()
        out.append(tf.constant(rng.normal(scale=0.5, size=shape), v.dtype))
    return out


# --------------------------------------------------------------------------- the family


def test_the_family_is_in_the_table_and_only_the_likelihood_is_adams(rng):
    X, Y = _toy(rng)
    family = DEEP_GP_FAMILIES["bsgp"]
    assert family is BSGPPosterior and family.initial_inducing_inputs(X, 6, 0) is not None
    assert set(family.options) == {
        "step_size",
        "momentum_decay",
        "window_size",
        "chain_steps",
        "inducing_prior",
        "log_lengthscale_prior",
        "log_variance_prior",
    }
    model = dg.build_deep_gp(X, Y, depth=2, posterior="bsgp", num_inducing=6, seed=0)
    reference = dg.build_deep_gp(X, Y, depth=2, posterior="sghmc", num_inducing=6, seed=0)
    post = model.posterior
    assert post.window_size == 64 and post.inducing_prior == "normal"
    assert post.log_variance_prior == (math.log(0.05), 1.0) and post.log_lengthscale_prior == (
        0.0,
        1.0,
    )
    for ours, theirs in zip(model.layers, reference.layers):
        np.testing.assert_array_equal(ours.Z.numpy(), theirs.Z.numpy())
    # the chain: V, then the layers' own Z and log-hyperparameter variables
    chain = post.chain_variables()
    assert [v.shape.as_list() for v in chain] == [[6, 2], [6, 1], [6, 2], [6, 2], [2], [2], [], []]
    assert chain[2] is model.layers[0].inducing_variable.Z.unconstrained_variable
    np.testing.assert_allclose(
        np.exp(chain[6].numpy()), model.layers[1].kernel.variance.numpy(), rtol=1e-12
    )
    assert [w.shape.as_list() for w in post.window][4] == [64, 2]
    # Adam sees the likelihood alone (the hidden layer's White nugget is fixed)
    adam = _trainable_variables(model)
    assert [id(v) for v in adam] == [id(model.likelihood.variance.unconstrained_variable)]
    assert dg.DeepGP(model.layers, model.likelihood, "bsgp").posterior.window_size == 64


def test_the_log_prior_is_the_hand_computation(rng):
    """Normal prior on V and Z, N(0, 1) on the log lengthscales, N(log 0.05, 1) on the log kernel
    variance; the determinantal prior is log det K(Z, Z) at the state's hyperparameters; a batch
    of states gives each state's value; propagate's kl is minus the log prior."""
    X, Y = _toy(rng, n=12)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="bsgp", num_inducing=5, seed=0)
    post = model.posterior
    states = _random_state(post, rng, S=3)
    got = post.log_prior(states).numpy()
    for s in range(3):
        V0, V1, Z0, Z1, l0, l1, v0, v1 = (x[s].numpy() for x in states)
        want = (
            _normal_logpdf(
                np.concatenate([V0.ravel(), V1.ravel(), Z0.ravel(), Z1.ravel()]), 0.0, 1.0
            )
            + _normal_logpdf(np.concatenate([l0, l1]), 0.0, 1.0)
            + _normal_logpdf(np.array([v0, v1]), np.log(0.05), 1.0)
        )
        np.testing.assert_allclose(got[s], want, rtol=1e-12)
        single = post.log_prior([x[s] for x in states]).numpy()
        np.testing.assert_allclose(single, want, rtol=1e-12)
    kl = post.propagate_given(X, states, 3, SeededNoise(0)).kl.numpy()
    np.testing.assert_allclose(kl, -got, rtol=1e-12)

    det = BSGPPosterior(
        model.layers,
        inducing_prior="determinantal",
        log_lengthscale_prior=(0.3, 2.0),
        log_variance_prior=(-1.0, 0.5),
    )
    state = [x[0] for x in states]
    V0, V1, Z0, Z1, l0, l1, v0, v1 = (x.numpy() for x in state)
    jitter = gpflow.config.default_jitter()
    white = model.layers[0].kernel.kernels[1].variance.numpy()  # the hidden layer's fixed nugget
    logdet = 0.0
    for Z, ell, var, w in ((Z0, l0, v0, white), (Z1, l1, v1, 0.0)):
        K = _se(Z, Z, np.exp(ell), np.exp(var)) + (w + jitter) * np.eye(5)
        logdet += np.linalg.slogdet(K)[1]
    want = (
        _normal_logpdf(np.concatenate([V0.ravel(), V1.ravel()]), 0.0, 1.0)
        + logdet
        + _normal_logpdf(np.concatenate([l0, l1]), 0.3, 2.0)
        + _normal_logpdf(np.array([v0, v1]), -1.0, 0.5)
    )
    np.testing.assert_allclose(det.log_prior(state).numpy(), want, rtol=1e-10)
    uniform = BSGPPosterior(model.layers, inducing_prior="uniform")
    np.testing.assert_allclose(
        uniform.log_prior(state).numpy() - post.log_prior(state).numpy(),
        -_normal_logpdf(np.concatenate([Z0.ravel(), Z1.ravel()]), 0.0, 1.0),
        rtol=1e-10,
    )


def test_the_flat_gaussian_prior_and_what_is_left_make_the_log_prior(rng):
    """The sampler step's split of the log prior: the Gaussian factors on the flat state
    (``gaussian_log_prior``, value and closed-form gradient) plus what ``propagate_given`` leaves
    in ``kl`` without them (the determinantal prior's log det, or nothing) equal ``log_prior``
    and its automatic gradient, for each inducing prior and non-default hyperparameter priors."""
    X, Y = _toy(rng, n=12)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="bsgp", num_inducing=5, seed=0)
    for options in (
        {},
        {"inducing_prior": "uniform"},
        {
            "inducing_prior": "determinantal",
            "log_lengthscale_prior": (0.3, 2.0),
            "log_variance_prior": (-1.0, 0.5),
        },
    ):
        post = BSGPPosterior(model.layers, **options)
        state = _random_state(post, rng)
        with tf.GradientTape() as tape:
            tape.watch(state)
            want = post.log_prior(state)
        want_grad = post.flat_state(
            tape.gradient(want, state, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        )
        theta = post.flat_state(state)
        gaussian, neg_grad = post.gaussian_log_prior(theta)
        with tf.GradientTape() as tape:
            tape.watch(state)
            rest = -post.propagate_given(X, state, 1, SeededNoise(0), gaussian_prior=False).kl[0]
        rest_grad = tape.gradient(rest, state, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        np.testing.assert_allclose((gaussian + rest).numpy(), want.numpy(), rtol=1e-12)
        np.testing.assert_allclose(
            (post.flat_state(rest_grad) - neg_grad).numpy(),
            want_grad.numpy(),
            rtol=1e-10,
            atol=1e-12,
        )
        if options.get("inducing_prior") != "determinantal":
            assert float(rest) == 0.0


def test_each_sample_has_its_own_inducing_inputs_and_kernel(rng):
    """Depth 1: the conditional of each member of a batch of states is the NumPy conditional at
    that member's V, Z, lengthscales and variance; at the chain's current state (no sample axis)
    it equals SGHMC's conditional, which reads the kernel's parameters."""
    X, Y = _toy(rng, n=9)
    model = dg.build_deep_gp(X, Y, depth=1, posterior="bsgp", num_inducing=4, seed=0)
    post = model.posterior
    states = _random_state(post, rng, S=3)
    prop = post.propagate_given(X, states, 3, SeededNoise(0))
    jitter = gpflow.config.default_jitter()
    for s in range(3):
        V, Z, ell, var = (x[s].numpy() for x in states)
        ell, var = np.exp(ell), np.exp(var)
        L = np.linalg.cholesky(_se(Z, Z, ell, var) + jitter * np.eye(4))
        A = np.linalg.solve(L, _se(Z, X, ell, var))
        np.testing.assert_allclose(prop.mean.numpy()[s], A.T @ V, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(
            prop.var.numpy()[s, :, 0], var - np.sum(A**2, axis=0), rtol=1e-9, atol=1e-12
        )
    from deepgp_gi.posteriors.sghmc import SGHMCPosterior

    current = post.chain_variables()
    ours = post.propagate_given(X, current, 2, SeededNoise(1))
    theirs = SGHMCPosterior(model.layers).propagate_given(X, current[:1], 2, SeededNoise(1))
    np.testing.assert_allclose(ours.mean.numpy(), theirs.mean.numpy(), rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(ours.var.numpy(), theirs.var.numpy(), rtol=1e-10, atol=1e-13)


def test_float32_gives_the_float64_log_prior_and_conditional(rng):
    """The same layers and state in float32 (GPflow's default float set to it) give float64's log
    prior and conditional mean and variance to float32 precision."""
    X, Y = _toy(rng, n=10)
    out = {}
    for dtype in (np.float64, np.float32):
        with gpflow.config.as_context(gpflow.config.Config(float=dtype, jitter=1e-4)):
            model = dg.build_deep_gp(
                X.astype(dtype), Y.astype(dtype), depth=1, posterior="bsgp", num_inducing=4, seed=0
            )
            post = model.posterior
            state = [tf.cast(x, dtype) for x in _random_state(post, np.random.default_rng(5), S=2)]
            prop = post.propagate_given(X.astype(dtype), state, 2, SeededNoise(0))
            assert prop.mean.dtype == dtype and post.log_prior(state).dtype == dtype
            out[dtype] = [post.log_prior(state).numpy(), prop.mean.numpy(), prop.var.numpy()]
    for a, b in zip(out[np.float64], out[np.float32]):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-5)


# --------------------------------------------------------------------------- the chain


def _oracle_problem(**options):
    """SGHMC's oracle problem for BSGP (:func:`benchmarks.sampler_mixing.oracle_problem`): depth
    1, N = 40, M = 6, Gaussian likelihood (variance 0.1) fixed; the layer is the test's to hold."""
    return oracle_problem("bsgp", hold_layer=False, **options)


def _chain_against_exact(model, X, Y, steps, num_samples, thin):
    mean, P = exact_posterior(model, X, Y)
    dg.fit(model, (X, Y), steps=steps, seed=0, progress=False)
    samples = dg.collect_samples(
        model, (X, Y), num_samples=num_samples, thin=thin, seed=0, progress=False
    )
    S = samples[0].numpy()[:, :, 0]
    z = (S.mean(axis=0) - mean) / np.sqrt(np.diag(np.linalg.inv(P)))
    return z, np.trace(P @ np.cov(S.T)) / len(mean)


@pytest.mark.slow
def test_with_z_and_hyperparameters_fixed_the_chain_samples_the_exact_posterior():
    """``set_trainable(layer, False)`` holds Z and the hyperparameters: BSGP's chain over V meets
    SGHMC's oracle (5,000 steps, 1,000 samples 10 apart): every coordinate's mean within 1 SD,
    0.5 on average, tr(P C)/M in [0.7, 1.3]; Z and the hyperparameters do not move."""
    X, Y, model = _oracle_problem()
    gpflow.set_trainable(model.layers[0], False)
    held = [v.numpy().copy() for v in model.posterior.chain_variables()[1:]]
    z, ratio = _chain_against_exact(model, X, Y, steps=5000, num_samples=1000, thin=10)
    print("z", z.round(2), "tr(PC)/M", round(ratio, 3))
    assert np.max(np.abs(z)) < 1.0 and np.mean(np.abs(z)) < 0.5, z
    assert 0.7 <= ratio <= 1.3, ratio
    for a, b in zip(held, model.posterior.chain_variables()[1:]):
        np.testing.assert_array_equal(a, b.numpy())


@pytest.mark.slow
def test_with_tight_hyperparameter_priors_the_chain_samples_the_exact_posterior():
    """Z held, the lengthscale and variance *sampled* under priors of SD 0.003 around their values:
    the hyperparameters stay within a few prior SDs and the chain over V meets the exact oracle at
    the prior means (1,000 samples 10 apart after 5,000 steps; bounds as above)."""
    probe = _oracle_problem()[2].layers[0].kernel
    log_ell, log_var = (
        float(np.log(probe.lengthscales.numpy()[0])),
        float(np.log(probe.variance.numpy())),
    )
    X, Y, model = _oracle_problem(
        inducing_prior="uniform",
        log_lengthscale_prior=(log_ell, 0.003),
        log_variance_prior=(log_var, 0.003),
    )
    gpflow.set_trainable(model.layers[0].inducing_variable, False)
    assert model.posterior.chain_moves() == [True, False, True, True]
    z, ratio = _chain_against_exact(model, X, Y, steps=5000, num_samples=1000, thin=10)
    hyper = model.posterior.sampled_state()
    ell, var = np.log(hyper["lengthscales"][0].numpy()), np.log(hyper["variances"][0].numpy())
    print(
        "z",
        z.round(2),
        "tr(PC)/M",
        round(ratio, 3),
        "log ell sd",
        ell.std(),
        "log var sd",
        var.std(),
    )
    assert ell.std() > 0 and var.std() > 0  # sampled, not held
    assert np.max(np.abs(ell - log_ell)) < 0.02 and np.max(np.abs(var - log_var)) < 0.02
    assert np.max(np.abs(z)) < 1.0 and np.mean(np.abs(z)) < 0.5, z
    assert 0.7 <= ratio <= 1.3, ratio


@pytest.mark.slow  # two traced steps (fit, collect_samples), ~15 s: `make test-all`
def test_fit_moves_the_whole_state_and_collect_samples_stores_it(rng):
    """A short fit moves V, Z and both hyperparameters of every layer that is not frozen (the
    frozen layer's Z and kernel stay), Adam moves the likelihood alone; collect_samples returns
    V and stores every part; predictions mix over the stored states, each member with its own
    Z and hyperparameters (a batch of members equals the members one by one)."""
    X, Y = _toy(rng, n=25)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="bsgp", num_inducing=5, seed=0, window_size=6)
    post = model.posterior
    gpflow.set_trainable(model.layers[0].kernel, False)
    before = [v.numpy().copy() for v in post.chain_variables()]
    noise_var = model.likelihood.variance.numpy()
    dg.fit(model, (X, Y), steps=12, seed=1, progress=False)
    after = [v.numpy() for v in post.chain_variables()]
    moved = [bool(np.all(a != b)) for a, b in zip(before, after)]
    assert moved == [True, True, True, True, False, True, False, True], moved
    assert model.likelihood.variance.numpy() != noise_var
    np.testing.assert_array_equal(post.window[3].numpy()[11 % 6], after[3])  # Z_1 in the window

    samples = dg.collect_samples(model, (X, Y), num_samples=3, thin=2, seed=0, progress=False)
    assert [s.shape.as_list() for s in samples] == [[3, 5, 2], [3, 5, 1]]
    state = post.sampled_state()
    assert [z.shape.as_list() for z in state["inducing_inputs"]] == [[3, 5, 2], [3, 5, 2]]
    assert (
        len({float(v) for v in state["variances"][1].numpy()}) == 3
    )  # a sampled variance per sample
    np.testing.assert_array_equal(
        state["inducing_inputs"][1][-1].numpy(), model.layers[1].Z.numpy()
    )
    members = post._drawn_members(4, SeededNoise(2))

    def zero_noise(S):  # the hidden layer at its conditional mean: every output deterministic
        return FixedNoise({"f/0": np.zeros((S, 25, 2)), "f/1": np.zeros((S, 25, 1))})

    batch = post.propagate_given(X, members, 4, zero_noise(4))
    for s in range(4):
        one = post.propagate_given(X, [m[s] for m in members], 1, zero_noise(1))
        np.testing.assert_allclose(
            one.samples[0].numpy()[0], batch.samples[0].numpy()[s], rtol=1e-9, atol=1e-12
        )
        np.testing.assert_allclose(
            one.mean.numpy()[0], batch.mean.numpy()[s], rtol=1e-9, atol=1e-12
        )
        np.testing.assert_allclose(one.var.numpy()[0], batch.var.numpy()[s], rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(one.kl.numpy()[0], batch.kl.numpy()[s], rtol=1e-12)
    means = batch.mean.numpy()  # the 4 draws from 3 stored states: at least two distinct members
    assert max(np.abs(means[s] - means[t]).max() for s in range(4) for t in range(s)) > 1e-6
    lpd = model.predict_log_density((X, Y), num_samples=8, seed=3).numpy()
    mean, var = model.predict_f_components(X, num_samples=8, seed=3)
    sd = np.sqrt(var.numpy()[..., 0] + model.likelihood.variance.numpy())
    comp = (
        -0.5 * np.log(2 * np.pi) - np.log(sd) - 0.5 * ((Y[:, 0] - mean.numpy()[..., 0]) / sd) ** 2
    )
    np.testing.assert_allclose(lpd, np.logaddexp.reduce(comp, axis=0) - np.log(8), rtol=1e-10)


@pytest.mark.slow  # three fits with checkpoints, one compiled: `make test-all`
def test_a_resumed_chain_ends_where_an_uninterrupted_one_ends_and_the_step_compiles(rng, tmp_path):
    X, Y = _toy(rng)

    def build():
        return dg.build_deep_gp(
            X, Y, depth=2, posterior="bsgp", num_inducing=6, seed=0, window_size=8
        )

    def state(model):
        return [v.numpy() for v in model.posterior.sampler_variables()] + [
            v.numpy() for v in model.trainable_variables
        ]

    straight = build()
    h_straight = dg.fit(
        straight, (X, Y), steps=20, batch_size=15, seed=4, progress=False, log_every=5
    )
    dg.fit(
        build(),
        (X, Y),
        steps=10,
        batch_size=15,
        seed=4,
        progress=False,
        log_every=5,
        checkpoint_dir=tmp_path,
        checkpoint_every=5,
    )
    fresh = build()
    h_resumed = dg.fit(
        fresh,
        (X, Y),
        steps=20,
        batch_size=15,
        seed=4,
        progress=False,
        log_every=5,
        checkpoint_dir=tmp_path,
        checkpoint_every=5,
    )
    assert h_resumed.resumed_from == 10
    for a, b in zip(state(straight), state(fresh)):
        np.testing.assert_array_equal(a, b)
    assert h_resumed.elbo == h_straight.elbo

    compiled = build()
    dg.fit(compiled, (X, Y), steps=20, batch_size=15, seed=4, progress=False, jit_compile=True)
    for a, b in zip(state(straight), state(compiled)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-9)


def test_bad_options_are_refused_naming_the_argument(rng):
    X, Y = _toy(rng, n=15)
    with pytest.raises(
        ValueError,
        match="does not accept option.*inducing_priors.*accepted options: step_size, "
        "momentum_decay, window_size, chain_steps, inducing_prior, log_lengthscale_prior, "
        "log_variance_prior",
    ):
        dg.build_deep_gp(X, Y, depth=1, posterior="bsgp", num_inducing=4, inducing_priors="normal")
    with pytest.raises(ValueError, match="inducing_prior.*strauss.*normal.*uniform.*determinantal"):
        dg.build_deep_gp(X, Y, depth=1, posterior="bsgp", num_inducing=4, inducing_prior="strauss")
    for bad in ((0.0, 0.0), (0.0,), "wide", (float("nan"), 1.0)):
        with pytest.raises(ValueError, match="log_lengthscale_prior must be a \\(mean, sd\\) pair"):
            dg.build_deep_gp(
                X, Y, depth=1, posterior="bsgp", num_inducing=4, log_lengthscale_prior=bad
            )
    with pytest.raises(ValueError, match="log_variance_prior must be"):
        dg.build_deep_gp(
            X, Y, depth=1, posterior="bsgp", num_inducing=4, log_variance_prior=(0.0, -1.0)
        )
    with pytest.raises(
        ValueError, match="lengthscales has the transform .*needs the exp transform"
    ):
        dg.build_deep_gp(
            X, Y, depth=1, posterior="bsgp", num_inducing=4, positive_transform="softplus"
        )
    layer = dg.GPLayer(
        gpflow.kernels.RationalQuadratic(), output_dim=1, input_dim=2, inducing_inputs=X[:4]
    )
    with pytest.raises(TypeError, match="layers\\[0\\].kernel is RationalQuadratic; BSGP samples"):
        dg.DeepGP([layer], gpflow.likelihoods.Gaussian(), "bsgp")
    model = dg.build_deep_gp(X, Y, depth=1, posterior="bsgp", num_inducing=4, seed=0)
    with pytest.raises(ValueError, match="natgrad_gamma does not apply to a sampling posterior"):
        dg.fit(model, (X, Y), steps=1, natgrad_gamma=0.1, progress=False)
    with pytest.raises(ValueError, match="thin must be at least 1"):
        dg.collect_samples(model, (X, Y), thin=0, progress=False)


@pytest.mark.slow  # two fits, each traced anew: `make test-all`
def test_with_two_chain_steps_the_kernel_moves_every_step_and_the_likelihood_every_second(rng):
    X, Y = _toy(rng)

    def after(steps):
        model = dg.build_deep_gp(
            X, Y, depth=1, posterior="bsgp", num_inducing=4, seed=0, chain_steps=2
        )
        if steps:
            dg.fit(model, (X, Y), steps=steps, seed=0, progress=False)
        kernel = model.layers[0].kernel
        return (
            kernel.lengthscales.numpy().copy(),
            float(model.likelihood.variance.numpy()),
            int(model.posterior.window_count.numpy()),
        )

    (l0, n0, c0), (l1, n1, c1), (l2, n2, c2) = after(0), after(1), after(2)
    assert not np.allclose(l0, l1) and not np.allclose(l1, l2)  # sampled at every step
    assert n0 == n1 != n2  # Adam at the iteration's end only
    assert (c0, c1, c2) == (0, 0, 1)
