"""The UCI protocol's ``noise_floor``: the lowest noise variance a Gaussian likelihood may learn, in
the squared original units of the targets."""

import gpflow
import numpy as np
import pytest

from deepgp_gi import uci_protocol


def test_without_a_floor_the_builders_default_gaussian_is_used():
    plain = uci_protocol.normalise_config(dict(dataset="wine", posterior="sghmc", depth=2))
    assert uci_protocol.likelihood_of(plain) is None


def test_a_noise_floor_is_refused_for_a_student_t_likelihood():
    with pytest.raises(ValueError, match="noise_floor applies to the Gaussian likelihood only"):
        uci_protocol.normalise_config(dict(dataset="wine", likelihood="student_t", noise_floor=0.1))


@pytest.mark.parametrize("transform", ["exp", "softplus"])
def test_the_floor_bounds_the_learned_noise_variance_in_original_units(transform):
    """However far the unconstrained variable goes down, the variance stays at the floor divided by
    ``y_std ** 2`` (the targets the model sees are standardised); it starts 0.01 above it."""
    cfg = uci_protocol.normalise_config(
        dict(dataset="wine", posterior="mean_field", noise_floor=0.25, positive_transform=transform)
    )
    likelihood = uci_protocol.likelihood_of(cfg, y_std=2.0)
    assert isinstance(likelihood, gpflow.likelihoods.Gaussian)
    np.testing.assert_allclose(likelihood.variance.numpy(), 0.0625 + 0.01, rtol=1e-12)
    likelihood.variance.unconstrained_variable.assign(-1e3)
    np.testing.assert_allclose(likelihood.variance.numpy(), 0.0625, rtol=1e-12)


def test_build_model_floors_the_noise_on_the_data_sets_scale():
    cfg = dict(dataset="wine", posterior="mean_field", depth=1, num_inducing=5, noise_floor=1 / 12)
    model, data = uci_protocol.build_model(cfg, 0)
    model.likelihood.variance.unconstrained_variable.assign(-1e3)
    # in the original units the noise cannot fall below the variance of rounding to integers
    np.testing.assert_allclose(
        model.likelihood.variance.numpy() * data.y_std**2, 1 / 12, rtol=1e-12
    )
    unfloored, _ = uci_protocol.build_model(dict(cfg, noise_floor=None), 0)
    unfloored.likelihood.variance.unconstrained_variable.assign(-1e3)
    assert unfloored.likelihood.variance.numpy() < 1e-5


def test_tables_name_the_noise_floor():
    import benchmarks.medium as medium
    import benchmarks.uci as uci

    line = dict(posterior="sghmc", protocol="random", collect_step_size=0.03, noise_floor=1 / 12)
    assert "noise floor 0.083" in uci._protocol_marks(line)
    assert medium._family(dict(line, dataset="wine", depth=2)).endswith("+collect0.03+floor0.083")
    assert "+floor" not in medium._family(dict(line, noise_floor=None, dataset="wine", depth=2))


def test_the_noise_variance_is_read_in_original_units_and_only_for_a_gaussian():
    cfg = dict(dataset="wine", posterior="mean_field", depth=1, num_inducing=5)
    model, data = uci_protocol.build_model(cfg, 0)
    model.likelihood.variance.assign(0.04)
    assert uci_protocol.noise_variance_of(model, data.y_std) == pytest.approx(
        0.04 * data.y_std**2, rel=1e-12
    )
    student_t, _ = uci_protocol.build_model(dict(cfg, likelihood="student_t"), 0)
    assert uci_protocol.noise_variance_of(student_t, data.y_std) is None


@pytest.mark.slow  # two short run_split calls: `make test-all`
def test_run_split_records_a_noise_variance_that_stays_above_its_floor():
    """A floor far above the noise yacht's fit wants holds the learned variance at or above it
    (the record's ``noise_variance``, original units); without one the variance falls below it."""
    cfg = dict(dataset="yacht", posterior="mean_field", depth=1, steps=200, num_inducing=5)
    cfg.update(test_samples=4, learning_rate=0.05)
    plain = uci_protocol.run_split(cfg, 0)
    floor = 4.0 * plain["noise_variance"]
    floored = uci_protocol.run_split(dict(cfg, noise_floor=floor), 0)
    assert floored["noise_floor"] == pytest.approx(floor)
    assert floor <= floored["noise_variance"] < plain["noise_variance"] + floor


def test_a_bnn_with_a_floor_starts_its_noise_where_the_bnn_default_does_above_the_floor():
    from deepgp_gi.bnn import DEFAULT_BNN_NOISE_VARIANCE

    cfg = uci_protocol.normalise_config(dict(dataset="wine", model="bnn", noise_floor=0.5))
    likelihood = uci_protocol.likelihood_of(cfg, y_std=1.0)
    np.testing.assert_allclose(
        likelihood.variance.numpy(), 0.5 + DEFAULT_BNN_NOISE_VARIANCE, rtol=1e-12
    )
    likelihood.variance.unconstrained_variable.assign(-1e3)
    np.testing.assert_allclose(likelihood.variance.numpy(), 0.5, rtol=1e-12)
