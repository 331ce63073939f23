"""The deepgp-gi command."""

import json
import os
import re
import subprocess
import sys

import pytest

from deepgp_gi import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: what TensorFlow's C++ logging prints (``I0000 ... cudart_stub.cc``, ``E0000 ... cuInit``, the
#: oneDNN notice, absl's preamble)
TF_LOG = re.compile(r"^[IWEF]\d{4} |cuInit|oneDNN|cudart_stub|absl::InitializeLog", re.M)


def _command():
    """The installed ``deepgp-gi`` script beside this interpreter, else
    ``python -m deepgp_gi.cli``."""
    script = os.path.join(os.path.dirname(sys.executable), "deepgp-gi")
    return [script] if os.path.exists(script) else [sys.executable, "-m", "deepgp_gi.cli"]


def _clean_env(**extra):
    """The environment without the TensorFlow logging variables a test runner may have set."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL")
    }
    return dict(env, **extra)


def test_help_prints_nothing_on_stderr_and_does_not_import_tensorflow():
    out = subprocess.run(
        _command() + ["--help"],
        capture_output=True,
        text=True,
        env=_clean_env(),
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0 and "usage: deepgp-gi" in out.stdout and "--verbose" in out.stdout
    assert out.stderr == ""
    probe = (
        "import sys\nfrom deepgp_gi import cli\ntry:\n    cli.main(['--help'])\nexcept "
        "SystemExit:\n    pass\nimport deepgp_gi\nprint('tensorflow' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        env=_clean_env(),
        cwd=ROOT,
        timeout=300,
    )
    assert out.returncode == 0 and out.stdout.splitlines()[-1] == "False", out.stdout + out.stderr


@pytest.mark.slow  # a uci job in a fresh process: `make test-all`
def test_a_uci_job_prints_no_tensorflow_logs(tmp_path):
    argv = [
        "uci",
        "--dataset",
        "yacht",
        "--splits",
        "0",
        "--steps",
        "5",
        "--num-inducing",
        "5",
        "--test-samples",
        "2",
        "--no-progress",
        "--out",
        str(tmp_path / "r.jsonl"),
    ]
    out = subprocess.run(
        _command() + argv, capture_output=True, text=True, env=_clean_env(), cwd=ROOT, timeout=600
    )
    assert out.returncode == 0, out.stderr
    assert not TF_LOG.search(out.stderr), out.stderr
    assert out.stderr == ""
    assert "mean_field-2" in out.stdout and "nan" not in out.stdout


@pytest.mark.slow  # fresh processes that import TensorFlow: `make test-all`
def test_verbose_and_a_users_level_leave_tensorflow_logging_alone():
    probe = (
        "import os, sys\nfrom deepgp_gi import cli\ncli._import_tensorflow(verbose=sys.argv[1] == "
        "'v')\nprint(os.environ.get('TF_CPP_MIN_LOG_LEVEL'))"
    )
    for flag, env, level in (
        ("v", _clean_env(), "None"),
        ("q", _clean_env(TF_CPP_MIN_LOG_LEVEL="1"), "1"),
    ):
        out = subprocess.run(
            [sys.executable, "-c", probe, flag],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=300,
        )
        assert out.returncode == 0 and out.stdout.split() == [level], out.stdout + out.stderr
    args = cli.build_parser().parse_args(["uci", "--dataset", "yacht", "--verbose"])
    assert args.verbose and not cli.build_parser().parse_args(["demo"]).verbose
    assert cli.build_parser(tables=False).parse_args(["--verbose", "demo"]).verbose


def test_tensorflow_load_time_lines_are_dropped_by_level(capfd):
    lines = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
        "I0000 00:00:1795619064.229781    8289 port.cc:153] oneDNN custom operations are on.\n",
        "W0000 00:00:1795619064.230131    8289 cudart_stub.cc:31] Could not find cuda drivers.\n",
        "E1125 09:41:07.123456    8289 cuda_platform.cc:52] failed call to cuInit\n",
        "/x.py:3: UserWarning: a Python warning stays\n",
    ]
    with cli._filtered_stderr(2):
        os.write(2, "".join(lines).encode())
    assert capfd.readouterr().err == lines[3] + lines[4]
    with cli._filtered_stderr(3):
        os.write(2, "".join(lines).encode())
    assert capfd.readouterr().err == lines[4]


def test_summary_has_no_error_bar_for_one_split():
    def rec(split, ll):
        return dict(
            dataset="yacht",
            model="gp",
            posterior="mean_field",
            depth=2,
            split=split,
            test_ll=ll,
            rmse=1.0,
            elbo_per_datapoint=-0.5,
        )

    one = cli._summary([rec(0, -1.25)])
    assert "nan" not in one and "±" not in one
    assert re.search(r"yacht +mean_field-2 +1 +-1\.250 +1\.000 +-0\.500$", one, re.M), one
    two = cli._summary([rec(0, -1.0), rec(1, -2.0)])
    assert "-1.500 ± 0.500" in two and "1.000 ± 0.000" in two


def test_parse_splits():
    assert cli.parse_splits("0:3", 20) == [0, 1, 2]
    assert cli.parse_splits("2,5", 20) == [2, 5]
    assert cli.parse_splits("3:", 5) == [3, 4]
    with pytest.raises(ValueError, match="--splits '25' selects no valid split"):
        cli.parse_splits("25", 20)
    with pytest.raises(ValueError, match="--splits 'a:b'"):
        cli.parse_splits("a:b", 20)


@pytest.mark.slow  # trains two splits end to end: `make test-all`
def test_uci_runs_appends_and_resumes(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    argv = [
        "uci",
        "--dataset",
        "yacht",
        "--posterior",
        "mean_field",
        "--depth",
        "2",
        "--splits",
        "0:2",
        "--steps",
        "20",
        "--num-inducing",
        "20",
        "--test-samples",
        "5",
        "--out",
        str(out),
        "--no-progress",
        "--lr-decay",
        "0.5,10",
    ]
    assert cli.main(argv) == 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["split"] for r in lines] == [0, 1]
    assert all(r["learning_rate_decay"] == [0.5, 10] for r in lines)
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


def test_lr_decay_is_parsed_and_bad_values_are_refused(capsys):
    args = cli.build_parser().parse_args(["uci", "--dataset", "naval", "--lr-decay", "0.9,1000"])
    assert args.lr_decay == [0.9, 1000]
    assert cli.build_parser().parse_args(["uci", "--dataset", "naval"]).lr_decay is None
    for bad in ("0.9", "0.9,1000,2", "1.5,1000", "0,1000", "0.9,0", "0.9,ten"):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["uci", "--dataset", "naval", "--lr-decay", bad])
        assert "--lr-decay" in capsys.readouterr().err


def test_validation_is_parsed_and_bad_values_are_refused(capsys):
    parse = cli.build_parser().parse_args
    assert parse(["uci", "--dataset", "yacht"]).validation is None
    assert parse(["uci", "--dataset", "yacht", "--validation"]).validation == 0.1
    assert (
        parse(["uci", "--dataset", "yacht", "--validation", "0.2", "--splits", "0"]).validation
        == 0.2
    )
    for bad in ("0", "1", "-0.1", "1.5", "ten", "nan"):
        with pytest.raises(SystemExit):
            parse(["uci", "--dataset", "yacht", "--validation", bad])
        assert "--validation" in capsys.readouterr().err


def test_likelihood_is_parsed_and_reaches_the_configuration(capsys):
    parse = cli.build_parser().parse_args
    args = parse(["uci", "--dataset", "energy"])
    assert args.likelihood is None and args.likelihood_df is None
    args = parse(
        ["uci", "--dataset", "energy", "--likelihood", "student_t", "--likelihood-df", "5"]
    )
    assert (args.likelihood, args.likelihood_df) == ("student_t", 5.0)
    with pytest.raises(SystemExit):
        parse(["uci", "--dataset", "energy", "--likelihood", "cauchy"])
    assert "--likelihood" in capsys.readouterr().err
    # an impossible setting is refused by name before any training starts
    argv = ["uci", "--dataset", "energy", "--likelihood", "student_t", "--likelihood-df", "1"]
    assert cli.main(argv) == 2
    assert "likelihood_df must be a finite number above 2" in capsys.readouterr().err


def test_objective_is_parsed(capsys):
    parse = cli.build_parser().parse_args
    assert parse(["uci", "--dataset", "yacht"]).objective is None
    argv = ["uci", "--dataset", "yacht", "--posterior", "dspp", "--objective", "predictive"]
    assert parse(argv).objective == "predictive"
    with pytest.raises(SystemExit):
        parse(["uci", "--dataset", "yacht", "--objective", "likelihood"])
    assert "--objective" in capsys.readouterr().err
