"""The deepgp-gi command."""
import json

import pytest

from deepgp_gi import cli


def test_parse_splits():
    assert cli.parse_splits("0:3", 20) == [0, 1, 2]
    assert cli.parse_splits("2,5", 20) == [2, 5]
    assert cli.parse_splits("3:", 5) == [3, 4]
    with pytest.raises(ValueError, match="--splits '25' selects no valid split"):
        cli.parse_splits("25", 20)
    with pytest.raises(ValueError, match="--splits 'a:b'"):
        cli.parse_splits("a:b", 20)


def test_uci_runs_appends_and_resumes(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    argv = ["uci", "--dataset", "yacht", "--posterior", "mean_field", "--depth", "2", "--splits", "0:2",
            "--steps", "20", "--num-inducing", "20", "--test-samples", "5", "--out", str(out), "--no-progress"]
    assert cli.main(argv) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["split"] for r in lines] == [0, 1]
    assert all(r["dataset"] == "yacht" and "test_ll" in r and "command" in r for r in lines)
    # the same command again skips both splits and appends nothing
    assert cli.main(argv) == 0
    assert len(out.read_text().splitlines()) == 2
    printed = capsys.readouterr().out
    assert "already in" in printed and "mean_field-2" in printed


def test_uci_rejects_unknown_posterior():
    with pytest.raises(SystemExit, match="unknown --posterior 'globl'"):
        cli.main(["uci", "--dataset", "yacht", "--posterior", "globl"])
    assert cli.main(["uci", "--dataset", "bostn", "--splits", "0"]) == 2
