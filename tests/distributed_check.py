"""Run in a fresh process (logical devices must be set before TensorFlow starts): a
MirroredStrategy over 2 logical CPU devices against one device, for one posterior family.
Prints one JSON line; tests/test_distributed.py asserts on it."""

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
from deepgp_gi.training.loop import _trainable_variables  # noqa: E402
from deepgp_gi.training.step import DistributedStep, TrainStep  # noqa: E402

posterior = sys.argv[1]
rng = np.random.default_rng(0)
X = rng.normal(size=(41, 3))
Y = np.sin(X[:, :1]) + 0.1 * rng.normal(size=(41, 1))
Xb, Yb = tf.constant(X[:20]), tf.constant(Y[:20])
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
results, tempered = {}, {}
for name, scope in (("one", tf.distribute.get_strategy()), ("two", strategy)):
    with scope.scope():
        model = dg.build_deep_gp(
            X, Y, depth=2, posterior=posterior, num_inducing=7, inner_width=2, seed=0
        )
        variables = _trainable_variables(model)
        optimizer = dg.training.adam(0.01, variables)
        counter = tf.Variable(0, dtype=tf.int64)
        options = dict(num_samples=3, seed=5)
        if name == "one":
            step = TrainStep(model, optimizer, variables, counter, **options)
        else:
            step = DistributedStep(
                model, optimizer, variables, counter, strategy=strategy, **options
            )
        elbo, grads = step.loss_and_gradients(tf.constant(4, tf.int64), Xb, Yb)
        # KL tempering: each replica subtracts kl_weight / R of the KL; the ELBO stays untempered
        tempered_elbo, tempered_grads = step.loss_and_gradients(
            tf.constant(4, tf.int64), Xb, Yb, 0.3
        )
        # variable names repeat across layers ("q_mu:0", "softplus:0"): key by position too
        names = [f"{i}/{v.name}" for i, v in enumerate(variables)]
        # 41 rows in batches of 20: the third batch has one row, so one replica gets none
        history = dg.fit(
            model,
            (X, Y),
            steps=6,
            batch_size=20,
            seed=3,
            progress=False,
            log_every=1,
            strategy=strategy if name == "two" else None,
        )
        params = {k: v.numpy() for k, v in gpflow.utilities.parameter_dict(model).items()}
        if name == "two":
            # checkpoint after 3 steps under the strategy, then resume in a fresh model to step 6
            import tempfile

            ckpt = tempfile.mkdtemp()
            first = dg.build_deep_gp(
                X, Y, depth=2, posterior=posterior, num_inducing=7, inner_width=2, seed=0
            )
            dg.fit(
                first,
                (X, Y),
                steps=3,
                batch_size=20,
                seed=3,
                progress=False,
                log_every=1,
                strategy=strategy,
                checkpoint_dir=ckpt,
                checkpoint_every=3,
            )
            resumed = dg.build_deep_gp(
                X, Y, depth=2, posterior=posterior, num_inducing=7, inner_width=2, seed=0
            )
            dg.fit(
                resumed,
                (X, Y),
                steps=6,
                batch_size=20,
                seed=3,
                progress=False,
                log_every=1,
                strategy=strategy,
                checkpoint_dir=ckpt,
                checkpoint_every=3,
            )
            resumed_params = {
                k: v.numpy() for k, v in gpflow.utilities.parameter_dict(resumed).items()
            }
            resume_rel = max(
                float(
                    np.max(np.abs(params[k] - resumed_params[k]))
                    / (1.0 + np.max(np.abs(params[k])))
                )
                for k in params
            )
    results[name] = (
        float(elbo),
        {n: g.numpy() for n, g in zip(names, grads)},
        history.elbo,
        params,
    )
    tempered[name] = (float(tempered_elbo), {n: g.numpy() for n, g in zip(names, tempered_grads)})


def gradient_rel(one, two):
    """Largest difference of each variable's gradient relative to that gradient's largest entry.

    A gradient that is zero in exact arithmetic (at this initialisation mean-field's inner q_mu:
    the last layer's q(U) is its prior, so the output does not depend on the inner layer's value)
    is round-off of about 1e-13 whose relative difference means nothing; its scale is floored at
    1e-8 of the largest gradient entry of any variable, so it still has to agree to about 1e-18
    of that (a wrong gradient of any size fails)."""
    floor = 1e-8 * max(float(np.max(np.abs(g))) for g in one.values())
    return max(
        float(np.max(np.abs(one[k] - two[k])) / max(float(np.max(np.abs(one[k]))), floor))
        for k in one
    )


(e1, g1, h1, p1), (e2, g2, h2, p2) = results["one"], results["two"]
(te1, tg1), (te2, tg2) = tempered["one"], tempered["two"]
print(
    json.dumps(
        dict(
            elbo_rel=abs(e1 - e2) / abs(e1),
            grad_rel=gradient_rel(g1, g2),
            same_variables=sorted(g1) == sorted(g2),
            fit_elbo_rel=max(abs(a - b) / abs(a) for a, b in zip(h1, h2)),
            param_rel=max(
                float(np.max(np.abs(p1[k] - p2[k])) / (1.0 + np.max(np.abs(p1[k])))) for k in p1
            ),
            replicas=strategy.num_replicas_in_sync,
            resume_rel=resume_rel,
            tempered_elbo_equals_untempered=te1 == e1 and te2 == e2,
            tempered_grad_rel=gradient_rel(tg1, tg2),
            tempering_changes_grads=max(float(np.max(np.abs(tg1[k] - g1[k]))) for k in g1) > 1e-6,
        )
    )
)
