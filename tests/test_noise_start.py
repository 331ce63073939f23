"""The UCI protocol's ``noise_start``: the noise variance the likelihood starts from, on the
standardised targets (``1.0`` is the training targets' variance, the SGHMC reference code's
start)."""

import gpflow
import numpy as np
import pytest

from deepgp_gi import uci_protocol
from deepgp_gi.likelihoods import StudentT


@pytest.mark.parametrize("transform", ["exp", "softplus"])
def test_a_gaussian_starts_at_the_given_variance_and_still_learns_below_it(transform):
    cfg = uci_protocol.normalise_config(
        dict(dataset="energy", posterior="sghmc", noise_start=1.0, positive_transform=transform)
    )
    likelihood = uci_protocol.likelihood_of(cfg, y_std=3.0)  # on the standardised targets
    assert isinstance(likelihood, gpflow.likelihoods.Gaussian)
    np.testing.assert_allclose(likelihood.variance.numpy(), 1.0, rtol=1e-12)
    likelihood.variance.unconstrained_variable.assign(-1e3)  # no floor but GPflow's own
    assert likelihood.variance.numpy() < 1e-5


def test_a_student_t_starts_at_the_square_root_as_its_scale():
    cfg = uci_protocol.normalise_config(
        dict(dataset="energy", likelihood="student_t", noise_start=0.25)
    )
    likelihood = uci_protocol.likelihood_of(cfg)
    assert isinstance(likelihood, StudentT)
    np.testing.assert_allclose(likelihood.scale.numpy(), 0.5, rtol=1e-12)
    default = uci_protocol.likelihood_of(dict(cfg, noise_start=None))
    np.testing.assert_allclose(default.scale.numpy(), uci_protocol.INITIAL_NOISE_SCALE, rtol=1e-12)


def test_with_a_floor_the_start_replaces_the_default_and_must_lie_above_the_floor():
    cfg = uci_protocol.normalise_config(dict(dataset="wine", noise_floor=0.5, noise_start=0.3))
    likelihood = uci_protocol.likelihood_of(cfg, y_std=2.0)  # floor 0.125 standardised
    np.testing.assert_allclose(likelihood.variance.numpy(), 0.3, rtol=1e-12)
    likelihood.variance.unconstrained_variable.assign(-1e3)
    np.testing.assert_allclose(likelihood.variance.numpy(), 0.125, rtol=1e-12)
    with pytest.raises(ValueError, match="noise_start must lie above the noise floor"):
        uci_protocol.likelihood_of(dict(cfg, noise_start=0.1), y_std=2.0)


def test_build_model_starts_the_deep_gp_and_the_bnn_where_asked():
    cfg = dict(dataset="yacht", posterior="mean_field", depth=1, num_inducing=5, noise_start=1.0)
    model, _ = uci_protocol.build_model(cfg, 0)
    np.testing.assert_allclose(model.likelihood.variance.numpy(), 1.0, rtol=1e-12)
    plain, _ = uci_protocol.build_model(dict(cfg, noise_start=None), 0)
    np.testing.assert_allclose(plain.likelihood.variance.numpy(), 0.01, rtol=1e-12)
    bnn, _ = uci_protocol.build_model(
        dict(dataset="yacht", model="bnn", hidden=[4], num_inducing=5, noise_start=0.5), 0
    )
    np.testing.assert_allclose(bnn.likelihood.variance.numpy(), 0.5, rtol=1e-12)


def test_tables_name_the_noise_start():
    import benchmarks.medium as medium
    import benchmarks.uci as uci

    line = dict(posterior="sghmc", protocol="random", collect_step_size=0.03, noise_start=1.0)
    assert "noise start 1" in uci._protocol_marks(line)
    assert medium._family(dict(line, dataset="energy", depth=2)).endswith(
        "+collect0.03+noisestart1"
    )
    assert "+noisestart" not in medium._family(dict(line, noise_start=None, depth=2))
