"""benchmarks/mnist_dgp.py: a sweep end to end on a tiny MNIST-shaped file (its result and trace
lines, the skip of a finished cell, the resume of an interrupted one from its checkpoint) and the
report's table and list of cells still to run."""

import json

import numpy as np
import pytest

from benchmarks import mnist_dgp


def _tiny_mnist(path, n_train=60, n_test=20):
    """An .npz of MNIST's layout: uint8 28 x 28 images whose bright row is the label, labels
    0..9."""
    rng = np.random.default_rng(0)
    arrays = {}
    for part, n in (("train", n_train), ("test", n_test)):
        y = (np.arange(n) % 10).astype(np.uint8)
        x = rng.integers(0, 40, (n, 28, 28)).astype(np.uint8)
        x[np.arange(n), 2 * y + 4, :] = 255
        arrays[f"x_{part}"], arrays[f"y_{part}"] = x, y
    np.savez_compressed(path, **arrays)
    return path


def _args(tmp_path, *extra):
    return [
        "sweep",
        "--data",
        str(tmp_path / "tiny.npz"),
        "--steps",
        "4",
        "--eval-every",
        "2",
        "--log-every",
        "1",
        "--batch-size",
        "30",
        "--num-inducing",
        "5",
        "--test-samples",
        "3",
        "--trace-samples",
        "2",
        "--eval-chunk",
        "8",
        "--seeds",
        "0",
        "--out",
        str(tmp_path / "r.jsonl"),
        "--trace",
        str(tmp_path / "t.jsonl"),
        "--checkpoint-dir",
        str(tmp_path / "ck"),
        "--in-process",
        *extra,
    ]


# trains two small deep GPs (one in a child process, one interrupted and resumed): `make test-all`
@pytest.mark.slow
def test_sweep_skip_resume_and_report(tmp_path, monkeypatch):
    _tiny_mnist(tmp_path / "tiny.npz")
    results, trace = tmp_path / "r.jsonl", tmp_path / "t.jsonl"
    # the default: the cell runs in a process of its own
    mnist_dgp.main(
        [
            a
            for a in _args(tmp_path, "--posteriors", "mean_field", "--depths", "1")
            if a != "--in-process"
        ]
    )
    rows = mnist_dgp.read_lines(results)
    assert len(rows) == 1
    row = rows[0]
    for field in (
        "accuracy",
        "test_ll",
        "ece",
        "steps",
        "ms_per_step",
        "train_seconds",
        "wall_seconds",
        "command",
        "commit",
        "posterior",
        "depth",
        "seed",
        "num_inducing",
        "batch_size",
        "lr",
        "test_samples",
    ):
        assert field in row, field
    assert (row["posterior"], row["depth"], row["seed"], row["steps"]) == ("mean_field", 1, 0, 4)
    assert (row["train_rows"], row["test_rows"], row["batch_size"], row["test_samples"]) == (
        60,
        20,
        30,
        3,
    )
    assert 0 <= row["accuracy"] <= 1 and 0 <= row["ece"] <= 1 and row["test_ll"] < 0
    assert (
        row["ms_per_step"] > 0
        and row["wall_seconds"] >= row["train_seconds"] > 0
        and row["resumes"] == []
    )
    # the command names the files by name only: no machine paths
    assert str(tmp_path) not in row["command"] and "/tmp" not in row["command"]
    assert row["command"].startswith("python benchmarks/mnist_dgp.py sweep --data TMP_DIR/tiny.npz")
    lines = mnist_dgp.read_lines(trace)
    assert [t["step"] for t in lines] == [0, 2, 4] and [t["test_samples"] for t in lines] == [
        2,
        2,
        3,
    ]
    assert lines[-1]["accuracy"] == row["accuracy"]

    # rerun: the finished cell is skipped (nothing trained, nothing appended)
    def no_training(*a, **k):
        raise AssertionError("a finished cell was trained again")

    monkeypatch.setattr(mnist_dgp, "build", no_training)
    mnist_dgp.main(_args(tmp_path, "--posteriors", "mean_field", "--depths", "1"))
    assert len(mnist_dgp.read_lines(results)) == 1 and len(mnist_dgp.read_lines(trace)) == 3
    monkeypatch.undo()

    # a cell interrupted after its first segment's checkpoint resumes from step 2
    evaluate, calls = mnist_dgp.evaluate, []

    def interrupted(*a, **k):
        calls.append(1)
        if (
            len(calls) == 2
        ):  # the evaluation after the first segment (step 2): its checkpoint is written
            raise KeyboardInterrupt
        return evaluate(*a, **k)

    monkeypatch.setattr(mnist_dgp, "evaluate", interrupted)
    with pytest.raises(KeyboardInterrupt):
        mnist_dgp.main(_args(tmp_path, "--posteriors", "global", "--depths", "2"))
    monkeypatch.undo()
    assert len(mnist_dgp.read_lines(results)) == 1
    folder = next((tmp_path / "ck").glob("*global-d2-s0*"))
    assert mnist_dgp.checkpoint_step(folder) == 2
    mnist_dgp.main(_args(tmp_path, "--posteriors", "global", "--depths", "2"))
    rows = mnist_dgp.read_lines(results)
    assert len(rows) == 2
    resumed = rows[1]
    assert (resumed["posterior"], resumed["depth"], resumed["resumes"]) == ("global", 2, [2])
    steps = [t["step"] for t in mnist_dgp.read_lines(trace) if t["posterior"] == "global"]
    assert steps == [0, 2, 4]  # step 2 scored once, after the resume
    # fewer steps than a checkpoint holds: refused, not silently a longer run
    with pytest.raises(SystemExit, match="past --steps 2"):
        mnist_dgp.main(_args(tmp_path, "--posteriors", "global", "--depths", "2", "--steps", "2"))

    table = tmp_path / "t.md"
    mnist_dgp.main(
        [
            "report",
            "--results",
            str(results),
            "--trace",
            str(trace),
            "--out",
            str(table),
            "--steps",
            "4",
            "--seeds",
            "0",
            "--data-label",
            "TMP_DIR/tiny.npz",
        ]
    )
    text = table.read_text()
    assert "| TMP_DIR/tiny.npz (60 / 20) | 4 | mean_field | 1 | 1 | " in text
    assert "| TMP_DIR/tiny.npz (60 / 20) | 4 | global | 2 | 1 | " in text
    assert (
        "mean_field depth 2 seed 0: not yet run" in text
        and "global depth 3 seed 0: not yet run" in text
    )
    assert "mean_field depth 1 seed 0" not in text.split("## Still running")[1]


@pytest.mark.slow
def test_a_cell_whose_last_trace_line_was_lost_scores_the_restored_model(tmp_path):
    """Killed after its last checkpoint but before the trace and result lines: the rerun restores
    the checkpoint before it scores, so the line it writes is the trained model's, the same as the
    lost one (the evaluation is seeded)."""
    _tiny_mnist(tmp_path / "tiny.npz")
    args = _args(tmp_path, "--posteriors", "mean_field", "--depths", "1")
    mnist_dgp.main(args)
    results, trace = tmp_path / "r.jsonl", tmp_path / "t.jsonl"
    lines = mnist_dgp.read_lines(trace)
    lost = lines[-1]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines[:-1]))
    results.unlink()
    mnist_dgp.main(args)
    again = mnist_dgp.read_lines(trace)[-1]
    assert again["step"] == lost["step"] == 4
    assert (again["accuracy"], again["test_ll"]) == (lost["accuracy"], lost["test_ll"])


def _row(posterior, depth, seed, accuracy, steps=5000):
    return {
        "benchmark": "mnist_dgp",
        "data": "mnist",
        "train_rows": 60000,
        "test_rows": 10000,
        "posterior": posterior,
        "depth": depth,
        "seed": seed,
        "num_inducing": 100,
        "batch_size": 10000,
        "lr": 0.01,
        "steps": steps,
        "test_samples": 100,
        "accuracy": accuracy,
        "test_ll": -0.1 - seed / 100,
        "ece": 0.01,
        "ms_per_step": 300.0,
    }


def test_report_table_and_pending_cells(tmp_path):
    results, trace, out = tmp_path / "r.jsonl", tmp_path / "t.jsonl", tmp_path / "r.md"
    for r in (
        _row("mean_field", 1, 0, 0.97),
        _row("mean_field", 1, 1, 0.98),
        _row("global", 2, 0, 0.981),
    ):
        mnist_dgp.append_line(results, r)
    mnist_dgp.append_line(trace, dict(_row("mean_field", 2, 0, 0.95), step=750, test_samples=10))
    mnist_dgp.main(["report", "--results", str(results), "--trace", str(trace), "--out", str(out)])
    text = out.read_text()
    assert "**Steps per cell: 5,000, not the paper's 20,000** (DSVI's" in text
    assert (
        "| mnist | 5,000 | mean_field | 1 | 2 | 97.50 ± 0.50 | 97.00, 98.00 | -0.1050 ± 0.0050 | "
        in text
    )
    assert text.rstrip().count("| 97.48 |") == 1 and "| global | 2 | 1 | 98.10 | 98.10 |" in text
    pending = text.split("## Still running / not yet run (12 of 15 cells at 5,000 steps)")[1]
    assert "mean_field depth 2 seed 0: started, step 750 of 5,000" in pending
    assert (
        "mean_field depth 3 seed 2: not yet run" in pending
        and "global depth 2 seed 0" not in pending
    )
    assert "global depth 1" not in pending  # global inducing runs depths 2 and 3 only


def test_recorded_command_has_no_machine_paths(tmp_path):
    inside = str(mnist_dgp.REPO_ROOT / "benchmarks" / "x")
    cmd = mnist_dgp.recorded_command(
        [
            "sweep",
            "--out",
            str(tmp_path / "a.jsonl"),
            f"--trace={tmp_path}/t.jsonl",
            "--checkpoint-dir",
            inside,
            "--steps",
            "3",
        ]
    )
    assert cmd == (
        "python benchmarks/mnist_dgp.py sweep --out TMP_DIR/a.jsonl --trace=TMP_DIR/t.jsonl "
        "--checkpoint-dir benchmarks/x --steps 3"
    )
    assert mnist_dgp.planned_cells(["mean_field", "global"], [1, 2, 3], [0, 1])[:4] == [
        ("mean_field", 1, 0),
        ("mean_field", 2, 0),
        ("global", 2, 0),
        ("mean_field", 3, 0),
    ]


def test_trace_bands_pool_the_seeds_of_a_configuration(tmp_path):
    def line(posterior, depth, seed, step, accuracy):
        return dict(
            data="mnist",
            posterior=posterior,
            depth=depth,
            seed=seed,
            step=step,
            accuracy=accuracy,
            test_ll=-accuracy,
            ece=0.01 * seed,
        )

    trace = [
        line("mean_field", 2, 0, 250, 0.97),
        line("mean_field", 2, 1, 250, 0.95),
        line("mean_field", 2, 0, 500, 0.98),  # seed 1 not yet at step 500
        line("global", 2, 0, 250, 0.96),
        dict(line("global", 2, 0, 250, 0.5), data="other"),  # another data set: left out
    ]
    bands = mnist_dgp.trace_bands(trace, "mnist")
    steps, mean, low, high = bands[("mean_field", 2)]["accuracy"]
    assert steps == [250, 500] and mean == pytest.approx([0.96, 0.98])
    assert low == pytest.approx([0.95, 0.98]) and high == pytest.approx([0.97, 0.98])
    assert bands[("mean_field", 2)]["ece"][3] == pytest.approx([0.01, 0.0])
    assert bands[("global", 2)]["accuracy"][1] == pytest.approx([0.96])
    figure = tmp_path / "trace.png"
    mnist_dgp.plot(trace, str(figure), "mnist")
    assert figure.stat().st_size > 0


def test_a_trace_past_its_checkpoint_stops_or_is_cut_back_to_it(tmp_path):
    """Trace lines of a run past the step its checkpoint holds (that checkpoint is gone): an error
    naming the steps and the flag; with the flag, exactly those lines leave the file, every other
    line (another run's, a truncated one) stays byte for byte."""
    from benchmarks.common import trace_to_checkpoint

    def key(t):
        return (t["posterior"], t["seed"])

    path = tmp_path / "t.jsonl"
    mine = [{"posterior": "mean_field", "seed": 2, "step": s} for s in (0, 250, 500, 750)]
    other = {"posterior": "mean_field", "seed": 1, "step": 750}
    raw = [json.dumps(t) + "\n" for t in mine[:2]] + [json.dumps(other) + "\n"]
    raw += [json.dumps(t) + "\n" for t in mine[2:]] + ['{"posterior": "mean_fi\n']
    path.write_text("".join(raw))
    with pytest.raises(SystemExit, match=r"steps 500-750 of this run.*step 250.*--drop-lost"):
        trace_to_checkpoint(str(path), key, ("mean_field", 2), 250, False)
    assert path.read_text() == "".join(raw)  # nothing changed without the flag
    kept = trace_to_checkpoint(str(path), key, ("mean_field", 2), 250, True)
    assert kept == mine[:2]
    assert path.read_text() == "".join(raw[:3] + raw[-1:])
    # a run whose trace ends at its checkpoint (or before) is left alone
    assert trace_to_checkpoint(str(path), key, ("mean_field", 1), 750, False) == [other]
    assert trace_to_checkpoint(str(path), key, ("mean_field", 2), 500, False) == mine[:2]


# trains a small deep GP twice: `make test-all`
@pytest.mark.slow
def test_a_run_whose_checkpoint_is_gone_retraces_only_with_the_flag(tmp_path):
    """The checkpoint folder of a finished run deleted: the rerun stops before training (its trace
    would hold steps 2 and 4 twice); with ``--drop-lost-trace`` it trains again and the trace holds
    each step once."""
    import shutil

    _tiny_mnist(tmp_path / "tiny.npz")
    args = _args(tmp_path, "--posteriors", "mean_field", "--depths", "1")
    mnist_dgp.main(args)
    trace = tmp_path / "t.jsonl"
    first = mnist_dgp.read_lines(trace)
    assert [t["step"] for t in first] == [0, 2, 4]
    shutil.rmtree(tmp_path / "ck")
    (tmp_path / "r.jsonl").unlink()
    with pytest.raises(SystemExit, match="steps 2-4 of this run.*--drop-lost-trace"):
        mnist_dgp.main(args)
    assert mnist_dgp.read_lines(trace) == first and not (tmp_path / "r.jsonl").exists()
    mnist_dgp.main(args + ["--drop-lost-trace"])
    again = mnist_dgp.read_lines(trace)
    assert [t["step"] for t in again] == [0, 2, 4]
    assert again[0] == first[0]
    assert len(mnist_dgp.read_lines(tmp_path / "r.jsonl")) == 1
