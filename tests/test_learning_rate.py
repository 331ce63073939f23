"""fit's learning-rate schedules and the ``learning_rate_decay`` configuration key."""

import gpflow
import numpy as np
import pytest

import deepgp_gi as dg
from deepgp_gi.uci_protocol import learning_rate_of, normalise_config
from fit_checks import parameter_values, toy_regression

ExponentialDecay = gpflow.keras.tf_keras.optimizers.schedules.ExponentialDecay


def _fit(X, Y, learning_rate, steps=6, **kwargs):
    model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=6, seed=0)
    history = dg.fit(
        model,
        (X, Y),
        steps=steps,
        batch_size=10,
        seed=1,
        progress=False,
        log_every=1,
        learning_rate=learning_rate,
        **kwargs,
    )
    return model, history


@pytest.mark.slow  # several fits; moved out of the fast suite for its time
def test_a_schedule_changes_the_run_from_its_first_decay_on_and_not_before(rng):
    X, Y = toy_regression(rng, 30)
    _, constant = _fit(X, Y, 0.01)
    _, flat = _fit(X, Y, ExponentialDecay(0.01, decay_steps=2, decay_rate=1.0, staircase=True))
    _, decayed = _fit(X, Y, ExponentialDecay(0.01, decay_steps=3, decay_rate=0.1, staircase=True))
    # a rate of 1 is the constant learning rate, bit for bit
    np.testing.assert_array_equal(flat.elbo, constant.elbo)
    # steps 0-2 use 0.01 (the ELBO logged after step t is evaluated before step t's update lands in
    # the next entry), from step 3 on 0.001: the first four entries agree, the rest do not
    np.testing.assert_array_equal(decayed.elbo[:4], constant.elbo[:4])
    assert all(a != b for a, b in zip(decayed.elbo[4:], constant.elbo[4:]))


@pytest.mark.slow  # several fits; moved out of the fast suite for its time
def test_a_resumed_run_continues_the_schedule_bit_for_bit(rng, tmp_path):
    X, Y = toy_regression(rng, 30)
    schedule = ExponentialDecay(0.02, decay_steps=2, decay_rate=0.5, staircase=True)
    whole, _ = _fit(X, Y, schedule, steps=8)
    _fit(X, Y, schedule, steps=4, checkpoint_dir=tmp_path, checkpoint_every=4)
    resumed, _ = _fit(X, Y, schedule, steps=8, checkpoint_dir=tmp_path, checkpoint_every=4)
    for a, b in zip(parameter_values(whole), parameter_values(resumed)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "bad, message",
    [
        (0.0, "learning_rate must be"),
        (
            ExponentialDecay(0.0, decay_steps=2, decay_rate=0.5),
            "learning_rate is a schedule whose value at step 0 is 0",
        ),
    ],
)
def test_a_bad_learning_rate_is_refused_before_training(rng, bad, message):
    X, Y = toy_regression(rng, 20)
    model = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=5, seed=0)
    with pytest.raises(ValueError, match=message):
        dg.fit(model, (X, Y), steps=2, learning_rate=bad, progress=False)


def test_the_decay_key_gives_lindingers_staircase():
    cfg = normalise_config(
        {"dataset": "concrete", "learning_rate": 0.005, "learning_rate_decay": [0.98, 1000]}
    )
    assert cfg["learning_rate_decay"] == [0.98, 1000]
    schedule = learning_rate_of(cfg)
    np.testing.assert_allclose(
        [float(schedule(t)) for t in (0, 999, 1000, 2500, 19999)],
        [0.005, 0.005, 0.005 * 0.98, 0.005 * 0.98**2, 0.005 * 0.98**19],
        rtol=1e-6,
    )
    assert learning_rate_of(normalise_config({"dataset": "concrete"})) == 0.01


@pytest.mark.parametrize("bad", [[0.98], [1.5, 1000], [0.98, 0], [0.98, 10.5], 0.98])
def test_a_bad_decay_key_names_it(bad):
    with pytest.raises(ValueError, match="learning_rate_decay must be"):
        normalise_config({"dataset": "concrete", "learning_rate_decay": bad})
