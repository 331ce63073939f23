"""The UCI protocol's ``collect_step_size``: a sampling family's chain step while ``run_split``
collects the sample set (``collect_samples(..., step_size=...)``)."""

import numpy as np
import pytest

from deepgp_gi import uci_protocol
from deepgp_gi.posteriors.sghmc import STEP_SIZE


def test_a_collection_step_is_normalised_and_a_line_without_one_keeps_its_key():
    base = dict(dataset="energy", posterior="sghmc", depth=2)
    cfg = uci_protocol.normalise_config(dict(base, collect_step_size=3e-2))
    assert cfg["collect_step_size"] == 0.03 and isinstance(cfg["collect_step_size"], float)
    plain = uci_protocol.normalise_config(base)
    assert plain["collect_step_size"] is None
    # a line written before the key is the same configuration as one written after without it
    old = {k: v for k, v in plain.items() if k != "collect_step_size"}
    assert uci_protocol.config_key(old) == uci_protocol.config_key(plain)
    assert uci_protocol.config_key(cfg) != uci_protocol.config_key(plain)
    assert uci_protocol.normalise_config(dict(base, posterior="bsgp", collect_step_size=0.02))[
        "collect_step_size"
    ] == pytest.approx(0.02)


@pytest.mark.parametrize("value", [0.0, -0.01, np.inf, np.nan, True, "0.03"])
def test_an_impossible_collection_step_is_refused_by_name(value):
    with pytest.raises(ValueError, match="collect_step_size must be a positive finite number"):
        uci_protocol.normalise_config(
            dict(dataset="energy", posterior="sghmc", collect_step_size=value)
        )


@pytest.mark.parametrize("posterior", ["mean_field", "global", "dspp"])
def test_a_collection_step_is_refused_for_a_family_with_no_chain(posterior):
    with pytest.raises(ValueError, match="collect_step_size applies to the sampling families"):
        uci_protocol.normalise_config(
            dict(dataset="energy", posterior=posterior, collect_step_size=0.03)
        )


@pytest.mark.slow  # three run_split calls: `make test-all`
def test_run_split_collects_at_the_configured_step(monkeypatch):
    """The training step named explicitly reproduces the default run point for point (the chain,
    its seeds and the evaluation are otherwise the same); another step moves the collected
    chain, so the test points' densities change while the trained model is the same."""
    monkeypatch.setattr(uci_protocol, "SAMPLER_COLLECT", {"num_samples": 4, "thin": 3})
    cfg = dict(
        dataset="yacht", posterior="sghmc", depth=2, steps=15, num_inducing=5, test_samples=4
    )
    default = uci_protocol.run_split(cfg, 0)
    named = uci_protocol.run_split(dict(cfg, collect_step_size=STEP_SIZE), 0)
    larger = uci_protocol.run_split(dict(cfg, collect_step_size=0.05), 0)
    assert named["collect_step_size"] == STEP_SIZE and default["collect_step_size"] is None
    np.testing.assert_array_equal(named["test_ll_points"], default["test_ll_points"])
    assert larger["collect_step_size"] == 0.05
    assert not np.allclose(larger["test_ll_points"], default["test_ll_points"], rtol=0, atol=1e-6)
    assert np.isfinite(larger["test_ll"])


def test_tables_name_the_collection_step():
    import benchmarks.medium as medium
    import benchmarks.uci as uci

    line = dict(posterior="sghmc", protocol="random", collect_step_size=0.03)
    assert "collection step 0.03" in uci._protocol_marks(line)
    assert medium._family(dict(line, dataset="energy", depth=2)).endswith("+collect0.03")
    assert "+collect" not in medium._family(dict(line, collect_step_size=None, dataset="energy"))
