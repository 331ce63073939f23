"""Repeated fit calls on one model: one compiled step, not one per call.

Every trace of a training step stays in memory for the rest of the process (TensorFlow's global
gradient registry of graph-mode ``tf.custom_gradient`` calls, TensorFlow Probability's global
bijector cache), so a fit that traced a new step per call grew by a traced graph per call."""

import gc

import numpy as np
import pytest
from tensorflow.python.framework.func_graph import FuncGraph

import deepgp_gi as dg
from deepgp_gi.training.reuse import clear_cached_steps
from deepgp_gi.training.step import TrainStep
from fit_checks import parameter_values, toy_regression


def live(kind) -> int:
    gc.collect()
    return sum(isinstance(o, kind) for o in gc.get_objects())


@pytest.mark.slow  # repeated fits
@pytest.mark.parametrize("with_checkpoints", [False, True])
def test_repeated_fit_calls_keep_a_fixed_number_of_graphs_and_steps(
    rng, tmp_path, with_checkpoints
):
    X, Y = toy_regression(rng, 40)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=5, seed=0)
    counts = {}
    for call in range(1, 11):
        # with checkpoints: one run resumed call after call, two more steps each time
        dg.fit(
            model,
            (X, Y),
            steps=2 * call if with_checkpoints else 2,
            checkpoint_dir=tmp_path if with_checkpoints else None,
            batch_size=20,
            seed=1,
            progress=False,
            log_every=1,
        )
        if call in (3, 10):
            counts[call] = (live(FuncGraph), live(TrainStep))
    assert counts[10] == counts[3]
    assert counts[3][1] >= 1


@pytest.mark.slow  # two fits (about 9 s on two cores)
def test_a_reused_step_gives_the_numbers_of_a_new_one(rng):
    X, Y = toy_regression(rng, 40)

    def run(reuse: bool):
        model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=5, seed=0)
        kwargs = dict(batch_size=20, seed=1, progress=False, log_every=1)
        dg.fit(model, (X, Y), steps=3, **kwargs)
        if not reuse:
            clear_cached_steps(model)
        history = dg.fit(model, (X, Y), steps=3, learning_rate=0.05, **kwargs)
        return parameter_values(model), history.elbo

    (reused, elbo_reused), (new, elbo_new) = run(True), run(False)
    assert elbo_reused == elbo_new
    assert len(reused) == len(new)
    for a, b in zip(reused, new):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # four fits of two models
def test_another_configuration_builds_another_step(rng):
    X, Y = toy_regression(rng, 40)
    model = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=5, seed=0)
    kwargs = dict(steps=1, batch_size=20, progress=False)
    dg.fit(model, (X, Y), seed=1, **kwargs)
    before = live(TrainStep)
    dg.fit(model, (X, Y), seed=1, **kwargs)
    assert live(TrainStep) == before
    dg.fit(model, (X, Y), seed=2, **kwargs)  # the seed is traced into the step
    assert live(TrainStep) == before + 1
