"""Every family's ELBO on fixed noise equals the recorded value to 1e-10
(tests/family_reference.py)."""

import json

import pytest

from family_reference import REFERENCE, mismatches, trained_values, untrained_values


@pytest.fixture(scope="module")
def recorded():
    return json.loads(REFERENCE.read_text())


def test_every_deep_gp_family_untrained_matches_the_record(recorded):
    current = untrained_values(("deep_gp", "latent"))
    assert len(current) == 33
    assert mismatches(recorded, current) == []


@pytest.mark.slow  # 31 BNN and convolutional models: `make test-all`
def test_every_bnn_family_untrained_matches_the_record(recorded):
    current = untrained_values(("bnn", "conv"))
    assert len(current) == 31
    assert mismatches(recorded, current) == []


def test_an_unknown_group_is_named():
    with pytest.raises(ValueError, match=r"groups: \['gp'\] are not among"):
        untrained_values(("gp",))


@pytest.mark.slow
def test_every_deep_gp_family_after_training_matches_the_record(recorded):
    current = trained_values()
    assert len(current) == 16
    assert mismatches(recorded, current) == []
