"""One worker of a two-worker ``MultiWorkerMirroredStrategy`` on this machine (one CPU device
each): every model kind trained for a few steps under the strategy (model built in its scope,
``fit`` called outside it, as the README shows) and, in the same process, on one device without a
strategy, from the same initial values, batches and seed. Prints one JSON line per case;
tests/test_distributed.py starts both workers and asserts on their lines.

Usage: ``distributed_multiworker_check.py INDEX PORT0 PORT1 [case ...]`` (default: every case)."""

import json
import os
import sys

index, ports = int(sys.argv[1]), sys.argv[2:4]
os.environ["TF_CONFIG"] = json.dumps(
    {
        "cluster": {"worker": [f"localhost:{p}" for p in ports]},
        "task": {"type": "worker", "index": index},
    }
)
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
# E402 (import not at the top) does not apply to this file's imports: TensorFlow after TF_CONFIG is
# set, the rest after the strategy is made
import tensorflow as tf  # noqa: E402

# the strategy first: it configures the collective ops, which must precede any other TensorFlow work
strategy = tf.distribute.MultiWorkerMirroredStrategy()

import gpflow  # noqa: E402
import numpy as np  # noqa: E402

import deepgp_gi as dg  # noqa: E402
from distributed_models import bnn, conv_bnn, deep_gp  # noqa: E402

# name: (builder, fit options); batches of 6 from 21 rows (16 images): a last batch of 3 (4) rows,
# so one worker holds 1 row and the other 2 in the deep GP's and dense BNN's last step
CASES = {
    "deep_gp": (deep_gp, {}),
    "bnn": (bnn, {}),
    "conv_bnn": (conv_bnn, {}),
    "deep_gp_natgrad_jit": (deep_gp, dict(natgrad_gamma=0.1, jit_compile=True)),
}


def parameters(model) -> dict:
    return {k: np.asarray(v.numpy()) for k, v in gpflow.utilities.parameter_dict(model).items()}


def train(build, options, use_strategy):
    if use_strategy:
        with strategy.scope():
            model, data = build()
    else:
        model, data = build()
    history = dg.fit(
        model,
        data,
        steps=4,
        batch_size=6,
        seed=3,
        progress=False,
        log_every=1,
        strategy=strategy if use_strategy else None,
        **options,
    )
    return np.array(history.elbo), parameters(model)


def relative_gap(a: dict, b: dict) -> float:
    return max(
        float(np.max(np.abs(a[k] - b[k]), initial=0.0) / (1.0 + np.max(np.abs(a[k]), initial=0.0)))
        for k in a
    )


for name in sys.argv[4:] or list(CASES):
    build, options = CASES[name]
    try:
        initial = parameters(build()[0])
        e1, p1 = train(build, options, False)
        e2, p2 = train(build, options, True)
        line = dict(
            case=name,
            worker=index,
            ok=True,
            replicas=strategy.num_replicas_in_sync,
            same_parameters=sorted(p1) == sorted(p2),
            elbo_rel=float(np.max(np.abs(e1 - e2) / np.abs(e1))),
            param_rel=relative_gap(p1, p2),
            trained=relative_gap(initial, p1),
            checksum=float(sum(np.sum(v) for v in p2.values())),
        )
    except Exception as err:  # reported, asserted on by the test
        line = dict(
            case=name, worker=index, ok=False, error=f"{type(err).__name__}: {str(err)[:800]}"
        )
    print(json.dumps(line), flush=True)
