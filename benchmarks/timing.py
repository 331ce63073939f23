"""The compiled training steps that ``speed.py`` and ``gpu.py`` time, and their timing.

A step is a function of no arguments that runs one training step of a model on fixed data (the
inputs of kin8nm tiled to the batch size): :func:`model_step` (Adam on the ELBO, fresh seeded noise
every call), :func:`fit_step` (the step ``fit`` trains the model with) or GPflux's DSVI deep GP
(:func:`gpflux_dsvi`). :func:`time_models` times several steps round by round.
"""

from __future__ import annotations

import time

import gpflow
import numpy as np
import tensorflow as tf

import deepgp_gi as dg

__all__ = [
    "kin8nm_inputs",
    "compiled_step",
    "model_step",
    "fit_step",
    "ours",
    "ours_bnn",
    "gpflux_dsvi",
    "raise_if_step_failed",
    "time_models",
]


def kin8nm_inputs(num_rows: int, seed: int = 0):
    """kin8nm inputs (all 8192 rows, standardised), tiled to ``num_rows``; targets from the data."""
    X, Y, _ = dg.datasets.load_uci_raw("kin8nm")
    X = (X - X.mean(0)) / X.std(0)
    Y = (Y - Y.mean(0)) / Y.std(0)
    reps = -(-num_rows // len(X))
    rng = np.random.default_rng(seed)
    idx = rng.permutation(np.tile(np.arange(len(X)), reps))[:num_rows]
    return X[idx], Y[idx]


def compiled_step(model_loss, variables, learning_rate=0.01, jit_compile=False):
    optimizer = dg.training.adam(learning_rate, variables)

    @tf.function(jit_compile=jit_compile)
    def step():
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            tape.watch(variables)
            loss = model_loss()
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    return step


def model_step(model, X, Y, jit_compile=False):
    """A compiled step of a deepgp_gi model on fixed data, fresh seeded noise every step.

    Like ``fit``'s ``TrainStep``, in both modes: every ``safe_cholesky`` reports to
    ``cholesky_checks`` and the step keeps the status in a variable on the device (no
    ``tf.debugging.Assert``, which would read a device predicate on the host every step)."""
    Xt, Yt = tf.constant(X), tf.constant(Y)
    counter = tf.Variable(0, dtype=tf.int64)
    failure = tf.Variable(
        0, dtype=tf.int64, trainable=False
    )  # int64: an int32 variable lives on the host on a GPU

    def loss():
        with dg.linalg.cholesky_checks() as checks:
            counter.assign_add(1)
            value = -model.elbo(
                (Xt, Yt),
                1,
                seed=dg.noise.SeededNoise(tf.stack([counter, tf.constant(7, tf.int64)])),
            )
        failure.assign(
            tf.where(tf.equal(failure, 0), tf.cast(checks.status(), tf.int64), failure)
        )  # the first failure's code
        return value

    step = compiled_step(loss, model.trainable_variables, jit_compile=jit_compile)
    # read between timed rounds, never inside them (CholeskyError, a tf.errors.OpError, if a
    # step failed)
    step.raise_if_failed = lambda: dg.linalg.raise_if_failed(
        failure.numpy(), context="benchmark step"
    )
    return step


def fit_step(model, X, Y, jit_compile=False, importance_samples=None, num_samples=1):
    """The step ``fit`` trains ``model`` with, on fixed data: ``TrainStep`` (Adam on the ELBO, or on
    a latent-variable model's bound with ``importance_samples`` draws of the latent variable per
    point), or ``SamplerStep`` for a sampling family (one SGHMC move of the chain, then an Adam
    step on the hyperparameters); fit's optimiser and variables, seed 0, one Monte Carlo sample,
    the step counter advancing every call."""
    from deepgp_gi.training.loop import _is_sampler, _trainable_variables
    from deepgp_gi.training.step import SamplerStep, TrainStep

    variables = _trainable_variables(model)
    counter = tf.Variable(0, dtype=tf.int64, trainable=False)
    kind = SamplerStep if _is_sampler(model) else TrainStep
    train_step = kind(
        model,
        dg.training.adam(0.01, variables),
        variables,
        counter,
        num_samples=num_samples,
        seed=0,
        jit_compile=jit_compile,
        importance_samples=importance_samples,
    )
    Xt, Yt = tf.constant(X), tf.constant(Y)
    calls = iter(range(1 << 62))

    def step():
        return train_step(tf.constant(next(calls), tf.int64), Xt, Yt)

    step.raise_if_failed = train_step.raise_if_failed
    # the traced graph of the compiled step, for the static cost of gpu.py's step_cost
    step.get_concrete_function = lambda: train_step._compiled.get_concrete_function(
        tf.constant(0, tf.int64), Xt, Yt, train_step.kl_weight_tensor()
    )
    return step


def ours(X, Y, depth, posterior, num_inducing, jit_compile=False, **options):
    model = dg.build_deep_gp(
        X, Y, depth=depth, posterior=posterior, num_inducing=num_inducing, seed=0, **options
    )
    return model_step(model, X, Y, jit_compile)


def ours_bnn(X, Y, posterior, num_inducing):
    model = dg.build_bnn(
        X, Y, hidden=(50, 50), posterior=posterior, num_inducing=num_inducing, seed=0
    )
    return model_step(model, X, Y)


def gpflux_dsvi(X, Y, depth, num_inducing, jit_compile=False):
    """GPflux's DSVI deep GP at the same configuration (its own helpers, whitened, Identity/PCA
    inner mean functions, width min(30, D), SE-ARD kernels, Gaussian likelihood); its compiled
    step, with XLA if ``jit_compile``."""
    import gpflux

    N, D = X.shape
    width = min(30, D)
    dims = [D] + [width] * (depth - 1) + [Y.shape[1]]
    Z = dg.builders.kmeans_inducing_inputs(X, num_inducing, 0)
    layers, F, Zl = [], X, Z
    for l in range(depth):
        d_in, d_out = dims[l], dims[l + 1]
        kernel = gpflux.helpers.construct_basic_kernel(
            gpflow.kernels.SquaredExponential(variance=2.0, lengthscales=np.full(d_in, 2.0)),
            output_dim=d_out,
            share_hyperparams=True,
        )
        iv = gpflux.helpers.construct_basic_inducing_variables(
            num_inducing, d_in, d_out, share_variables=True, z_init=Zl
        )
        inner = l < depth - 1
        mean = (
            gpflux.helpers.construct_mean_function(F, d_in, d_out)
            if inner
            else gpflow.mean_functions.Zero()
        )
        layers.append(
            gpflux.layers.GPLayer(
                kernel, iv, num_data=N, mean_function=mean, num_latent_gps=d_out, verbose=False
            )
        )
        if inner:
            F, Zl = np.asarray(mean(F)), np.asarray(mean(Zl))
    likelihood = gpflux.layers.LikelihoodLayer(gpflow.likelihoods.Gaussian(0.01))
    dgp = gpflux.models.DeepGP(layers, likelihood)
    Xt, Yt = tf.constant(X), tf.constant(Y)

    def loss():
        return -dgp.elbo((Xt, Yt))

    return compiled_step(loss, dgp.trainable_variables, jit_compile=jit_compile)


def raise_if_step_failed(step) -> None:
    """Raise the ``CholeskyError`` (a ``tf.errors.OpError``) a :func:`model_step` step recorded;
    steps without a record (GPflux's) pass."""
    getattr(step, "raise_if_failed", lambda: None)()


def time_models(makers, rounds, steps_per_round, check_failures=True):
    """Median ms per step of each maker's step, the models alternated round by round; with
    ``check_failures`` a step that recorded a failed factorisation raises after the rounds."""
    steps = {name: make() for name, make in makers.items()}
    for step in steps.values():  # trace and warm up
        for _ in range(3):
            step()
    times = {name: [] for name in steps}
    for _ in range(rounds):
        for name, step in steps.items():
            t0 = time.perf_counter()
            for _ in range(steps_per_round):
                loss = step()
            loss.numpy()
            times[name].append((time.perf_counter() - t0) / steps_per_round * 1e3)
    for step in steps.values() if check_failures else ():
        raise_if_step_failed(step)
    return {name: float(np.median(v)) for name, v in times.items()}
