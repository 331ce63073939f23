"""benchmarks/sampler_collect_step.py: the drift measures and the table."""

import numpy as np
import pytest

import benchmarks.sampler_collect_step as scs


def test_drift_measures_the_change_from_the_end_of_training():
    end = np.array([[1.0, -2.0], [0.5, 3.0]])
    shifts = np.array([0.1, 0.2, 0.4])  # sample s is the end state plus shifts[s] in every entry
    samples = end[None] + shifts[:, None, None]
    d = scs.drift(samples, end)
    assert d["end_rms"] == pytest.approx(np.sqrt(np.mean(end**2)))
    assert d["median_rms_change"] == pytest.approx(0.2)
    assert d["last_rms_change"] == pytest.approx(0.4)
    assert d["max_abs_change"] == pytest.approx(0.4)
    one = samples.copy()
    one[1, 0, 0] += 3.0  # one entry of one sample far off: the largest change, not the median
    assert scs.drift(one, end)["max_abs_change"] == pytest.approx(3.2)
    assert scs.drift(one, end)["median_rms_change"] == pytest.approx(0.4)


def test_the_table_has_a_row_per_quantity_and_the_command():
    line = dict(
        dataset="energy",
        split=0,
        posterior="bsgp",
        steps=20000,
        collect_step=0.03,
        valid_ll=-3.7,
        valid_rmse=9.8,
        drift={
            "V_0": dict(end_rms=1.0, median_rms_change=0.5, last_rms_change=0.6, max_abs_change=2),
            "log_variance_0": dict(
                end_rms=2.0, median_rms_change=1.5, last_rms_change=3.0, max_abs_change=4
            ),
        },
        command="python benchmarks/sampler_collect_step.py --split 0",
    )
    md = scs.report([line])
    assert "| energy | 0 | bsgp | 20,000 | 0.03 | -3.70 | 9.80 | V_0 | 1 | 0.5 / 0.6 | 2 |" in md
    assert "| | | | | | | log_variance_0 | 2 | 1.5 / 3 | 4 |" in md
    assert "`python benchmarks/sampler_collect_step.py --split 0`" in md
