"""Run in a fresh process (logical devices must be set before TensorFlow starts): ``fit`` options
under a MirroredStrategy over 2 logical CPU devices against one device with the same options --
``jit_compile=True``, ``natgrad_gamma`` and both -- and several strategies trained one after another
in one process (a deep GP under one strategy, then a convolutional BNN under another, then the first
again). Prints one JSON line per case; tests/test_distributed.py asserts on them.

Usage: ``distributed_options_check.py [case ...]`` (default: every case)."""

import json
import os
import sys

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
import tensorflow as tf

cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

# E402 (import not at the top) does not apply below: these imports follow the device set-up on
# purpose, as the module docstring says
import gpflow  # noqa: E402
import numpy as np  # noqa: E402

import deepgp_gi as dg  # noqa: E402
from distributed_models import bnn, conv_bnn, deep_gp  # noqa: E402

DEVICES = ["/cpu:0", "/cpu:1"]

# name: (builder, fit options); batches of 6 from 21 rows (16 images): a last batch of 3 (4) rows
CASES = {
    "jit_deep_gp": (deep_gp, dict(jit_compile=True)),
    "jit_bnn": (bnn, dict(jit_compile=True)),
    "jit_conv_bnn": (conv_bnn, dict(jit_compile=True)),
    "natgrad_mean_field": (deep_gp, dict(natgrad_gamma=0.1)),
    "natgrad_last_mean_field": (deep_gp, dict(natgrad_gamma=0.5, natgrad_layers="last")),
    "natgrad_fully_coupled": (
        lambda: deep_gp("fully_coupled", precondition_offdiagonal=False),
        dict(natgrad_gamma=0.1),
    ),
    "natgrad_jit_mean_field": (deep_gp, dict(natgrad_gamma=0.1, jit_compile=True)),
}


def parameters(model) -> dict:
    return {k: np.asarray(v.numpy()) for k, v in gpflow.utilities.parameter_dict(model).items()}


def train(build, options, strategy=None, steps=4):
    if strategy is None:
        model, data = build()
    else:
        with strategy.scope():
            model, data = build()
    history = dg.fit(
        model,
        data,
        steps=steps,
        batch_size=6,
        seed=3,
        progress=False,
        log_every=1,
        strategy=strategy,
        **options,
    )
    return np.array(history.elbo), parameters(model)


def relative_gap(a: dict, b: dict) -> float:
    return max(
        float(np.max(np.abs(a[k] - b[k]), initial=0.0) / (1.0 + np.max(np.abs(a[k]), initial=0.0)))
        for k in a
    )


def compare(name, build, options):
    initial = parameters(build()[0])
    e1, p1 = train(build, options)
    e2, p2 = train(build, options, tf.distribute.MirroredStrategy(DEVICES))
    return dict(
        case=name,
        ok=True,
        same_parameters=sorted(p1) == sorted(p2),
        finite=bool(np.all(np.isfinite(e2))),
        elbo_rel=float(np.max(np.abs(e1 - e2) / np.abs(e1))),
        param_rel=relative_gap(p1, p2),
        trained=relative_gap(initial, p1),
    )


def strategies_in_turn():
    """A deep GP under one strategy, a convolutional BNN under a second (the second fit used to
    fail on its first all-reduce, reusing the first strategy's collective keys), the first
    strategy again, and each run equal to a run of that model in a process of its own strategy."""
    first, second = tf.distribute.MirroredStrategy(DEVICES), tf.distribute.MirroredStrategy(DEVICES)
    runs = [
        train(deep_gp, {}, first, steps=3),
        train(conv_bnn, {}, second, steps=3),
        train(bnn, {}, first, steps=3),
    ]
    alone = [train(deep_gp, {}, steps=3), train(conv_bnn, {}, steps=3), train(bnn, {}, steps=3)]
    return dict(
        case="strategies_in_turn",
        ok=True,
        fits=len(runs),
        elbo_rel=max(
            float(np.max(np.abs(a[0] - b[0]) / np.abs(a[0]))) for a, b in zip(alone, runs)
        ),
        param_rel=max(relative_gap(a[1], b[1]) for a, b in zip(alone, runs)),
    )


for name in sys.argv[1:] or ["strategies_in_turn"] + list(CASES):
    try:
        line = strategies_in_turn() if name == "strategies_in_turn" else compare(name, *CASES[name])
    except Exception as err:  # reported, asserted on by the test
        line = dict(case=name, ok=False, error=f"{type(err).__name__}: {str(err)[:800]}")
    print(json.dumps(line), flush=True)
