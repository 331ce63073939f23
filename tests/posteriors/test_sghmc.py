"""SGHMC deep GPs (Havasi et al. 2018): the scale-adapted update against a NumPy transcription of
Springenberg et al. (2016), the chain against the exact posterior of a one-layer model (mean and
covariance, so a chain at the wrong temperature fails), the state's place (never Adam's, in the
checkpoint), the sample set predictions use, and the input checks."""

import gpflow
import numpy as np
import pytest
import tensorflow as tf

import deepgp_gi as dg
from benchmarks.sampler_mixing import exact_posterior, oracle_problem
from deepgp_gi.families import DEEP_GP_FAMILIES
from deepgp_gi.noise import FixedNoise, SeededNoise
from deepgp_gi.posteriors.sghmc import (
    ROSSI_CHAIN_STEPS,
    SamplerState,
    SGHMCPosterior,
    chain_step_roles,
    scale_adapted_sghmc,
)
from deepgp_gi.training.loop import _trainable_variables


def _toy(rng, n=40, d=2):
    X = rng.normal(size=(n, d))
    return X, np.sin(X[:, :1]) + 0.1 * rng.normal(size=(n, 1))


# --------------------------------------------------------------------------- the exact oracle


def _oracle_problem():
    """Depth 1, N = 40, M = 6, Gaussian likelihood (variance 0.1), hyperparameters and inducing
    inputs fixed (:func:`benchmarks.sampler_mixing.oracle_problem`)."""
    return oracle_problem("sghmc")


def _chain_against_exact(steps, num_samples, thin, batch_size=None, seed=0, collect_step=None):
    X, Y, model = _oracle_problem()
    mean, P = exact_posterior(model, X, Y)
    dg.fit(model, (X, Y), steps=steps, seed=seed, batch_size=batch_size, progress=False)
    samples = dg.collect_samples(
        model,
        (X, Y),
        num_samples=num_samples,
        thin=thin,
        seed=seed,
        batch_size=batch_size,
        progress=False,
        step_size=collect_step,
    )
    S = samples[0].numpy()[:, :, 0]
    z = (S.mean(axis=0) - mean) / np.sqrt(np.diag(np.linalg.inv(P)))
    temperature_ratio = np.trace(P @ np.cov(S.T)) / len(mean)  # 1 at temperature 1, ~1/N at 1/N
    return z, temperature_ratio, S


def _variance_ratios(S, P):
    """The samples' variance along each eigen-direction of the exact covariance ``P^-1``, over the
    exact variance there (1 everywhere for exact samples)."""
    variances, directions = np.linalg.eigh(np.linalg.inv(P))
    return np.var((S - S.mean(axis=0)) @ directions, axis=0) / variances


def test_the_chain_samples_the_exact_posterior_quickly():
    """Fast variant: fewer steps, looser bounds; a chain at temperature 1/N (tr(P C)/M ~ 0.025)
    or one that does not move towards the posterior fails."""
    z, ratio, _ = _chain_against_exact(steps=1000, num_samples=200, thin=5)
    assert 0.4 < ratio < 2.5, ratio
    assert np.mean(np.abs(z)) < 2.0 and np.max(np.abs(z)) < 5.0, z


@pytest.mark.slow
def test_the_chain_samples_the_exact_posterior():
    """Default sampler settings, 5,000 steps, 1,000 samples 10 apart, N = 40, M = 6."""
    z, ratio, _ = _chain_against_exact(steps=5000, num_samples=1000, thin=10)
    assert np.max(np.abs(z)) < 1.0 and np.mean(np.abs(z)) < 0.5, z
    assert 0.7 <= ratio <= 1.3, ratio


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_collection_step_of_003_samples_every_direction_of_the_exact_posterior(seed):
    """5,000 training steps at the default step 0.01, then 1,000 samples 10 apart with the
    collection step 0.03: every coordinate's mean within 1 posterior SD (0.5 on average) and the
    variance along every eigen-direction of the exact covariance within [0.6, 1.5] of the exact
    one. At 0.01 the weakest direction (precision 1.2 against 504 for the strongest) relaxes over
    hundreds of steps and its variance over 10,000 steps scatters from 0.46 to 1.4 of the exact
    one between seeds (docs/sampling.md, "Mixing")."""
    X, Y, model = _oracle_problem()
    _, P = exact_posterior(model, X, Y)
    z, _, S = _chain_against_exact(5000, 1000, 10, seed=seed, collect_step=0.03)
    ratios = _variance_ratios(S, P)
    assert np.max(np.abs(z)) < 1.0 and np.mean(np.abs(z)) < 0.5, z
    assert np.all((ratios >= 0.6) & (ratios <= 1.5)), ratios


@pytest.mark.slow
def test_a_minibatch_chain_samples_the_full_batch_posterior():
    """Batches of 10 of the 40 points sample the same posterior as the full batch.

    With the default step size the weakly determined directions of V (precision ~1, against ~500
    for the strongest) mix slowly, over thousands of steps (the diagonal preconditioner is set by
    the strong directions' gradients), so each chain's mean carries a Monte Carlo error of a few
    tenths of a posterior SD there. The two chains share their seed, so their momentum noise is
    the same draw at every step and they differ only by the minibatch gradients: their means must
    agree closely (a minibatch-specific bias would show here), each must be near the exact mean,
    and both covariances must give tr(P C)/M in [0.7, 1.3] (a likelihood term scaled by 1 instead
    of N / B would give about 3)."""
    z_mini, ratio_mini, _ = _chain_against_exact(
        steps=5000, num_samples=1000, thin=10, batch_size=10
    )
    z_full, ratio_full, _ = _chain_against_exact(steps=5000, num_samples=1000, thin=10)
    print("minibatch z", z_mini.round(2), "tr(PC)/M", round(ratio_mini, 3))
    print("full batch z", z_full.round(2), "tr(PC)/M", round(ratio_full, 3))
    assert np.mean(np.abs(z_mini - z_full)) < 0.5 and np.max(np.abs(z_mini - z_full)) < 0.75, (
        z_mini,
        z_full,
    )
    assert np.mean(np.abs(z_mini)) < 1.0 and np.max(np.abs(z_mini)) < 1.5, z_mini
    assert 0.7 <= ratio_mini <= 1.3 and 0.7 <= ratio_full <= 1.3, (ratio_mini, ratio_full)


# --------------------------------------------------------------------------- chain steps


def test_rossis_schedule_has_eleven_adapting_steps_and_one_hyperparameter_step():
    roles = [chain_step_roles(t, ROSSI_CHAIN_STEPS) for t in range(2 * ROSSI_CHAIN_STEPS)]
    assert sum(adapts for adapts, _ in roles[:ROSSI_CHAIN_STEPS]) == 11
    assert [t for t, (_, ends) in enumerate(roles) if ends] == [20, 41]
    assert roles[:4] == [(True, False), (True, False), (False, False), (True, False)]
    assert roles[21:23] == [(True, False), (True, False)]
    assert all(chain_step_roles(t, 1) == (True, True) for t in range(5))


@pytest.mark.slow  # four fits, each traced anew: `make test-all`
def test_chain_steps_move_the_chain_every_step_and_the_rest_once_per_iteration(rng):
    """``chain_steps=3``: the chain moves at every step; the statistics keep still at the plain
    step (position 2); the window and the hyperparameters change only at an iteration's end."""
    X, Y = _toy(rng)

    def after(steps):
        model = dg.build_deep_gp(
            X, Y, depth=1, posterior="sghmc", num_inducing=4, seed=0, chain_steps=3
        )
        post = model.posterior
        if steps:
            dg.fit(model, (X, Y), steps=steps, seed=0, progress=False)
        return dict(
            V=post.inducing_outputs[0].numpy().copy(),
            xi=post.adaptation_window[0].numpy().copy(),
            count=int(post.window_count.numpy()),
            noise=float(model.likelihood.variance.numpy()),
        )

    s = [after(k) for k in range(5)]
    for k in range(4):
        assert not np.allclose(s[k]["V"], s[k + 1]["V"]), k
    assert not np.array_equal(s[1]["xi"], s[2]["xi"])  # step 1 adapts
    np.testing.assert_array_equal(s[2]["xi"], s[3]["xi"])  # step 2 does not
    assert [x["count"] for x in s] == [0, 0, 0, 1, 1]
    assert s[0]["noise"] == s[1]["noise"] == s[2]["noise"] != s[3]["noise"] == s[4]["noise"]
    with pytest.raises(ValueError, match="chain_steps must be at least 1"):
        dg.build_deep_gp(X, Y, depth=1, posterior="sghmc", num_inducing=4, chain_steps=0)


# --------------------------------------------------------------------------- the update


def _springenberg_numpy(theta0, grad_U, zs, *, eps, alpha, N, adapt_steps):
    """Springenberg et al. (2016), eqs. 10-13, in terms of the full-data potential U: with
    ``eps V^-1/2 C = alpha``,
    ``v <- v - eps^2 V^-1/2 grad U - alpha v + N(0, 2 eps^2 alpha V^-1/2)``, ``theta <- theta + v``,
    ``V`` (and the window ``tau``) estimated from ``grad U`` by the exponential average with
    ``1 / (tau + 1)``, from the statistics before each step. Statistics of ``grad U`` start at ``N``
    and ``N^2`` (the code starts the per-point ones at 1)."""
    theta = theta0.copy()
    v = np.zeros_like(theta)
    tau, g, g2 = np.ones_like(theta), N * np.ones_like(theta), N**2 * np.ones_like(theta)
    out = []
    for t, z in enumerate(zs):
        d = grad_U(theta)
        v_hat_inv_sqrt = 1.0 / np.sqrt(g2)
        v = (
            v
            - eps**2 * v_hat_inv_sqrt * d
            - alpha * v
            + np.sqrt(2 * eps**2 * alpha * v_hat_inv_sqrt) * z
        )
        theta = theta + v
        if t < adapt_steps:
            r = 1.0 / (tau + 1.0)
            tau, g, g2 = (
                1.0 + tau * (1.0 - g * g / g2),
                (1 - r) * g + r * d,
                (1 - r) * g2 + r * d * d,
            )
        out.append(theta.copy())
    return np.array(out)


def test_the_scale_adapted_update_is_springenbergs_step_for_step():
    """On a quadratic U(V) = N/2 (V - c)^T Q (V - c) + |V|^2 / 2, the posterior's steps (per-point
    gradient, noise eps / sqrt(N)) equal Springenberg's update in U to rounding, with adaptation
    for 30 steps and without for 20."""
    rng = np.random.default_rng(1)
    M, D, N = 4, 2, 50
    B = rng.normal(size=(M, M))
    Q = B @ B.T / M + np.eye(M)
    c = rng.normal(size=(M, D))

    def grad_U(V):
        return N * Q @ (V - c) + V

    layer = dg.GPLayer(
        gpflow.kernels.SquaredExponential(),
        output_dim=D,
        input_dim=1,
        inducing_inputs=np.linspace(-1, 1, M)[:, None],
    )
    posterior = SGHMCPosterior([layer], step_size=0.05, momentum_decay=0.1, window_size=7)
    V0 = rng.normal(size=(M, D))
    posterior.inducing_outputs[0].assign(V0)
    zs = rng.normal(size=(50, M, D))
    got = []
    for t, z in enumerate(zs):
        V = posterior.inducing_outputs[0].numpy()
        grad_per_point = grad_U(V) / N
        posterior.sghmc_step(
            [tf.constant(grad_per_point)],
            FixedNoise({"sghmc/move": z.reshape(-1)}),
            N,
            adapt=t < 30,
        )
        got.append(posterior.inducing_outputs[0].numpy())
    want = _springenberg_numpy(V0, grad_U, zs, eps=0.05, alpha=0.1, N=N, adapt_steps=30)
    np.testing.assert_allclose(np.array(got), want, rtol=1e-9, atol=1e-12)
    # the window holds the last 7 states, oldest overwritten first
    assert int(posterior.window_count.numpy()) == 50
    window = posterior.window[0].numpy()
    for k in range(43, 50):
        np.testing.assert_array_equal(window[k % 7], got[k])


def _quadratic_chain(loss_scale, *, N=100, K=200, burn=1000, steps=7000, measure_from=3000, seed=0):
    """``K`` independent coordinates with target ``N(c, 1 / P)``, ``P = N q + 1``: the chain fed the
    gradient of ``loss_scale * U`` (``1 / N``: the per-point loss the update expects; ``1``: the
    summed loss), noise for the per-point loss, adapting for ``burn`` steps (as ``fit``) and then
    not (as ``collect_samples``; while the statistics adapt, the preconditioner depends on the
    recent states and the chain is not exact). Returns ``mean((theta - c)^2 P)`` from
    ``measure_from`` on: 1 at temperature 1."""
    rng = np.random.default_rng(seed)
    q = rng.uniform(0.5, 2.0, size=K)
    c = rng.normal(size=K)
    P = N * q + 1.0
    state = SamplerState(
        *(tf.constant(v) for v in (np.zeros(K), np.zeros(K), np.ones(K), np.ones(K), np.ones(K)))
    )
    zs = tf.constant(rng.normal(size=(steps, K)))

    @tf.function(autograph=False)
    def run(state, zs):
        def body(t, theta, p, xi, g, g2, acc):
            state = SamplerState(theta, p, xi, g, g2)
            grad = loss_scale * P * (theta - c)
            options = dict(step_size=0.01, momentum_decay=0.05, num_data=N)
            adapted = scale_adapted_sghmc(state, grad, zs[t], adapt=True, **options)
            fixed = scale_adapted_sghmc(state, grad, zs[t], adapt=False, **options)
            new = [tf.where(t < burn, a, b) for a, b in zip(adapted, fixed)]
            acc = acc + tf.where(t >= measure_from, tf.reduce_mean(tf.square(new[0] - c) * P), 0.0)
            return (t + 1,) + tuple(new) + (acc,)

        out = tf.while_loop(
            lambda t, *_: t < steps,
            body,
            (tf.constant(0),) + tuple(state) + (tf.constant(0.0, tf.float64),),
        )
        return out[-1] / (steps - measure_from)

    return float(run(state, zs))


def test_a_chain_fed_the_summed_loss_samples_at_temperature_one_over_n():
    """The public port's error (the summed loss with the per-point loss's noise) gives
    ``E[(theta - c)^2 P] ~ 1 / N``; the update as used (per-point loss) gives 1."""
    assert 0.88 < _quadratic_chain(1.0 / 100) < 1.12
    assert _quadratic_chain(1.0) < 0.03


def test_the_update_without_adaptation_keeps_the_statistics():
    state = SamplerState(*(tf.constant(np.full((3, 2), v)) for v in (0.5, 0.1, 2.0, 0.3, 4.0)))
    grad, z = tf.constant(np.full((3, 2), 0.7)), tf.constant(np.full((3, 2), -1.0))
    new = scale_adapted_sghmc(
        state, grad, z, step_size=0.01, momentum_decay=0.05, num_data=10, adapt=False
    )
    for a, b in zip(new[2:], state[2:]):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    p = (
        0.1 - 1e-4 * 0.5 * 0.7 - 0.05 * 0.1 + np.sqrt(2 * 1e-4 / 10 * 0.05 * 0.5) * -1.0
    )  # Minv = 1/sqrt(4)
    np.testing.assert_allclose(new.p.numpy(), p, rtol=1e-12)
    np.testing.assert_allclose(new.theta.numpy(), 0.5 + p, rtol=1e-12)


# --------------------------------------------------------------------------- the family and fit


def test_the_family_is_in_the_table_and_builds_the_usual_layers(rng):
    X, Y = _toy(rng)
    family = DEEP_GP_FAMILIES["sghmc"]
    assert family is SGHMCPosterior and family.initial_inducing_inputs(X, 7, 0) is not None
    assert set(family.options) == {"step_size", "momentum_decay", "window_size", "chain_steps"}
    model = dg.build_deep_gp(
        X, Y, depth=2, posterior="sghmc", num_inducing=7, seed=0, window_size=5
    )
    reference = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=7, seed=0)
    for ours, theirs in zip(model.layers, reference.layers):
        np.testing.assert_array_equal(ours.Z.numpy(), theirs.Z.numpy())
    post = model.posterior
    assert [v.shape.as_list() for v in post.inducing_outputs] == [[7, 2], [7, 1]]
    assert [w.shape.as_list() for w in post.window] == [[5, 7, 2], [5, 7, 1]]
    assert not any(v.trainable for v in post.sampler_variables())
    # DeepGP(layers, lik, "sghmc") builds it with the defaults
    by_name = dg.DeepGP(model.layers, model.likelihood, "sghmc")
    assert by_name.posterior.window_size == 100 and by_name.posterior.step_size == 0.01
    # the count is one sample's state and the layers' inducing inputs (not momenta, window, samples)
    assert dg.parameter_count(model, per_layer=True) == {
        "layer_0": 7 * 2 + 7 * 2,
        "layer_1": 7 * 1 + 7 * 2,
        "shared": 0,
        "total": 49,
    }
    assert "window_count" in gpflow.utilities.tabulate_module_summary(model)


def test_shared_fixed_terms_and_the_flat_prior_give_the_plain_pass(rng):
    """A pass with the state-free terms computed once (``fixed_terms``: the K_uu factors and the
    first layer's projection) equals the plain pass on the same noise, and the flat state's
    Gaussian log prior and its closed-form gradient equal ``log_prior`` and its automatic one."""
    X, Y = _toy(rng, n=15)
    model = dg.build_deep_gp(X, Y, depth=3, posterior="sghmc", num_inducing=5, seed=0)
    post = model.posterior
    V = [tf.constant(rng.normal(size=v.shape), tf.float64) for v in post.inducing_outputs]
    noise = FixedNoise(
        {
            f"f/{l}": rng.normal(size=(2, 15, layer.output_dim))
            for l, layer in enumerate(model.layers)
        }
    )
    plain = post.propagate_given(X, V, 2, noise)
    shared = post.propagate_given(
        X, V, 2, noise, fixed=post.fixed_terms(X, 2), gaussian_prior=False
    )
    for a, b in zip(
        plain.samples + [plain.mean, plain.var], shared.samples + [shared.mean, shared.var]
    ):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(shared.kl.numpy(), np.zeros(2))
    with tf.GradientTape() as tape:
        tape.watch(V)
        want = post.log_prior(V)
    log_prior, neg_grad = post.gaussian_log_prior(post.flat_state(V))
    np.testing.assert_allclose(log_prior.numpy(), want.numpy(), rtol=1e-12)
    np.testing.assert_allclose(
        -neg_grad.numpy(), post.flat_state(tape.gradient(want, V)).numpy(), rtol=1e-12
    )


def test_the_sampler_step_holds_no_host_synchronising_op(rng):
    """As every family's Adam step (tests/test_step_graph.py): no Assert, If, While, CheckNumerics,
    Where, ... in the traced SGHMC + Adam step."""
    from deepgp_gi import linalg
    from deepgp_gi.training.step import SamplerStep

    sync = {
        "Assert",
        "Print",
        "PrintV2",
        "If",
        "StatelessIf",
        "While",
        "StatelessWhile",
        "PyFunc",
        "PyFuncStateless",
        "EagerPyFunc",
        "CheckNumerics",
        "CheckNumericsV2",
        "Where",
        "Unique",
        "UniqueV2",
        "DynamicPartition",
    }
    X, Y = _toy(rng, n=20)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="sghmc", num_inducing=5, seed=0)
    variables = _trainable_variables(model)
    step = SamplerStep(
        model,
        dg.training.adam(0.01, variables),
        variables,
        tf.Variable(0, dtype=tf.int64),
        num_samples=1,
        seed=0,
    )
    with linalg.accelerator_branch():
        graph = step._compiled.get_concrete_function(
            tf.constant(0, tf.int64), tf.constant(X), tf.constant(Y), step.kl_weight_tensor(1.0)
        ).graph.as_graph_def()
    ops = [node.op for node in graph.node] + [
        n.op for f in graph.library.function for n in f.node_def
    ]
    assert "Cholesky" in ops and "ResourceScatterNdUpdate" in ops
    assert not sync & set(ops), sync & set(ops)


def test_the_chain_is_never_adams(rng):
    X, Y = _toy(rng)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="sghmc", num_inducing=6, seed=0)
    chain = {id(v) for v in model.posterior.sampler_variables()}
    assert not any(id(v) in chain for v in _trainable_variables(model))
    gpflow.set_trainable(model, True)  # even then: the chain is not the optimiser's
    assert any(id(v) in chain for v in model.trainable_variables)
    assert not any(id(v) in chain for v in _trainable_variables(model))


def test_a_checkpoint_with_per_variable_momenta_and_statistics_fails_to_resume(rng, tmp_path):
    """The momenta and adaptation statistics are one flat vector each over the chain variables; a
    checkpoint of the earlier layout (one per chain variable) is refused, not half restored."""
    X, Y = _toy(rng)

    def build():
        return dg.build_deep_gp(
            X, Y, depth=2, posterior="sghmc", num_inducing=6, seed=0, window_size=8
        )

    old = build()
    post = old.posterior
    for name, value in (
        ("momenta", 0.0),
        ("adaptation_window", 1.0),
        ("gradient_mean", 1.0),
        ("gradient_square", 1.0),
    ):
        setattr(
            post,
            name,
            [
                tf.Variable(tf.fill(v.shape, tf.constant(value, tf.float64)), trainable=False)
                for v in post.chain_variables()
            ],
        )
    tf.train.Checkpoint(model=old, step=tf.Variable(5, dtype=tf.int64)).save(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match="does not match this run's model"):
        dg.fit(
            build(),
            (X, Y),
            steps=10,
            batch_size=15,
            seed=4,
            progress=False,
            checkpoint_dir=tmp_path,
            checkpoint_every=5,
        )


# three fits with checkpoints: `make test-all` (fit drives the chain in make test too)
@pytest.mark.slow
def test_fit_moves_the_chain_and_a_resumed_chain_ends_where_an_uninterrupted_one_ends(
    rng, tmp_path
):
    """Each step moves every layer's V and adapts the statistics, Adam moves the hyperparameters
    that are not frozen (``set_trainable(layer, False)`` freezes a layer's, not its V); a run
    resumed from a checkpoint on a fresh model ends bit for bit where an uninterrupted one ends
    (momenta, statistics, window, V, hyperparameters, the logged log joint)."""
    X, Y = _toy(rng)

    def build():
        model = dg.build_deep_gp(
            X, Y, depth=2, posterior="sghmc", num_inducing=6, seed=0, window_size=8
        )
        gpflow.set_trainable(model.layers[0], False)
        return model

    def state(model):
        return [v.numpy() for v in model.posterior.sampler_variables()] + [
            v.numpy() for v in model.trainable_variables
        ]

    straight = build()
    Z_0, kernel_1 = straight.layers[0].Z.numpy().copy(), straight.layers[1].kernel.variance.numpy()
    h_straight = dg.fit(
        straight, (X, Y), steps=20, batch_size=15, seed=4, progress=False, log_every=5
    )
    assert len(h_straight.elbo) == 4 and np.all(np.isfinite(h_straight.elbo))
    post = straight.posterior
    assert all(np.all(v.numpy() != 0) for v in post.inducing_outputs)  # both layers' V moved
    assert all(np.all(s.numpy() != 1.0) for s in post.gradient_square)  # adapted
    assert int(post.window_count.numpy()) == 20
    np.testing.assert_array_equal(post.window[1].numpy()[19 % 8], post.inducing_outputs[1].numpy())
    np.testing.assert_array_equal(straight.layers[0].Z.numpy(), Z_0)  # frozen
    assert straight.layers[1].kernel.variance.numpy() != kernel_1  # Adam's

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
    fresh.posterior.store_samples([tf.ones([3, 6, 2], tf.float64), tf.ones([3, 6, 1], tf.float64)])
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
    assert (
        fresh.posterior.num_stored == 0
    )  # fit discards a stored set (drawn under other hyperparameters)
    for a, b in zip(state(straight), state(fresh)):
        np.testing.assert_array_equal(a, b)
    assert h_resumed.elbo == h_straight.elbo


def test_collect_samples_stores_the_set_that_predictions_mix_over(rng):
    X, Y = _toy(rng, n=30)
    model = dg.build_deep_gp(
        X, Y, depth=2, posterior="sghmc", num_inducing=5, seed=0, window_size=6
    )
    post = model.posterior
    # before any step: the chain's current state
    drawn = post._drawn_members(4, SeededNoise(0))
    np.testing.assert_array_equal(drawn[1].numpy(), np.zeros((4, 5, 1)))
    # a window of 4 states (as fit leaves it): predictions draw its members
    for k in range(4):
        for V in post.inducing_outputs:
            V.assign(rng.normal(size=V.shape))
        post.push_window()
    window = [w.numpy() for w in post.window]
    drawn = post._drawn_members(40, SeededNoise(1))
    hits = [
        int(np.flatnonzero(np.abs(window[0] - m).max(axis=(1, 2)) == 0)[0])
        for m in drawn[0].numpy()
    ]
    assert set(hits) == {0, 1, 2, 3}
    for g2 in post.gradient_square:
        g2.assign(rng.uniform(0.5, 2.0, size=g2.shape))
    g2 = [v.numpy().copy() for v in post.gradient_square]
    hypers = [v.numpy().copy() for v in model.trainable_variables]

    samples = dg.collect_samples(model, (X, Y), num_samples=3, thin=4, seed=0, progress=False)
    assert [s.shape.as_list() for s in samples] == [[3, 5, 2], [3, 5, 1]]
    assert post.num_stored == 3
    for a, b in zip(hypers, model.trainable_variables):
        np.testing.assert_array_equal(a, b.numpy())  # hyperparameters frozen
    for a, b in zip(g2, post.gradient_square):
        np.testing.assert_array_equal(a, b.numpy())  # adaptation off
    assert int(post.window_count.numpy()) == 4 + 12
    np.testing.assert_array_equal(
        samples[1][-1].numpy(), post.inducing_outputs[1].numpy()
    )  # the last state
    drawn = post._drawn_members(60, SeededNoise(2))
    hits = [
        int(np.flatnonzero(np.abs(samples[0].numpy() - m).max(axis=(1, 2)) == 0)[0])
        for m in drawn[0].numpy()
    ]
    assert set(hits) == {0, 1, 2}  # uniform over the stored samples, each one drawn
    # the model's predictions mix over them: the log density is the logsumexp of their components
    lpd = model.predict_log_density((X, Y), num_samples=8, seed=3).numpy()
    mean, var = model.predict_f_components(X, num_samples=8, seed=3)
    sd = np.sqrt(var.numpy()[..., 0] + model.likelihood.variance.numpy())
    comp = (
        -0.5 * np.log(2 * np.pi) - np.log(sd) - 0.5 * ((Y[:, 0] - mean.numpy()[..., 0]) / sd) ** 2
    )
    np.testing.assert_allclose(lpd, np.logaddexp.reduce(comp, axis=0) - np.log(8), rtol=1e-10)
    assert [s.shape.as_list() for s in model.sample_layers(X, 4, seed=0)] == [
        [4, 30, 2],
        [4, 30, 1],
    ]
    assert np.isfinite(dg.metrics.test_log_likelihood(model, X, Y, 1.0))


def test_bad_input_is_refused_before_anything_runs(rng):
    X, Y = _toy(rng, n=20)
    variational = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=5, seed=0)
    with pytest.raises(
        ValueError, match="collect_samples needs a sampling posterior.*MeanFieldPosterior"
    ):
        dg.collect_samples(variational, (X, Y), progress=False)
    model = dg.build_deep_gp(X, Y, depth=1, posterior="sghmc", num_inducing=5, seed=0)
    for bad in (0, -3):
        with pytest.raises(ValueError, match="num_samples must be at least 1"):
            dg.collect_samples(model, (X, Y), num_samples=bad, progress=False)
        with pytest.raises(ValueError, match="thin must be at least 1"):
            dg.collect_samples(model, (X, Y), thin=bad, progress=False)
    with pytest.raises(TypeError, match="thin must be an integer"):
        dg.collect_samples(model, (X, Y), thin=2.5, progress=False)
    with pytest.raises(ValueError, match="step_size must be a positive finite number"):
        dg.collect_samples(model, (X, Y), step_size=0.0, progress=False)
    with pytest.raises(ValueError, match=r"momentum_decay must be in \(0, 1\]"):
        dg.collect_samples(model, (X, Y), momentum_decay=1.5, progress=False)
    with pytest.raises(ValueError, match="num_hidden_samples must be at least 1"):
        dg.collect_samples(model, (X, Y), num_hidden_samples=0, progress=False)
    with pytest.raises(ValueError, match="natgrad_gamma does not apply to a sampling posterior"):
        dg.fit(model, (X, Y), steps=1, natgrad_gamma=0.1, progress=False)
    with pytest.raises(ValueError, match="kl_schedule does not apply to a sampling posterior"):
        dg.fit(model, (X, Y), steps=1, kl_schedule="linear", progress=False)
    assert int(model.posterior.window_count.numpy()) == 0 and not np.any(
        model.posterior.inducing_outputs[0].numpy()
    )
    with pytest.raises(
        ValueError,
        match="does not accept option.*step_sise.*accepted options: step_size, "
        "momentum_decay, window_size",
    ):
        dg.build_deep_gp(X, Y, depth=1, posterior="sghmc", num_inducing=5, step_sise=0.1)
    with pytest.raises(ValueError, match="step_size must be a positive"):
        dg.build_deep_gp(X, Y, depth=1, posterior="sghmc", num_inducing=5, step_size=0.0)
    with pytest.raises(ValueError, match="momentum_decay must be in"):
        dg.build_deep_gp(X, Y, depth=1, posterior="sghmc", num_inducing=5, momentum_decay=1.5)
    with pytest.raises(ValueError, match="window_size must be at least 1"):
        dg.build_deep_gp(X, Y, depth=1, posterior="sghmc", num_inducing=5, window_size=0)
