"""benchmarks/star_offdiagonal.py end to end on one step: lines, the table, resuming, bad input."""

import json

import pytest

from benchmarks import star_offdiagonal as bench


@pytest.mark.slow  # trains two variants end to end: `make test-all`
def test_runs_resumes_and_writes_the_table(tmp_path):
    out, md = tmp_path / "s.jsonl", tmp_path / "s.md"
    argv = [
        "--dataset",
        "yacht",
        "--steps",
        "1",
        "--every",
        "1",
        "--variants",
        "plain,preconditioned",
        "--elbo-se",
        "1.0",
        "--out",
        str(out),
        "--md",
        str(md),
    ]
    assert bench.main(argv) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(r["variant"], r["step"]) for r in lines] == [("plain", 1), ("preconditioned", 1)]
    for r in lines:  # ELL is ELBO + KL, and the stored blocks have moved off zero
        assert abs(r["ell_per_datapoint"] - r["elbo_per_datapoint"] - r["kl_per_datapoint"]) < 1e-12
        assert r["arrow_norm"] > 0 and r["stripes_norm"] > 0
    assert bench.main(argv) == 0  # resumes: nothing new
    assert len(out.read_text().splitlines()) == 2
    table = md.read_text()
    assert "Regenerate: `python benchmarks/star_offdiagonal.py --dataset yacht" in table
    assert "| yacht | 0 | preconditioned | 1 |" in table


def test_bad_arguments_name_the_flag(tmp_path):
    with pytest.raises(SystemExit):
        bench.main(["--variants", "sideways", "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit):
        bench.main(["--steps", "2", "--every", "5", "--out", str(tmp_path / "x")])
    with pytest.raises(SystemExit):
        bench.main(["--elbo-se", "0", "--out", str(tmp_path / "x")])
