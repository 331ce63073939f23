"""KL tempering: fit(..., kl_schedule=...) maximises E[log p(y|f)] - beta * KL and reports the
untempered ELBO; the schedules, the compiled step, resuming and the argument checks."""

import json

import gpflow
import numpy as np
import pytest
import tensorflow as tf

import deepgp_gi as dg
from deepgp_gi.likelihoods import expected_log_likelihood
from deepgp_gi.training import ConstantSchedule, LinearSchedule, PaperSchedule, batch_indices
from deepgp_gi.training.batches import step_noise
from deepgp_gi.training.loop import _trainable_variables
from deepgp_gi.training.step import TrainStep
from fit_checks import parameter_values, toy_regression


# ------------------------------------------------------------------------------------ schedules
def test_paper_schedule_values_at_epoch_boundaries():
    schedule = PaperSchedule(steps_per_epoch=7)
    # epochs 0-9 (steps 0..69): 0; then +0.1 at epochs 10, 20, ..., 90; 1 from epoch 100 on
    assert [schedule(s) for s in (0, 1, 69)] == [0.0, 0.0, 0.0]
    for k in range(1, 10):
        first, last = 7 * (10 * k), 7 * (10 * k + 10) - 1
        assert schedule(first) == pytest.approx(0.1 * k, abs=1e-15)
        assert schedule(last) == pytest.approx(0.1 * k, abs=1e-15)
        assert schedule(first - 1) == pytest.approx(0.1 * (k - 1), abs=1e-15)
    assert schedule(699) == pytest.approx(0.9, abs=1e-15)
    assert schedule(700) == 1.0 and schedule(10**7) == 1.0
    values = [schedule(s) for s in range(0, 800)]
    assert np.all(np.diff(values) >= 0) and sorted(set(np.round(values, 12))) == [
        round(0.1 * k, 12) for k in range(11)
    ]

    custom = PaperSchedule(steps_per_epoch=2, zero_epochs=1, step_epochs=2, increment=0.5)
    assert [custom(s) for s in range(10)] == [0.0, 0.0, 0.5, 0.5, 0.5, 0.5, 1.0, 1.0, 1.0, 1.0]


def test_linear_schedule_values():
    assert [LinearSchedule(4)(s) for s in range(7)] == [0.0, 0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    ramp = LinearSchedule(4, start=0.2)
    np.testing.assert_allclose(
        [ramp(s) for s in range(6)], [0.2, 0.4, 0.6, 0.8, 1.0, 1.0], rtol=1e-15
    )
    # Ritter et al.'s shape: no KL for the delay, then the ramp
    assert [LinearSchedule(2, delay_steps=3)(s) for s in range(7)] == [
        0.0,
        0.0,
        0.0,
        0.0,
        0.5,
        1.0,
        1.0,
    ]


def test_schedule_constructors_check_their_arguments():
    with pytest.raises(ValueError, match="steps_per_epoch must be at least 1"):
        PaperSchedule(0)
    with pytest.raises(TypeError, match="steps_per_epoch must be an integer"):
        PaperSchedule(2.5)
    with pytest.raises(ValueError, match=r"increment must be a number in \(0, 1\]"):
        PaperSchedule(3, increment=0.0)
    with pytest.raises(ValueError, match="warmup_steps must be at least 1"):
        LinearSchedule(0)
    with pytest.raises(ValueError, match=r"start must be a number in \[0, 1\]"):
        LinearSchedule(3, start=1.5)
    with pytest.raises(ValueError, match="delay_steps must be at least 0"):
        LinearSchedule(3, delay_steps=-1)
    with pytest.raises(ValueError, match=r"weight must be a number in \[0, 1\]"):
        ConstantSchedule(float("nan"))
    with pytest.raises(TypeError, match=r"weight must be a number in \[0, 1\]"):
        ConstantSchedule("0.5")


def test_a_constant_schedule_is_its_weight_at_every_step_and_equals_the_lambda(rng):
    assert [ConstantSchedule(0.3)(s) for s in (0, 1, 10**6)] == [0.3, 0.3, 0.3]
    X, Y = toy_regression(rng, 20)
    histories, values = [], []
    for schedule in (ConstantSchedule(0.3), lambda step: 0.3):
        model = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=5, seed=0)
        histories.append(
            dg.fit(
                model, (X, Y), steps=3, seed=1, progress=False, log_every=1, kl_schedule=schedule
            )
        )
        values.append(parameter_values(model))
    assert histories[0].kl_weight == [0.3] * 3 and histories[0].elbo == histories[1].elbo
    for a, b in zip(*values):
        np.testing.assert_array_equal(a, b)


# ----------------------------------------------------------------------------- the objective
def _oracle_terms(model, X_b, Y_b, num_samples, noise):
    """ell [S] (rescaled by N / batch) and kl [S] built from propagate and the likelihood
    directly."""
    prop = model.posterior.propagate(tf.constant(X_b), num_samples, noise)
    ell = tf.reduce_sum(
        expected_log_likelihood(
            model.likelihood, tf.constant(X_b), prop.mean, prop.var, tf.constant(Y_b)
        ),
        -1,
    )
    return ell * (model.num_data / X_b.shape[0]), prop.kl


@pytest.mark.parametrize("kind", ["gp-mean_field", "bnn-global"])
def test_elbo_terms_are_the_ell_and_kl_of_the_elbo(rng, kind):
    X, Y = toy_regression(rng, 40)
    if kind == "gp-mean_field":
        model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=8, seed=0)
    else:
        model = dg.build_bnn(X, Y, hidden=(8,), posterior="global", num_inducing=8, seed=0)
    Xb, Yb = X[:15], Y[:15]
    ell, kl = model.elbo_terms((Xb, Yb), 3, seed=7)
    assert ell.shape == (3,) and kl.shape == (3,)
    np.testing.assert_array_equal(
        (ell - kl).numpy(), model.elbo_per_sample((Xb, Yb), 3, seed=7).numpy()
    )
    ell_o, kl_o = _oracle_terms(model, Xb, Yb, 3, dg.noise.SeededNoise(7))
    np.testing.assert_allclose(ell.numpy(), ell_o.numpy(), rtol=1e-12)
    np.testing.assert_allclose(kl.numpy(), kl_o.numpy(), rtol=1e-12)
    assert np.all(np.abs(kl.numpy()) > 1e-3)  # a KL that matters, so the tests below can tell


@pytest.mark.parametrize("kind", ["gp-mean_field", "bnn-global"])
def test_tempered_gradient_is_ell_gradient_at_zero_and_elbo_gradient_at_one(rng, kind):
    X, Y = toy_regression(rng, 40)
    if kind == "gp-mean_field":
        model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=8, seed=0)
    else:
        model = dg.build_bnn(X, Y, hidden=(8,), posterior="global", num_inducing=8, seed=0)
    variables = _trainable_variables(model)
    optimizer = dg.training.adam(0.01, variables)
    train_step = TrainStep(
        model, optimizer, variables, tf.Variable(0, dtype=tf.int64), num_samples=2, seed=11
    )
    step = tf.constant(5, tf.int64)
    idx = batch_indices(step, len(X), 16, seed=11).numpy()
    Xb, Yb = X[idx], Y[idx]

    def oracle(beta):
        with tf.GradientTape() as tape:
            ell, kl = _oracle_terms(model, Xb, Yb, 2, step_noise(11, step))
            loss = -(tf.reduce_mean(ell - beta * kl) + model.log_prior_density())
        return tf.reduce_mean(ell - kl), tape.gradient(loss, variables)

    grads = {}
    for beta in (0.0, 1.0, 0.3):
        elbo, got = train_step.loss_and_gradients(step, tf.constant(Xb), tf.constant(Yb), beta)
        elbo_o, want = oracle(beta)
        np.testing.assert_allclose(
            float(elbo), float(elbo_o), rtol=1e-12
        )  # untempered for every beta
        for g, w, v in zip(got, want, variables):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-9, atol=1e-12, err_msg=v.name)
        grads[beta] = got
    # the loss is affine in beta; beta = 0 and beta = 1 differ (the KL has a gradient)
    for g0, g1, g3 in zip(grads[0.0], grads[1.0], grads[0.3]):
        np.testing.assert_allclose(
            g3.numpy(), 0.7 * g0.numpy() + 0.3 * g1.numpy(), rtol=1e-8, atol=1e-10
        )
    assert (
        max(float(np.max(np.abs(a.numpy() - b.numpy()))) for a, b in zip(grads[0.0], grads[1.0]))
        > 1e-3
    )


@pytest.mark.parametrize(
    "jit_compile", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["graph", "xla"]
)
def test_a_changing_weight_does_not_retrace_the_step(rng, jit_compile):
    X, Y = toy_regression(rng, 20)
    model = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=5, seed=0)
    variables = _trainable_variables(model)
    optimizer = dg.training.adam(0.01, variables)
    train_step = TrainStep(
        model,
        optimizer,
        variables,
        tf.Variable(0, dtype=tf.int64),
        num_samples=1,
        seed=0,
        jit_compile=jit_compile,
    )
    Xt, Yt = tf.constant(X), tf.constant(Y)
    for t, beta in enumerate([0.0, 0.1, 0.5, 1.0, None]):
        train_step(tf.constant(t, tf.int64), Xt, Yt, beta)
    assert train_step._compiled.experimental_get_tracing_count() == 1


def test_history_elbo_is_the_untempered_elbo(rng):
    """The first logged ELBO is the model's ELBO at the initial parameters on step 0's minibatch
    and draws, whatever the weight; the tempered objective it did not report differs."""
    X, Y = toy_regression(rng, 40)
    seed, batch = 4, 16
    for beta in (0.0, 0.5):
        model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=8, seed=0)
        idx = batch_indices(tf.constant(0, tf.int64), len(X), batch, seed).numpy()
        ell, kl = model.elbo_terms((X[idx], Y[idx]), 1, step_noise(seed, tf.constant(0, tf.int64)))
        untempered, tempered = float(ell[0] - kl[0]), float(ell[0] - beta * kl[0])
        history = dg.fit(
            model,
            (X, Y),
            steps=2,
            batch_size=batch,
            seed=seed,
            progress=False,
            log_every=1,
            kl_schedule=lambda step, b=beta: b,
        )
        np.testing.assert_allclose(history.elbo[0], untempered, rtol=1e-12)
        assert abs(history.elbo[0] - tempered) > 1.0
        assert history.kl_weight == [beta, beta]


@pytest.mark.slow  # several fits; moved out of the fast suite for its time
def test_fit_with_schedules_trains_and_records_the_weight(rng):
    X, Y = toy_regression(rng, 30)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=8, seed=0)
    # "paper": steps_per_epoch = ceil(30 / 10) = 3, so the weight is 0 for steps 0..29, 0.1 from 30
    history = dg.fit(
        model,
        (X, Y),
        steps=36,
        batch_size=10,
        seed=1,
        progress=False,
        log_every=3,
        kl_schedule="paper",
    )
    assert history.step == list(range(3, 37, 3))
    assert history.kl_weight == [PaperSchedule(3)(s - 1) for s in history.step]
    assert history.kl_weight[9] == 0.0 and history.kl_weight[10] == pytest.approx(0.1)
    # without a schedule the weight is 1 and the run is bit-for-bit the one with weight 1 throughout
    plain = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=8, seed=0)
    h_plain = dg.fit(plain, (X, Y), steps=5, seed=1, progress=False, log_every=1)
    ones = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=8, seed=0)
    h_ones = dg.fit(
        ones, (X, Y), steps=5, seed=1, progress=False, log_every=1, kl_schedule=lambda step: 1.0
    )
    assert h_plain.kl_weight == [1.0] * 5 and h_plain.elbo == h_ones.elbo
    for a, b in zip(parameter_values(plain), parameter_values(ones)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # 60 steps, each logged: `make test-all`
def test_fit_with_the_linear_schedule_by_name_trains_and_records_the_weight(rng):
    X, Y = toy_regression(rng, 30)
    # "linear": 0 to 1 over the first ceil(60 / 10) = 6 steps
    model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=8, seed=0)
    history = dg.fit(
        model, (X, Y), steps=60, seed=1, progress=False, log_every=1, kl_schedule="linear"
    )
    np.testing.assert_allclose(
        history.kl_weight[:8], [0, 1 / 6, 2 / 6, 3 / 6, 4 / 6, 5 / 6, 1, 1], rtol=1e-15
    )
    assert history.elbo[-1] > history.elbo[0] and np.all(np.isfinite(history.elbo))
    assert json.loads(history.to_json())["kl_weight"] == history.kl_weight


def test_paper_schedule_on_a_dataset_uses_its_length(rng):
    X, Y = toy_regression(rng, 20)
    model = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=5, seed=0)
    finite = tf.data.Dataset.from_tensor_slices((X, Y)).batch(10)  # 2 batches per epoch
    history = dg.fit(
        model, finite, steps=22, seed=0, progress=False, log_every=1, kl_schedule="paper"
    )
    assert history.kl_weight[19] == 0.0 and history.kl_weight[20] == pytest.approx(0.1)
    with pytest.raises(ValueError, match=r"kl_schedule='paper'.*PaperSchedule\(steps_per_epoch"):
        dg.fit(model, finite.repeat(), steps=2, seed=0, progress=False, kl_schedule="paper")


# A tempered fit under XLA equals the plain one: tests/test_training.py,
# test_xla_step_matches_plain_step case "bnn-global-tempered".


@pytest.mark.parametrize("beta", [0.5, 0.25])
def test_natural_gradient_step_of_size_one_over_beta_reaches_the_tempered_optimum(rng, beta):
    """One layer, Gaussian likelihood, hyperparameters fixed: ell - beta * KL = beta * (ELBO with
    noise beta * sigma^2 + N c), c = log(2 pi beta sigma^2) / 2 - log(2 pi sigma^2) / (2 beta),
    whose maximum is SGPR's bound with noise beta * sigma^2. The tempered natural gradient's fixed
    point is that maximiser, and a step of gamma = 1 / beta reaches it from anywhere."""
    X = rng.normal(size=(30, 2))
    Y = np.sin(X[:, :1]) + 0.1 * rng.normal(size=(30, 1))
    model = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=7, seed=0)
    gpflow.set_trainable(model.layers[0], False)
    gpflow.set_trainable(model.likelihood, False)
    sigma2 = float(model.likelihood.variance.numpy())
    dg.fit(
        model,
        (X, Y),
        steps=1,
        natgrad_gamma=1.0 / beta,
        seed=0,
        progress=False,
        log_every=1,
        kl_schedule=lambda step: beta,
    )
    ell, kl = model.elbo_terms((X, Y), 1, seed=0)
    tempered = float(ell[0] - beta * kl[0])
    sgpr = gpflow.models.SGPR(
        (X, Y),
        model.layers[0].kernel,
        inducing_variable=model.layers[0].Z.numpy(),
        noise_variance=beta * sigma2,
    )
    c = 0.5 * np.log(2 * np.pi * beta * sigma2) - np.log(2 * np.pi * sigma2) / (2 * beta)
    np.testing.assert_allclose(tempered, beta * (float(sgpr.elbo()) + len(X) * c), rtol=1e-9)
    # and it is not the untempered optimum
    untempered_bound = gpflow.models.SGPR(
        (X, Y),
        model.layers[0].kernel,
        inducing_variable=model.layers[0].Z.numpy(),
        noise_variance=sigma2,
    ).elbo()
    assert float(ell[0] - kl[0]) < float(untempered_bound) - 1e-3


# --------------------------------------------------------------------------------- resuming
@pytest.mark.slow  # several fits; moved out of the fast suite for its time
def test_resumed_tempered_fit_continues_the_schedule(rng, tmp_path):
    X, Y = toy_regression(rng, 40)
    schedule = LinearSchedule(12, start=0.1)
    kwargs = dict(
        steps=20, batch_size=25, seed=9, progress=False, log_every=2, kl_schedule=schedule
    )
    straight = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=8, seed=0)
    h_straight = dg.fit(straight, (X, Y), **kwargs)

    first = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=8, seed=0)
    dg.fit(first, (X, Y), **dict(kwargs, steps=8), checkpoint_dir=tmp_path, checkpoint_every=4)
    fresh = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=8, seed=0)
    h_resumed = dg.fit(fresh, (X, Y), **kwargs, checkpoint_dir=tmp_path, checkpoint_every=4)
    assert h_resumed.resumed_from == 8
    assert h_resumed.step == h_straight.step
    assert h_resumed.kl_weight == h_straight.kl_weight == [schedule(s - 1) for s in h_straight.step]
    np.testing.assert_allclose(h_resumed.elbo, h_straight.elbo, rtol=1e-12)
    for a, b in zip(parameter_values(straight), parameter_values(fresh)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)

    # resuming the same checkpoint with another schedule (or none) would mix two runs
    other = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=8, seed=0)
    with pytest.raises(ValueError, match="KL weight at step 2 was 0.17.*kl_schedule gives 1.0"):
        dg.fit(
            other,
            (X, Y),
            **dict(kwargs, steps=30, kl_schedule=None),
            checkpoint_dir=tmp_path,
            checkpoint_every=4,
        )


@pytest.mark.slow  # two fits with checkpoints: `make test-all`
def test_a_history_saved_before_tempering_resumes_with_weight_one(rng, tmp_path):
    X, Y = toy_regression(rng, 20)
    model = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=5, seed=0)
    dg.fit(
        model,
        (X, Y),
        steps=4,
        seed=2,
        progress=False,
        log_every=2,
        checkpoint_dir=tmp_path,
        checkpoint_every=2,
    )
    saved = json.loads((tmp_path / "history.json").read_text())
    del saved["kl_weight"]
    (tmp_path / "history.json").write_text(json.dumps(saved))
    history = dg.fit(
        model,
        (X, Y),
        steps=6,
        seed=2,
        progress=False,
        log_every=2,
        checkpoint_dir=tmp_path,
        checkpoint_every=2,
    )
    assert history.step == [2, 4, 6] and history.kl_weight == [1.0, 1.0, 1.0]


# ---------------------------------------------------------------------------------- bad input
def test_bad_kl_schedules_are_refused(rng, tmp_path):
    X, Y = toy_regression(rng, 20)
    model = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=5, seed=0)
    before = parameter_values(model)

    def fit(schedule, **kw):
        return dg.fit(
            model, (X, Y), steps=6, seed=0, progress=False, log_every=1, kl_schedule=schedule, **kw
        )

    for bad in (0.5, 1, [0.0, 1.0]):
        with pytest.raises(TypeError, match="kl_schedule must be None, 'paper', 'linear'"):
            fit(bad)
    with pytest.raises(ValueError, match="unknown kl_schedule 'cosine'"):
        fit("cosine")
    for value in (1.5, -0.1, float("nan"), float("inf")):
        with pytest.raises(
            ValueError, match=r"kl_schedule gave .* at step 0; a KL weight must be finite and in"
        ):
            fit(lambda step, v=value: v)
    for value in ("0.5", None, True, np.array([0.5])):
        with pytest.raises(TypeError, match="kl_schedule returned .* at step 0"):
            fit(lambda step, v=value: v)
    for a, b in zip(before, parameter_values(model)):  # nothing was trained
        np.testing.assert_array_equal(a, b)
    # a value that goes wrong later is caught before the step that would use it
    with pytest.raises(ValueError, match="kl_schedule gave 2.0 at step 3"):
        fit(lambda step: 1.0 if step < 3 else 2.0, checkpoint_dir=tmp_path, checkpoint_every=2)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith(
        "ckpt-2"
    )  # steps 0 and 1 done and saved
    # numpy and tensor scalars are numbers
    history = dg.fit(
        model,
        (X, Y),
        steps=2,
        seed=0,
        progress=False,
        log_every=1,
        kl_schedule=lambda step: np.float32(0.5) if step else tf.constant(0.25),
    )
    assert history.kl_weight == [0.25, 0.5]
