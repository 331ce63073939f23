"""The UCI protocol's ``collect_step_size``: a sampling family's chain step while ``run_split``
collects the sample set (``collect_samples(..., step_size=...)``)."""

import numpy as np
import pytest

from deepgp_gi import uci_protocol
from deepgp_gi.posteriors.sghmc import STEP_SIZE


def test_bsgp_takes_a_collection_step_too():
    cfg = dict(dataset="energy", posterior="bsgp", depth=2, collect_step_size=0.02)
    assert uci_protocol.normalise_config(cfg)["collect_step_size"] == pytest.approx(0.02)


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
