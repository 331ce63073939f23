"""Data-parallel training with tf.distribute: 2 logical CPU replicas give one device's step.

Logical devices can only be configured before TensorFlow starts, so each check runs
tests/distributed_check.py in a fresh process."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.parametrize("posterior", ["mean_field", "global"])
def test_mirrored_strategy_equals_one_device(posterior):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "distributed_check.py"), posterior],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["replicas"] == 2 and result["same_variables"]
    assert result["elbo_rel"] < 1e-12  # the summed replica shares are the whole batch's ELBO
    assert result["grad_rel"] < 1e-10  # and the all-reduced gradients its gradients
    assert result["fit_elbo_rel"] < 1e-9  # 6 Adam steps, a one-row batch included
    assert result["param_rel"] < 1e-7
    assert result["resume_rel"] < 1e-12  # checkpointed under the strategy at step 3, resumed to 6
    # KL weight 0.3: the replicas' tempered gradients are one device's, and the ELBO is untempered
    assert result["tempered_elbo_equals_untempered"] and result["tempering_changes_grads"]
    assert result["tempered_grad_rel"] < 1e-10


@pytest.mark.slow
def test_every_family_of_every_table_trains_the_same_on_two_replicas():
    """Deep GP, dense BNN, conv BNN and a Softmax likelihood, each family: 4 Adam steps (a last
    batch split unevenly) under MirroredStrategy on 2 logical CPUs, with fit called outside the
    scope, equal one device's run."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, "distributed_families_check.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=1500,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    kinds = {line["kind"] for line in lines}
    assert kinds == {"deep_gp", "deep_gp_softmax", "bnn", "conv_bnn"}
    for line in lines:
        assert line["ok"], line
        if (
            "refused" in line
        ):  # a sampling family: fit refuses a strategy before training, naming it
            assert "strategy" in line["refused"], line
            continue
        assert line["same_parameters"], line
        assert line["trained"] > 1e-3, line  # the steps moved the parameters
        assert line["elbo_rel"] < 1e-9 and line["param_rel"] < 1e-9, line


def _one_device_strategy_run(build, data):
    """``fit`` on one device and under a one-replica strategy (model built in its scope, ``fit``
    called outside it, as the README shows): the histories and parameters."""
    import gpflow
    import numpy as np
    import tensorflow as tf

    import deepgp_gi as dg

    runs = []
    for strategy in (None, tf.distribute.OneDeviceStrategy("/cpu:0")):
        if strategy is None:
            model = build()
        else:
            with strategy.scope():
                model = build()
        history = dg.fit(
            model,
            data,
            steps=3,
            batch_size=5,
            seed=2,
            progress=False,
            log_every=1,
            strategy=strategy,
        )
        runs.append(
            (
                np.array(history.elbo),
                {k: v.numpy() for k, v in gpflow.utilities.parameter_dict(model).items()},
            )
        )
    (e1, p1), (e2, p2) = runs
    np.testing.assert_allclose(e2, e1, rtol=1e-12)
    for k in p1:
        np.testing.assert_allclose(p2[k], p1[k], rtol=1e-12, atol=1e-14, err_msg=k)


@pytest.mark.slow  # moved to `make test-all` for the fast suite's time
def test_fit_enters_the_strategy_scope_itself():
    """Bug: fit(..., strategy=s) outside `with s.scope():` raised (the optimiser's slots were
    created outside the strategy)."""
    import numpy as np

    import deepgp_gi as dg

    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 2))
    Y = np.sin(X[:, :1])
    _one_device_strategy_run(
        lambda: dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=4, seed=0),
        (X, Y),
    )


@pytest.mark.slow  # several fits; moved out of the fast suite for its time
def test_a_convolutional_bnn_trains_under_a_strategy():
    """Bug: the distributed step had its own copy of the objective, without the image rows'
    flattening for the likelihood (a rank error in a Tile) and without the Monte Carlo
    likelihood's seeded sample; it now calls the model's one objective."""
    import numpy as np

    import deepgp_gi as dg

    rng = np.random.default_rng(1)
    images = rng.normal(size=(10, 8, 8, 1))
    labels = rng.integers(0, 3, size=(10, 1)).astype(float)
    _one_device_strategy_run(
        lambda: dg.build_conv_bnn(
            images,
            labels,
            architecture="lenet",
            posterior="global",
            num_inducing=4,
            channels=(2, 2),
            hidden=(6,),
            seed=0,
        ),
        (images, labels),
    )


def test_a_model_built_outside_the_strategy_is_a_clear_error():
    import numpy as np
    import tensorflow as tf

    import deepgp_gi as dg

    X = np.linspace(-1, 1, 8)[:, None]
    model = dg.build_deep_gp(X, X, depth=1, posterior="mean_field", num_inducing=3, seed=0)
    with pytest.raises(
        ValueError, match="strategy: the model's variables were not created under this strategy"
    ):
        dg.fit(
            model,
            (X, X),
            steps=1,
            progress=False,
            strategy=tf.distribute.OneDeviceStrategy("/cpu:0"),
        )


def _build(kind):
    import numpy as np

    import deepgp_gi as dg

    rng = np.random.default_rng(0)
    if kind == "deep_gp":  # depth 2: the hidden layer's fixed linear mean function
        X = rng.normal(size=(12, 3))
        return dg.build_deep_gp(
            X,
            np.sin(X[:, :1]),
            depth=2,
            posterior="mean_field",
            num_inducing=4,
            inner_width=2,
            seed=0,
        )
    if kind == "bnn":
        X = rng.normal(size=(12, 2))
        return dg.build_bnn(
            X, np.sin(X[:, :1]), hidden=(4,), posterior="global", num_inducing=4, seed=0
        )
    images = rng.normal(size=(10, 8, 8, 1))
    labels = rng.integers(0, 3, size=(10, 1)).astype(float)
    return dg.build_conv_bnn(
        images,
        labels,
        architecture="lenet",
        posterior="global",
        num_inducing=4,
        channels=(2, 2),
        hidden=(6,),
        seed=0,
    )


@pytest.mark.parametrize("kind", ["deep_gp", "bnn", "conv_bnn"])
def test_a_model_built_under_a_strategy_freezes_what_its_builder_froze(kind):
    """Bug: the builders froze parameters with gpflow.set_trainable(..., False), which under a
    strategy marks only the distributed wrapper (its `trainable` reads the per-device copy, still
    True): a model built in strategy.scope() listed the deep GP's fixed mean function among its
    trainable variables and print_summary showed it trainable, so GPflow's Scipy, a Keras optimiser
    or a loop of one's own trained it."""
    import gpflow
    import tensorflow as tf

    from deepgp_gi.training.loop import _trainable_variables

    alone = _build(kind)
    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        mirrored = _build(kind)

    def listing(model):
        return [(v.name, tuple(v.shape), v.trainable) for v in model.trainable_variables]

    def summary(model):
        return [
            (path, type(leaf).__name__, bool(leaf.trainable), tuple(leaf.shape))
            for path, leaf in gpflow.utilities.leaf_components(model).items()
        ]

    assert listing(mirrored) == listing(alone)
    assert summary(mirrored) == summary(alone)
    assert gpflow.utilities.tabulate_module_summary(
        mirrored
    ) == gpflow.utilities.tabulate_module_summary(alone)
    assert [v.name for v in _trainable_variables(mirrored)] == [
        v.name for v in _trainable_variables(alone)
    ]
    if kind == "deep_gp":  # the fixed mean is frozen in both, not merely absent
        frozen = [path for path, _, trainable, _ in summary(alone) if not trainable]
        assert any("mean_function.A" in path for path in frozen), frozen
        assert any("mean_function.b" in path for path in frozen), frozen


def test_fit_honours_set_trainable_on_a_model_built_under_a_strategy():
    """A gpflow.set_trainable(..., False) after building under a strategy still marks only the
    wrapper (TensorFlow's behaviour); fit reads that mark and leaves the variables alone, and
    set_trainable(..., True) on a parameter created frozen is honoured likewise."""
    import gpflow
    import tensorflow as tf

    from deepgp_gi.training.loop import _trainable_variables

    with tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        model = _build("deep_gp")
    gpflow.set_trainable(model.likelihood, False)
    gpflow.set_trainable(model.layers[0].mean_function, True)
    ids = {id(v) for v in _trainable_variables(model)}
    assert not ids & {id(v) for v in model.likelihood.variables}
    assert {id(v) for v in model.layers[0].mean_function.variables} <= ids


def _run_check(script, *args, timeout=1500):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    out = subprocess.run(
        [sys.executable, os.path.join(HERE, script), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_strategies_one_after_another_in_one_process():
    """Bug: a deep GP fit under one MirroredStrategy, then a convolutional BNN under another, failed
    in the second fit's first all-reduce ("Shape mismatch in the collective instance 100"): every
    strategy numbers its collective instances from the same start, and TensorFlow's runtime keeps
    the first strategy's shapes. Each fit (the first strategy again too) now equals its model's
    run on one device."""
    (line,) = _run_check("distributed_options_check.py", "strategies_in_turn")
    assert line["ok"], line
    assert line["fits"] == 3
    assert line["elbo_rel"] < 1e-10 and line["param_rel"] < 1e-10, line


@pytest.mark.slow
def test_a_strategy_combines_with_xla_and_natural_gradients():
    """fit(..., strategy=s, jit_compile=True) and fit(..., strategy=s, natgrad_gamma=...) on 2
    logical CPUs equal one device's run with the same options (4 steps, a last batch split
    unevenly): XLA for each model kind, natural gradients on mean-field's blocks (all layers, the
    last layer, with XLA) and on the fully-coupled q(f_M). Summation order differs from one
    device's, so equality is to round-off, not bit for bit (docs/training.md)."""
    lines = _run_check(
        "distributed_options_check.py",
        "jit_deep_gp",
        "jit_bnn",
        "jit_conv_bnn",
        "natgrad_mean_field",
        "natgrad_last_mean_field",
        "natgrad_fully_coupled",
        "natgrad_jit_mean_field",
    )
    assert len(lines) == 7
    for line in lines:
        assert line["ok"], line
        assert line["same_parameters"] and line["finite"], line
        assert line["trained"] > 1e-3, line  # the steps moved the parameters
        assert line["elbo_rel"] < 1e-10 and line["param_rel"] < 1e-10, line


def _free_ports(n):
    import socket

    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("localhost", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@pytest.mark.slow
def test_multiworker_strategy_equals_one_device():
    """MultiWorkerMirroredStrategy with two worker processes on this machine (TF_CONFIG with two
    localhost ports): a deep GP, a dense BNN, a convolutional BNN, and a deep GP with natural
    gradients and XLA each train for 4 steps as one device does on the same batches."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TF_USE_LEGACY_KERAS="1")
    ports = [str(p) for p in _free_ports(2)]
    script = os.path.join(HERE, "distributed_multiworker_check.py")
    workers = [
        subprocess.Popen(
            [sys.executable, script, str(k), *ports],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for k in range(2)
    ]
    outputs = []
    try:
        for worker in workers:
            outputs.append(worker.communicate(timeout=1500))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.communicate()
    for worker, (_, err) in zip(workers, outputs):
        assert worker.returncode == 0, err[-3000:]
    lines = [
        [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        for out, _ in outputs
    ]
    assert [line["case"] for line in lines[0]] == [
        "deep_gp",
        "bnn",
        "conv_bnn",
        "deep_gp_natgrad_jit",
    ]
    for first, second in zip(*lines):
        for line in (first, second):
            assert line["ok"], line
            assert line["replicas"] == 2 and line["same_parameters"], line
            assert line["trained"] > 1e-3, line
            assert line["elbo_rel"] < 1e-10 and line["param_rel"] < 1e-10, line
        assert first["checksum"] == second["checksum"], (
            first,
            second,
        )  # the workers hold the same parameters
