"""fit: reproducible, resumable, minibatched, float32-capable."""

import re

import gpflow
import numpy as np
import pytest
import tensorflow as tf

import deepgp_gi as dg
from deepgp_gi.training import LinearSchedule, batch_indices
from deepgp_gi.training.batches import step_noise
from fit_checks import assert_xla_fit_matches_plain, parameter_values, toy_regression


@pytest.mark.parametrize("written_by", ["another_model", "another_optimiser"])
def test_a_checkpoint_of_another_run_is_a_clear_error(rng, tmp_path, written_by):
    X, Y = toy_regression(rng, 30)
    if written_by == "another_model":
        other = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=10, seed=0)
        dg.fit(
            other,
            (X, Y),
            steps=2,
            batch_size=10,
            seed=1,
            progress=False,
            checkpoint_dir=tmp_path,
            checkpoint_every=2,
        )
    else:  # the same model with tf_keras's (unfused) Adam state
        other = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=10, seed=0)
        optimizer = gpflow.keras.tf_keras.optimizers.Adam(0.01)
        optimizer.build(other.trainable_variables)
        checkpoint = tf.train.Checkpoint(
            model=other, optimizer=optimizer, step=tf.Variable(2, dtype=tf.int64)
        )
        tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=1).save(
            checkpoint_number=2
        )
    model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=10, seed=0)
    with pytest.raises(
        ValueError, match="checkpoint_dir .* does not match this run's model and optimiser"
    ):
        dg.fit(
            model, (X, Y), steps=4, batch_size=10, seed=1, progress=False, checkpoint_dir=tmp_path
        )


def test_batches_cover_each_epoch_once():
    idx = [batch_indices(t, 23, 5, seed=3).numpy() for t in range(10)]
    epoch0, epoch1 = np.concatenate(idx[:5]), np.concatenate(idx[5:])
    assert sorted(epoch0) == list(range(23)) and sorted(epoch1) == list(range(23))
    assert not np.array_equal(epoch0, epoch1)
    assert [len(i) for i in idx[:5]] == [5, 5, 5, 5, 3]


# two 60-step fits; make test has bit-for-bit reruns in the resume tests: `make test-all`
@pytest.mark.slow
def test_same_seed_same_result_and_elbo_improves(rng):
    X, Y = toy_regression(rng, 60)
    runs = []
    for _ in range(2):
        model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=10, seed=0)
        hist = dg.fit(model, (X, Y), steps=60, batch_size=20, seed=5, progress=False, log_every=5)
        runs.append((parameter_values(model), hist))
    for a, b in zip(runs[0][0], runs[1][0]):
        np.testing.assert_array_equal(a, b)
    assert runs[0][1].elbo == runs[1][1].elbo
    assert runs[0][1].elbo[-1] > runs[0][1].elbo[0]


# three fits; `make test` resumes a fit in test_kl_tempering.py (the same path, tempered)
@pytest.mark.slow
def test_resumed_fit_equals_uninterrupted(rng, tmp_path):
    X, Y = toy_regression(rng, 60)
    straight = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=10, seed=0)
    h_straight = dg.fit(
        straight, (X, Y), steps=40, batch_size=25, seed=9, progress=False, log_every=4
    )

    resumed = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=10, seed=0)
    dg.fit(
        resumed,
        (X, Y),
        steps=15,
        batch_size=25,
        seed=9,
        progress=False,
        log_every=4,
        checkpoint_dir=tmp_path,
        checkpoint_every=5,
    )
    # a fresh process would rebuild the model; rebuilding here checks the restore, not
    # leftover state
    fresh = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=10, seed=0)
    h_resumed = dg.fit(
        fresh,
        (X, Y),
        steps=40,
        batch_size=25,
        seed=9,
        progress=False,
        log_every=4,
        checkpoint_dir=tmp_path,
        checkpoint_every=5,
    )
    assert h_resumed.resumed_from == 15
    for a, b in zip(parameter_values(straight), parameter_values(fresh)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(h_resumed.elbo[-1], h_straight.elbo[-1], rtol=1e-12)
    assert h_resumed.step == h_straight.step


def test_fit_accepts_tf_data(rng):
    X, Y = toy_regression(rng, 60)
    model = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=10, seed=0)
    ds = tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(60, seed=1).batch(20).repeat()
    start = model.elbo((X, Y)).numpy()
    dg.fit(model, ds, steps=50, seed=0, progress=False)
    assert model.elbo((X, Y)).numpy() > start


def test_float32_end_to_end(rng):
    X, Y = toy_regression(rng, 60)
    with gpflow.config.as_context(gpflow.config.Config(float=np.float32, jitter=1e-5)):
        model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=10, seed=0)
        assert all(v.dtype == tf.float32 for v in model.trainable_variables)
        hist = dg.fit(model, (X, Y), steps=30, seed=0, progress=False)
        mu, var = model.predict_y(X.astype(np.float32), 5)
        lpd = dg.metrics.test_log_likelihood(model, X, Y, num_samples=5)
    assert mu.dtype == tf.float32 and np.all(np.isfinite(mu)) and np.all(var.numpy() > 0)
    assert np.isfinite(hist.elbo[-1]) and np.isfinite(lpd)


def test_metrics_in_original_units(rng):
    X, Y = toy_regression(rng, 60)
    model = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=10, seed=0)
    ll1 = dg.metrics.test_log_likelihood(model, X, Y, y_std=1.0, num_samples=1)
    ll3 = dg.metrics.test_log_likelihood(model, X, Y, y_std=3.0, num_samples=1)
    np.testing.assert_allclose(
        ll1 - ll3, np.log(3.0), rtol=1e-10
    )  # one layer: deterministic mixture
    r1 = dg.metrics.rmse(model, X, Y, y_std=1.0, num_samples=1)
    r3 = dg.metrics.rmse(model, X, Y, y_std=3.0, num_samples=1)
    np.testing.assert_allclose(r3, 3 * r1, rtol=1e-10)
    mu, _ = model.predict_y(X, 1)
    np.testing.assert_allclose(r1, np.sqrt(np.mean((Y - mu.numpy()) ** 2)), rtol=1e-10)


def test_dataset_resume_past_one_pass_is_exact(rng, tmp_path):
    # 4 batches per pass; the run is interrupted at step 6 (inside the second pass) of 11
    X, Y = toy_regression(rng, 40)

    def dataset():
        return tf.data.Dataset.from_tensor_slices((X, Y)).shuffle(40, seed=3).batch(10)

    def build():
        return dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=8, seed=0)

    straight = build()
    h_straight = dg.fit(straight, dataset(), steps=11, seed=4, progress=False, log_every=1)
    first = build()
    dg.fit(
        first,
        dataset(),
        steps=6,
        seed=4,
        progress=False,
        log_every=1,
        checkpoint_dir=tmp_path,
        checkpoint_every=3,
    )
    fresh = build()
    h_resumed = dg.fit(
        fresh,
        dataset(),
        steps=11,
        seed=4,
        progress=False,
        log_every=1,
        checkpoint_dir=tmp_path,
        checkpoint_every=3,
    )
    assert h_resumed.resumed_from == 6
    assert h_resumed.step == h_straight.step == list(range(1, 12))
    assert h_resumed.elbo == h_straight.elbo
    for a, b in zip(parameter_values(straight), parameter_values(fresh)):
        np.testing.assert_array_equal(a, b)


def test_empty_dataset_is_an_error(rng):
    X, Y = toy_regression(rng, 20)
    model = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=5, seed=0)
    empty = tf.data.Dataset.from_tensor_slices((X, Y)).batch(10).take(0)
    with pytest.raises(ValueError, match="yielded no more batches"):
        dg.fit(model, empty, steps=3, seed=0, progress=False)


def _broken_model(X, Y):
    model = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=8, seed=0)
    # a NaN lengthscale (as a diverged optimiser leaves it; gpflow refuses to assign one through the
    # transform) makes K_uu NaN: no jitter can make it positive definite
    model.layers[0].kernel.lengthscales.unconstrained_variable.assign(np.full(X.shape[1], np.nan))
    return model


@pytest.mark.parametrize(
    "jit_compile", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["graph", "xla"]
)
def test_fit_raises_cholesky_error_and_saves_nothing(rng, tmp_path, jit_compile):
    X, Y = toy_regression(rng, 30)
    model = _broken_model(X, Y)
    with pytest.raises(
        dg.linalg.CholeskyError, match=r"K_uu of layer .* is not positive definite.*training step 1"
    ):
        dg.fit(
            model,
            (X, Y),
            steps=5,
            seed=0,
            progress=False,
            log_every=5,
            checkpoint_dir=tmp_path,
            checkpoint_every=2,
            jit_compile=jit_compile,
        )
    assert tf.train.latest_checkpoint(str(tmp_path)) is None
    assert not (tmp_path / "history.json").exists()


# The XLA step of every family against its plain step. Each case compiles a step with XLA (seconds
# to tens of seconds on 2 CPU cores), so `make test` keeps the cheapest to compile, the
# factorised BNN; the other cases (every deep GP, the other BNNs, the tempered one with its KL
# weight fed to the compiled step) run in `make test-all`. A healthy compiled fit reports no
# CholeskyError and finite ELBOs (assert_xla_fit_matches_plain).
FAST_XLA_CASES = ("bnn-factorised",)


def _xla_cases():
    from deepgp_gi.families import BNN_FAMILIES, DEEP_GP_FAMILIES

    cases = [(f"gp-{p}", dict(kind="gp", posterior=p)) for p in DEEP_GP_FAMILIES]
    cases += [(f"bnn-{p}", dict(kind="bnn", posterior=p)) for p in BNN_FAMILIES]
    cases.append(("bnn-global-scale", dict(kind="bnn", posterior="global", prior="scale")))
    cases.append(
        ("bnn-global-tempered", dict(kind="bnn", posterior="global", kl_schedule=LinearSchedule(4)))
    )
    return [
        pytest.param(c, id=i, marks=() if i in FAST_XLA_CASES else pytest.mark.slow)
        for i, c in cases
    ]


def _build_case(case, X, Y):
    if case["kind"] == "gp":
        return dg.build_deep_gp(
            X, Y, depth=2, posterior=case["posterior"], num_inducing=8, inner_width=2, seed=0
        )
    kwargs = {"prior": case["prior"]} if "prior" in case else {}
    return dg.build_bnn(
        X, Y, hidden=(8,), posterior=case["posterior"], num_inducing=8, seed=0, **kwargs
    )


@pytest.mark.parametrize("case", _xla_cases())
def test_xla_step_matches_plain_step(case, rng):
    X, Y = toy_regression(rng, 40)
    schedule = {"kl_schedule": case["kl_schedule"]} if "kl_schedule" in case else {}
    assert_xla_fit_matches_plain(
        lambda: _build_case(case, X, Y),
        (X, Y),
        steps=5,
        batch_size=20,
        seed=3,
        log_every=1,
        **schedule,
    )


def test_fit_argument_checks(rng):
    from deepgp_gi.validation import check_positive_float, check_seed

    assert check_seed(None) is None and check_seed(np.int64(7)) == 7
    with pytest.raises(TypeError, match="my_seed must be an integer or None"):
        check_seed(True, "my_seed")
    with pytest.raises(ValueError, match="64-bit"):
        check_seed(2**64)
    assert check_positive_float(3, "lr") == 3.0
    for bad in (0.0, -1.0, float("inf"), float("nan"), "0.1", True):
        with pytest.raises(ValueError, match="lr must be a positive finite number"):
            check_positive_float(bad, "lr")
    X, Y = toy_regression(rng, 20)
    model = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=5, seed=0)
    with pytest.raises(TypeError, match="seed must be an integer or None"):
        dg.fit(model, (X, Y), steps=1, seed=1.5, progress=False)
    with pytest.raises(TypeError, match="jit_compile must be True, False or 'auto'"):
        dg.fit(model, (X, Y), steps=1, seed=1, progress=False, jit_compile="yes")


@pytest.mark.parametrize("whiten", [False, True])
def test_natural_gradient_step_reaches_the_sgpr_bound_in_one_step(rng, whiten):
    """One layer, Gaussian likelihood, kernel / noise / Z fixed: one natural-gradient step with
    gamma = 1 gives the optimal q(U), so the ELBO equals SGPR's collapsed bound."""
    X = rng.normal(size=(30, 2))
    Y = np.sin(X[:, :1]) + 0.1 * rng.normal(size=(30, 1))
    model = dg.build_deep_gp(
        X, Y, depth=1, posterior="mean_field", num_inducing=7, seed=0, whiten=whiten
    )
    gpflow.set_trainable(model.layers[0], False)
    gpflow.set_trainable(model.likelihood, False)
    before = float(model.elbo((X, Y), 1, seed=0))
    dg.fit(model, (X, Y), steps=1, natgrad_gamma=1.0, seed=0, progress=False, log_every=1)
    sgpr = gpflow.models.SGPR(
        (X, Y),
        model.layers[0].kernel,
        inducing_variable=model.layers[0].Z.numpy(),
        noise_variance=model.likelihood.variance.numpy(),
    )
    bound = float(sgpr.elbo())
    assert before < bound - 1.0
    np.testing.assert_allclose(float(model.elbo((X, Y), 1, seed=0)), bound, rtol=1e-9)


def test_natgrad_on_the_last_layer_reaches_the_sgpr_bound_of_its_inputs(rng):
    """natgrad_layers="last" with gamma = 1: the output layer's q(U) lands on its optimum given
    its inputs. The hidden layer is fixed (its kernel, q(v_0)); under the noise of fit's step 0
    (step_noise(0, 0)) it outputs one draw H, for which the optimal output layer gives SGPR's
    bound on (H, Y): the model's ELBO under that noise is that bound minus the hidden layer's
    KL(q(v_0) || N(0, I)) (whitened)."""
    X = rng.normal(size=(40, 2))
    Y = np.sin(X[:, :1] - X[:, 1:]) + 0.1 * rng.normal(size=(40, 1))
    model = dg.build_deep_gp(
        X, Y, depth=2, posterior="mean_field", num_inducing=6, inner_width=1, seed=0, whiten=True
    )
    hidden, output = model.layers
    for module in (hidden, output, model.likelihood):
        gpflow.set_trainable(module, False)
    gpflow.set_trainable(model.posterior.q_mu[0], False)
    gpflow.set_trainable(model.posterior.q_sqrt[0], False)
    q0 = model.posterior.q_mu[0].numpy().copy()
    noise = step_noise(0, tf.constant(0, tf.int64))
    before = float(model.elbo((X, Y), 1, seed=noise))
    dg.fit(
        model,
        (X, Y),
        steps=1,
        natgrad_gamma=1.0,
        natgrad_layers="last",
        seed=0,
        progress=False,
        log_every=1,
    )
    np.testing.assert_array_equal(model.posterior.q_mu[0].numpy(), q0)
    H = model.posterior.propagate(X, 1, seed=noise).samples[0][0].numpy()
    sgpr = gpflow.models.SGPR(
        (H, Y),
        output.kernel,
        inducing_variable=output.Z.numpy(),
        noise_variance=model.likelihood.variance.numpy(),
    )
    kl_hidden = float(
        gpflow.kullback_leiblers.gauss_kl(model.posterior.q_mu[0], model.posterior.q_sqrt[0])
    )
    target = float(sgpr.elbo()) - kl_hidden
    assert before < target - 1.0
    np.testing.assert_allclose(float(model.elbo((X, Y), 1, seed=noise)), target, rtol=1e-9)


@pytest.mark.slow  # several fits; moved out of the fast suite for its time
def test_natgrad_layers_leaves_the_other_blocks_to_adam(rng):
    """With natgrad_layers="last" the hidden layer's q_sqrt takes Adam's first step (each diagonal
    entry moves by the learning rate, since Adam's first step is lr * g / (|g| + eps)); with "all"
    (or naming both layers) a natural-gradient step of size 0.1 from the prior-like start, which
    moves it by far less."""
    X, Y = toy_regression(rng, 30)
    moves = {}
    for layers in ("last", "all", [-1, 0]):
        model = dg.build_deep_gp(
            X, Y, depth=2, posterior="mean_field", num_inducing=5, inner_width=2, seed=0
        )
        before = np.diagonal(model.posterior.q_sqrt[0].numpy(), axis1=1, axis2=2).copy()
        dg.fit(
            model,
            (X, Y),
            steps=1,
            natgrad_gamma=0.1,
            natgrad_layers=layers,
            learning_rate=0.01,
            seed=0,
            progress=False,
            log_every=1,
        )
        moves[str(layers)] = np.abs(
            np.diagonal(model.posterior.q_sqrt[0].numpy(), axis1=1, axis2=2) - before
        )
    for adam in ("last",):
        np.testing.assert_allclose(moves[adam], 0.01, rtol=1e-5)
    for natural in ("all", "[-1, 0]"):
        assert np.max(moves[natural]) < 1e-4
    np.testing.assert_array_equal(moves["all"], moves["[-1, 0]"])


def test_natgrad_layers_bad_settings_are_refused_before_training(rng):
    X, Y = toy_regression(rng, 20)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=5, seed=0)
    q0 = model.posterior.q_mu[1].numpy().copy()
    cases = [
        (dict(natgrad_layers="last"), ValueError, "natgrad_layers='last' needs natgrad_gamma"),
        (
            dict(natgrad_gamma=0.1, natgrad_layers="first"),
            ValueError,
            "natgrad_layers must be 'all', 'last'",
        ),
        (dict(natgrad_gamma=0.1, natgrad_layers=[]), ValueError, "natgrad_layers is empty"),
        (
            dict(natgrad_gamma=0.1, natgrad_layers=[2]),
            ValueError,
            "layer 2 does not exist in a depth-2 model",
        ),
        (dict(natgrad_gamma=0.1, natgrad_layers=[1, -1]), ValueError, "names layer 1 twice"),
        (dict(natgrad_gamma=0.1, natgrad_layers=[0.5]), TypeError, "sequence of ints"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=re.escape(message)):
            dg.fit(model, (X, Y), steps=1, progress=False, **kwargs)
    gpflow.set_trainable(model.posterior.q_sqrt[1], False)
    with pytest.raises(ValueError, match="one of q_mu, q_sqrt trainable"):
        dg.fit(model, (X, Y), steps=1, natgrad_gamma=0.1, natgrad_layers="last", progress=False)
    gpflow.set_trainable(model.posterior.q_mu[1], False)
    with pytest.raises(ValueError, match="layer 1, whose q_mu and q_sqrt are not trainable"):
        dg.fit(model, (X, Y), steps=1, natgrad_gamma=0.1, natgrad_layers="last", progress=False)
    np.testing.assert_array_equal(model.posterior.q_mu[1].numpy(), q0)
    fc = dg.build_deep_gp(
        X,
        Y,
        depth=2,
        posterior="fully_coupled",
        num_inducing=5,
        seed=0,
        precondition_offdiagonal=False,
    )
    with pytest.raises(ValueError, match="one Gaussian block over all 2 layers"):
        dg.fit(fc, (X, Y), steps=1, natgrad_gamma=0.1, natgrad_layers="last", progress=False)


def test_natural_gradients_are_refused_for_families_without_gaussian_blocks(rng):
    X, Y = toy_regression(rng, 20)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="global", num_inducing=5, seed=0)
    with pytest.raises(ValueError, match="GlobalInducingPosterior has no Gaussian"):
        dg.fit(model, (X, Y), steps=1, natgrad_gamma=0.1, progress=False)


# fully-coupled: 60 steps, `make test-all` (its natural gradient is checked against SGPR's bound in
# make test, test_natural_gradient_on_the_fully_coupled_block_reaches_the_sgpr_bound)
@pytest.mark.parametrize(
    "posterior", ["mean_field", pytest.param("fully_coupled", marks=pytest.mark.slow)]
)
def test_natural_gradients_with_adam_train_a_deep_model(rng, posterior):
    X, Y = toy_regression(rng, 40)
    # natural gradients act on the plain Cholesky factor of the fully-coupled q(f_M)
    options = {"precondition_offdiagonal": False} if posterior == "fully_coupled" else {}
    model = dg.build_deep_gp(
        X, Y, depth=2, posterior=posterior, num_inducing=8, inner_width=2, seed=0, **options
    )
    if posterior == "fully_coupled":
        default = dg.build_deep_gp(
            X, Y, depth=2, posterior=posterior, num_inducing=8, inner_width=2, seed=0
        )
        with pytest.raises(ValueError, match="precondition_offdiagonal=False"):
            dg.fit(default, (X, Y), steps=1, natgrad_gamma=0.1, progress=False)
    history = dg.fit(
        model,
        (X, Y),
        steps=60,
        natgrad_gamma=0.1,
        num_samples=4,
        seed=0,
        progress=False,
        log_every=20,
    )
    assert history.elbo[-1] > history.elbo[0]
    assert all(np.isfinite(history.elbo))


def test_natural_gradient_on_the_fully_coupled_block_reaches_the_sgpr_bound(rng):
    """The fully-coupled q(f_M) is one Gaussian; for one layer and one output it is SVGP's q(u),
    so one natural-gradient step with gamma = 1 (hyperparameters fixed) gives SGPR's bound."""
    X = rng.normal(size=(30, 2))
    Y = np.sin(X[:, :1]) + 0.1 * rng.normal(size=(30, 1))
    model = dg.build_deep_gp(
        X,
        Y,
        depth=1,
        posterior="fully_coupled",
        num_inducing=7,
        seed=0,
        precondition_offdiagonal=False,
    )
    gpflow.set_trainable(model.layers[0], False)
    gpflow.set_trainable(model.likelihood, False)
    dg.fit(model, (X, Y), steps=1, natgrad_gamma=1.0, seed=0, progress=False, log_every=1)
    sgpr = gpflow.models.SGPR(
        (X, Y),
        model.layers[0].kernel,
        inducing_variable=model.layers[0].Z.numpy(),
        noise_variance=model.likelihood.variance.numpy(),
    )
    np.testing.assert_allclose(float(model.elbo((X, Y), 1, seed=0)), float(sgpr.elbo()), rtol=1e-9)


@pytest.mark.slow  # builds and traces the step twice: `make test-all`
def test_a_training_step_does_not_walk_the_module_tree(rng, monkeypatch):
    """The model's ``dtype`` property collects its trainable variables (a walk of the module tree,
    milliseconds for a deep GP); ``fit`` reads it while setting up, never once per step."""
    X, Y = toy_regression(rng, 30)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=5, seed=0)
    reads = []
    plain = type(model).dtype

    def counted(self):
        reads.append(1)
        return plain.fget(self)

    monkeypatch.setattr(type(model), "dtype", property(counted))
    counts = []
    for steps in (2, 8):
        # each fit builds and traces its step (a later fit would reuse the first one's)
        dg.training.reuse.clear_cached_steps(model)
        reads.clear()
        dg.fit(model, (X, Y), steps=steps, batch_size=10, seed=0, progress=False)
        counts.append(len(reads))
    assert counts[0] == counts[1], f"model.dtype read {counts} times in fits of 2 and 8 steps"


@pytest.mark.parametrize("posterior", ["mean_field", "sghmc"])
def test_the_training_step_keeps_no_int32_variable(rng, posterior):
    """TensorFlow keeps int32 variables in host memory on a GPU, where an XLA-compiled step cannot
    read them (``fit(jit_compile=True)`` failed on a GPU with the Cholesky status in one): the step
    of ``fit`` (``TrainStep``, and ``SamplerStep`` for a sampling family) holds none, and a failure
    code still reaches ``raise_if_failed``."""
    from deepgp_gi.training.loop import _is_sampler, _trainable_variables
    from deepgp_gi.training.step import SamplerStep, TrainStep

    X, Y = toy_regression(rng, 30)
    model = dg.build_deep_gp(X, Y, depth=2, posterior=posterior, num_inducing=5, seed=0)
    variables = _trainable_variables(model)
    counter = tf.Variable(0, dtype=tf.int64, trainable=False)
    kind = SamplerStep if _is_sampler(model) else TrainStep
    step = kind(model, dg.training.adam(0.01, variables), variables, counter, num_samples=1, seed=0)
    step(tf.constant(0, tf.int64), tf.constant(X), tf.constant(Y))
    held = list(step.optimizer.variables())
    for value in vars(step).values():
        held += (
            [v for v in tf.nest.flatten(value) if isinstance(v, tf.Variable)]
            if not isinstance(value, tf.Module)
            else list(value.variables)
        )
    assert held and all(v.dtype != tf.int32 for v in held), [
        (v.name, v.dtype) for v in held if v.dtype == tf.int32
    ]
    step.raise_if_failed()  # no failure so far

    @tf.function(autograph=False)
    def failed_status():  # the int32 status of a compiled factorisation of a NaN matrix
        with dg.linalg.cholesky_checks() as checks:
            dg.linalg.safe_cholesky(
                tf.fill([2, 2], tf.constant(np.nan, tf.float64)), name="planted"
            )
        return checks.status()

    status = failed_status()
    assert status.dtype == tf.int32 and int(status) != 0
    step.finish_step(tf.constant(1, tf.int64), status)
    with pytest.raises(dg.linalg.CholeskyError, match="planted"):
        step.raise_if_failed()
