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
    out = subprocess.run([sys.executable, os.path.join(HERE, "distributed_check.py"), posterior],
                         capture_output=True, text=True, env=env, timeout=600)
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
    out = subprocess.run([sys.executable, os.path.join(HERE, "distributed_families_check.py")],
                         capture_output=True, text=True, env=env, timeout=1500)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    kinds = {line["kind"] for line in lines}
    assert kinds == {"deep_gp", "deep_gp_softmax", "bnn", "conv_bnn"}
    for line in lines:
        assert line["ok"], line
        if "refused" in line:  # a sampling family: fit refuses a strategy before training, naming it
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
        history = dg.fit(model, data, steps=3, batch_size=5, seed=2, progress=False, log_every=1, strategy=strategy)
        runs.append((np.array(history.elbo),
                     {k: v.numpy() for k, v in gpflow.utilities.parameter_dict(model).items()}))
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
    _one_device_strategy_run(lambda: dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=4,
                                                      seed=0), (X, Y))


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
    _one_device_strategy_run(lambda: dg.build_conv_bnn(images, labels, architecture="lenet", posterior="global",
                                                       num_inducing=4, channels=(2, 2), hidden=(6,), seed=0),
                             (images, labels))


def test_a_model_built_outside_the_strategy_is_a_clear_error():
    import numpy as np
    import tensorflow as tf

    import deepgp_gi as dg

    X = np.linspace(-1, 1, 8)[:, None]
    model = dg.build_deep_gp(X, X, depth=1, posterior="mean_field", num_inducing=3, seed=0)
    with pytest.raises(ValueError, match="strategy: the model's variables were not created under this strategy"):
        dg.fit(model, (X, X), steps=1, progress=False, strategy=tf.distribute.OneDeviceStrategy("/cpu:0"))
