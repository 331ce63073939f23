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
