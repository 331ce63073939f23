"""Run in a fresh process (logical devices must be set before TensorFlow starts): every family of
every table -- deep GP, dense BNN, convolutional BNN, and a Softmax likelihood -- trained for a few
Adam steps under a MirroredStrategy over 2 logical CPU devices and on one device, from the same
initial values and seed. ``fit(..., strategy=s)`` is called outside ``with s.scope():`` (only the
model is built inside), as the README shows. Prints one JSON line per family;
tests/test_distributed.py asserts on them."""

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
from deepgp_gi.bnn import BNN_POSTERIORS  # noqa: E402
from deepgp_gi.conv_bnn import CONV_POSTERIORS  # noqa: E402
from deepgp_gi.families import DEEP_GP_FAMILIES  # noqa: E402

rng = np.random.default_rng(0)
X = rng.normal(size=(21, 2))
Y = np.sin(X[:, :1]) + 0.1 * rng.normal(size=(21, 1))
labels = (X[:, :1] > 0).astype(float) + (X[:, 1:] > 0)  # 3 classes
images = rng.normal(size=(16, 8, 8, 1))
image_labels = rng.integers(0, 3, size=(16, 1)).astype(float)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])


def build(kind, family):
    if kind == "deep_gp":
        return dg.build_deep_gp(
            X, Y, depth=2, posterior=family, num_inducing=5, inner_width=2, seed=0
        ), (X, Y)
    if kind == "deep_gp_softmax":
        lik = gpflow.likelihoods.Softmax(3)
        return dg.build_deep_gp(
            X,
            labels,
            depth=2,
            posterior=family,
            num_inducing=5,
            inner_width=2,
            likelihood=lik,
            seed=0,
        ), (X, labels)
    if kind == "bnn":
        return dg.build_bnn(X, Y, hidden=(4,), posterior=family, num_inducing=5, seed=0), (X, Y)
    model = dg.build_conv_bnn(
        images,
        image_labels,
        architecture="lenet",
        posterior=family,
        num_inducing=4,
        channels=(2, 2),
        hidden=(6,),
        seed=0,
    )
    return model, (images, image_labels)


def train(kind, family, use_strategy):
    if use_strategy:
        with strategy.scope():
            model, data = build(kind, family)
    else:
        model, data = build(kind, family)
    # batches of 6 from 21 rows (16 images): a last batch with 3 (4) rows, split over 2 replicas
    history = dg.fit(
        model,
        data,
        steps=4,
        batch_size=6,
        seed=3,
        progress=False,
        log_every=1,
        strategy=strategy if use_strategy else None,
    )
    params = {k: np.asarray(v.numpy()) for k, v in gpflow.utilities.parameter_dict(model).items()}
    return np.array(history.elbo), params


def relative_gap(a: dict, b: dict) -> float:
    return max(
        float(np.max(np.abs(a[k] - b[k]), initial=0.0) / (1.0 + np.max(np.abs(a[k]), initial=0.0)))
        for k in a
    )


kinds = sys.argv[1:] or ["deep_gp", "deep_gp_softmax", "bnn", "conv_bnn"]
tables = {
    "deep_gp": list(DEEP_GP_FAMILIES),
    "deep_gp_softmax": ["mean_field", "global"],
    "bnn": list(BNN_POSTERIORS),
    "conv_bnn": list(CONV_POSTERIORS),
}
for kind in kinds:
    for family in tables[kind]:
        if kind == "deep_gp" and getattr(DEEP_GP_FAMILIES[family], "is_sampler", False):
            # a sampling family is not trained data-parallel yet: fit refuses the strategy up front
            with strategy.scope():
                model, data = build(kind, family)
            try:
                dg.fit(model, data, steps=1, progress=False, strategy=strategy)
                line = dict(
                    kind=kind,
                    family=family,
                    ok=False,
                    error="fit accepted a strategy for a sampler",
                )
            except ValueError as err:
                line = dict(kind=kind, family=family, ok=True, refused=str(err)[:200])
            print(json.dumps(line), flush=True)
            continue
        try:
            initial = {
                k: np.asarray(v.numpy())
                for k, v in gpflow.utilities.parameter_dict(build(kind, family)[0]).items()
            }
            e1, p1 = train(kind, family, False)
            e2, p2 = train(kind, family, True)
            line = dict(
                kind=kind,
                family=family,
                ok=True,
                same_parameters=sorted(p1) == sorted(p2),
                elbo_rel=float(np.max(np.abs(e1 - e2) / np.abs(e1))),
                param_rel=relative_gap(p1, p2),
                trained=relative_gap(initial, p1),
            )
        except Exception as err:  # reported, asserted on by the test
            line = dict(
                kind=kind, family=family, ok=False, error=f"{type(err).__name__}: {str(err)[:500]}"
            )
        print(json.dumps(line), flush=True)
