"""``benchmarks/predictive_noise.py``: one resumed ``fit`` per configuration, a line each, skipped
when already there, and its argument check."""

import json

import pytest

from benchmarks import predictive_noise


@pytest.mark.slow  # trains four short runs end to end: `make test-all`
def test_a_short_run_writes_one_line_per_configuration_and_skips_them_the_second_time(tmp_path):
    out, md = tmp_path / "noise.jsonl", tmp_path / "noise.md"
    argv = ["--datasets", "boston", "--posteriors", "mean_field", "--steps", "20", "--every", "10"]
    argv += ["--out", str(out), "--md", str(md)]
    assert predictive_noise.main(argv) == 0
    lines = [json.loads(l) for l in out.read_text().splitlines()]
    assert [l["objective"] for l in lines] == ["elbo", "predictive"]
    for line in lines:
        assert [s for s, _ in line["noise_variance"]] == [10, 20]
        # the builders start the noise at 0.01; Adam at 0.01 moves its softplus input by about
        # 0.01 a step, so after 20 steps it is within a factor of two of where it started
        assert all(0.005 < v < 0.02 for _, v in line["noise_variance"])
        assert line["test_f_variance"] > 0 and line["test_ll"] < 0
    # the resumed fit is the uninterrupted one: the same run in one call ends at the same noise
    import deepgp_gi as dg

    data = dg.datasets.load_uci("boston", split=0)
    model = dg.build_deep_gp(
        data.X_train, data.Y_train, depth=2, posterior="mean_field", num_inducing=100, seed=0
    )
    dg.fit(model, (data.X_train, data.Y_train), steps=20, seed=0, progress=False)
    assert float(model.likelihood.variance.numpy()) == pytest.approx(
        lines[0]["noise_variance"][-1][1], rel=1e-8
    )
    assert predictive_noise.main(argv) == 0  # nothing left to run
    assert len(out.read_text().splitlines()) == 2
    assert "| boston | 0 | mean_field | predictive |" in md.read_text()


def test_steps_must_be_a_multiple_of_every(tmp_path):
    with pytest.raises(SystemExit):
        predictive_noise.main(["--steps", "25", "--every", "10", "--out", str(tmp_path / "x")])
