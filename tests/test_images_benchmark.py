"""benchmarks/images.py end to end on the digits (two steps, one cell), its resume, its report, and
the MNIST mode on a tiny IDX file written here."""

import gzip
import json
import shutil
import struct

import numpy as np
import pytest

from benchmarks import images


@pytest.mark.slow  # trains a conv net end to end: `make test-all`
def test_digits_sweep_resume_and_report(tmp_path):
    out = tmp_path / "digits.jsonl"
    args = [
        "sweep",
        "--steps",
        "2",
        "--seeds",
        "0",
        "--posteriors",
        "global",
        "--priors",
        "neal",
        "--num-inducing",
        "10",
        "--test-samples",
        "2",
        "--out",
        str(out),
    ]
    images.main(args)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 1
    row = rows[0]
    assert row["posterior"] == "global" and row["prior"] == "neal" and row["steps"] == 2
    assert 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["ece"] <= 1.0
    assert row["test_ll"] < 0 and np.isfinite(row["elbo_per_image"])
    assert 0.0 <= row["entropy"] <= np.log(10) + 1e-9
    images.main(args)  # a cell already in the file is skipped
    assert len(out.read_text().splitlines()) == 1
    table = tmp_path / "digits.md"
    images.main(["report", "--results", str(out), "--out", str(table)])
    text = table.read_text()
    assert "| digits | lenet | 2 | neal | global | 1 |" in text
    assert f"{100 * row['accuracy']:.1f}" in text


def _write_idx(path, array, magic):
    header = struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_mnist_mode_reads_local_files(tmp_path, monkeypatch):
    rng = np.random.default_rng(0)
    folder = tmp_path / "mnist"
    folder.mkdir()
    for prefix, n in (("train", 12), ("t10k", 4)):
        _write_idx(
            folder / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)), 2051
        )
        _write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n) % 3, 2049)
    data = images.load("mnist", str(folder), 0)
    assert data.X_train.shape == (12, 28, 28, 1) and data.X_test.shape == (4, 28, 28, 1)
    with pytest.raises(SystemExit):
        images.main(
            ["sweep", "--dataset", "cifar10", "--out", str(tmp_path / "x.jsonl")]
        )  # --path required
    # MNIST without --path reads what tools/fetch_mnist.py wrote, and names that command when
    # nothing is there
    monkeypatch.setenv("DEEPGP_GI_DATA", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="python tools/fetch_mnist.py"):
        images.load("mnist", None, 0)


@pytest.mark.slow  # trains three conv nets end to end: `make test-all`
def test_posterior_options_reach_the_model_and_the_cell_key(tmp_path, monkeypatch):
    import deepgp_gi as dg

    seen = []
    real = dg.build_conv_bnn

    def spy(*a, **kw):
        model = real(*a, **kw)
        seen.append((kw, model))
        return model

    monkeypatch.setattr(dg, "build_conv_bnn", spy)
    out = tmp_path / "iw.jsonl"
    base = [
        "sweep",
        "--steps",
        "2",
        "--seeds",
        "0",
        "--posteriors",
        "ffg_u",
        "--priors",
        "neal",
        "--num-inducing",
        "4",
        "--test-samples",
        "2",
        "--out",
        str(out),
    ]
    images.main(base)
    images.main(base + ["--posterior-options", '{"lambda_max": 0.03, "sd_max": 0.1}'])
    images.main(
        base + ["--posterior-options", '{"sd_max": 0.1, "lambda_max": 0.03}']
    )  # same cell: skipped
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["posterior_options"] for r in rows] == [{}, {"lambda_max": 0.03, "sd_max": 0.1}]
    kw, model = seen[1]
    assert kw["lambda_max"] == 0.03 and kw["sd_max"] == 0.1
    lam = model.posterior.inducing_weights[0].lam.numpy()
    assert np.all(lam <= 0.03 + 1e-12)
    images.main(["report", "--results", str(out), "--out", str(tmp_path / "iw.md")])
    assert "| ffg_u M=4 lambda_max=0.03, sd_max=0.1 | 1 |" in (tmp_path / "iw.md").read_text()
    with pytest.raises(SystemExit, match="JSON object"):
        images.main(base + ["--posterior-options", "[1, 2]"])


def test_lr_decay_and_eval_every_arguments(tmp_path):
    """The decay is part of the cell's key (rows without it read as no decay), and --eval-every
    without --checkpoint-dir is refused before any data is read."""
    assert images.parse_lr_decay(None) is None
    assert images.parse_lr_decay("0.5,1200") == [0.5, 1200]
    for bad in ("0.5", "2,10", "0.5,0", "a,b"):
        with pytest.raises(ValueError, match="--lr-decay"):
            images.parse_lr_decay(bad)
    row = {
        "dataset": "mnist",
        "architecture": "lenet",
        "posterior": "global",
        "prior": "neal",
        "seed": 0,
        "steps": 240,
        "num_inducing": 100,
    }
    assert images.cell_key(row) == images.cell_key(dict(row, lr_decay=None))
    assert images.cell_key(dict(row, lr_decay=[0.5, 1200]))[-1] == (0.5, 1200)
    assert images.cell_key(dict(row, lr_decay=[0.5, 1200])) != images.cell_key(row)
    assert images.default_trace("a/b/mnist_long.jsonl") == "a/b/mnist_long_trace.jsonl"
    out = str(tmp_path / "x.jsonl")
    with pytest.raises(SystemExit):
        images.main(["sweep", "--eval-every", "2", "--out", out])
    with pytest.raises(SystemExit):
        images.main(["sweep", "--lr-decay", "0.5", "--out", out])


@pytest.mark.slow  # trains a conv net in segments end to end: `make test-all`
def test_segments_trace_resume_and_trace_figure(tmp_path):
    out, ckpt = tmp_path / "digits.jsonl", tmp_path / "ckpt"
    trace = tmp_path / "digits_trace.jsonl"

    def sweep(steps, *extra):
        images.main(
            [
                "sweep",
                "--steps",
                str(steps),
                "--seeds",
                "0",
                "--posteriors",
                "factorised",
                "--priors",
                "neal",
                "--batch-size",
                "100",
                "--test-samples",
                "2",
                "--trace-samples",
                "2",
                "--elbo-rows",
                "100",
                "--kl-schedule",
                "none",
                "--lr-decay",
                "0.5,2",
                "--eval-every",
                "2",
                "--checkpoint-dir",
                str(ckpt),
                "--out",
                str(out),
                *extra,
            ]
        )
        return [json.loads(line) for line in trace.read_text().splitlines()]

    lines = sweep(4)  # two segments of 2 steps
    assert [t["step"] for t in lines] == [2, 4]
    assert [t["epoch"] for t in lines] == [2 * 100 / 1500, 4 * 100 / 1500]
    for t in lines:
        assert t["posterior"] == "factorised" and t["lr_decay"] == [0.5, 2]
        assert t["test_samples"] == 2 and t["segment_ms_per_step"] > 0
        assert all(np.isfinite(t[k]) for k in ("accuracy", "test_ll", "ece", "entropy"))
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["steps"] == 4 and rows[0]["lr_decay"] == [0.5, 2]
    assert images.cell_key(rows[0])[-1] == (0.5, 2)
    assert rows[0]["trace"] == "TMP_DIR/digits_trace.jsonl"  # no machine paths in the results
    # more steps: the run resumes at its step-4 checkpoint and its trace goes on without repeats
    lines = sweep(6)
    assert [t["step"] for t in lines] == [2, 4, 6]
    assert len({images.run_key(t) for t in lines}) == 1
    assert [json.loads(line)["steps"] for line in out.read_text().splitlines()] == [4, 6]
    sweep(6)  # a finished cell: skipped, nothing traced again
    assert len(trace.read_text().splitlines()) == 3
    # its checkpoint folder gone: a rerun would trace steps 2-6 a second time, so it stops first
    shutil.rmtree(ckpt)
    out.unlink()
    with pytest.raises(SystemExit, match="steps 2-6 of this run.*--drop-lost-trace"):
        sweep(6)
    assert len(trace.read_text().splitlines()) == 3 and not out.exists()
    assert [t["step"] for t in sweep(6, "--drop-lost-trace")] == [2, 4, 6]
    table, figure = tmp_path / "digits.md", tmp_path / "digits.png"
    images.main(["report", "--results", str(out), "--out", str(table), "--plot", str(figure)])
    assert figure.stat().st_size > 0
    text = table.read_text()
    assert "from the runs' traces" in text and "lr x0.5 every 2 steps" in text


def test_shift_images_moves_each_image_by_its_own_shift():
    rng = np.random.default_rng(0)
    images_in = rng.normal(size=(4, 6, 5, 2))
    shifts = np.array([[0, 0], [2, -1], [-2, 2], [1, 1]])
    out = images.shift_images(images_in, shifts, max_shift=2, fill=-9.0).numpy()
    expected = np.full_like(images_in, -9.0)
    for b, (down, right) in enumerate(shifts):
        for r in range(6):
            for c in range(5):
                if 0 <= r - down < 6 and 0 <= c - right < 5:
                    expected[b, r, c] = images_in[b, r - down, c - right]
    np.testing.assert_array_equal(out, expected)


def test_shifted_batches_are_fits_minibatches_shifted_within_the_bound():
    from deepgp_gi.training.batches import batch_indices

    rng = np.random.default_rng(1)
    X = rng.normal(size=(23, 7, 7, 1))
    X[:, 0, :, :] = X[:, -1, :, :] = X[:, :, 0, :] = X[:, :, -1, :] = -5.0  # a background border
    Y = np.arange(23, dtype=np.float64)[:, None]
    batches = list(images.shifted_batches(X, Y, 5, seed=3, max_shift=1).take(7))
    again = list(images.shifted_batches(X, Y, 5, seed=3, max_shift=1).take(7))
    moved = 0
    for step, (xb, yb) in enumerate(batches):
        idx = batch_indices(step, 23, 5, 3).numpy()
        np.testing.assert_array_equal(yb.numpy(), Y[idx])  # the rows fit would use, in order
        np.testing.assert_array_equal(xb.numpy(), again[step][0].numpy())  # seeded
        for image, row in zip(xb.numpy(), idx):
            found = [
                (d, r)
                for d in (-1, 0, 1)
                for r in (-1, 0, 1)
                if np.array_equal(
                    image, images.shift_images(X[row : row + 1], [[d, r]], 1, -5.0).numpy()[0]
                )
            ]
            assert found, "every image is its row moved by at most one pixel"
            moved += found[0] != (0, 0)
    assert moved > 20  # most of the 35 images moved (8 of 9 shifts move)
    with pytest.raises(ValueError, match="max_shift"):
        images.shifted_batches(X, Y, 5, seed=3, max_shift=0)


def test_the_shift_is_part_of_the_cell_and_run_keys():
    row = {
        "dataset": "mnist",
        "architecture": "lenet",
        "posterior": "factorised",
        "prior": "neal",
        "seed": 0,
        "steps": 240,
        "num_inducing": 100,
        "batch_size": 500,
        "lr": 0.01,
        "kl_schedule": "linear",
    }
    assert images.cell_key(row) == images.cell_key(dict(row, augment_shift=0))
    assert images.cell_key(row) != images.cell_key(dict(row, augment_shift=2))
    assert images.run_key(row) != images.run_key(dict(row, augment_shift=2))
    key = images.run_key(dict(row, augment_shift=2))
    assert images._settings_text(key).endswith("shifts ≤2 px")
    assert "shift" not in images._settings_text(images.run_key(row))


@pytest.mark.slow  # trains a conv net end to end: `make test-all`
def test_an_augmented_cell_trains_resumes_and_is_its_own_row(tmp_path):
    out, ckpt = tmp_path / "digits.jsonl", tmp_path / "ckpt"

    def sweep(steps, *extra):
        images.main(
            ["sweep", "--steps", str(steps), "--seeds", "0", "--posteriors", "factorised"]
            + ["--priors", "neal", "--batch-size", "100", "--test-samples", "2"]
            + ["--trace-samples", "2", "--elbo-rows", "100", "--kl-schedule", "none"]
            + ["--eval-every", "2", "--checkpoint-dir", str(ckpt), "--out", str(out), *extra]
        )
        return [json.loads(line) for line in out.read_text().splitlines()]

    rows = sweep(2, "--augment-shift", "1")
    assert rows[-1]["augment_shift"] == 1 and np.isfinite(rows[-1]["test_ll"])
    (folder,) = [p.name for p in ckpt.iterdir()]
    assert "-shift1-" in folder
    rows = sweep(4, "--augment-shift", "1")  # resumes the augmented run at its step-2 checkpoint
    assert [r["steps"] for r in rows] == [2, 4]
    trace = [
        json.loads(line) for line in (tmp_path / "digits_trace.jsonl").read_text().splitlines()
    ]
    assert [t["step"] for t in trace] == [2, 4] and len({images.run_key(t) for t in trace}) == 1
    rows = sweep(2)  # the same cell without shifts is another row, in another folder
    assert len(rows) == 3 and "augment_shift" not in rows[-1]
    assert len(list(ckpt.iterdir())) == 2


@pytest.mark.slow  # trains a conv net end to end: `make test-all`
def test_evaluate_scores_a_finished_cell_again_with_more_samples(tmp_path):
    out, ckpt, scores = tmp_path / "digits.jsonl", tmp_path / "ckpt", tmp_path / "scores.jsonl"
    cell = ["--steps", "2", "--seeds", "0", "--posteriors", "factorised", "--priors", "neal"]
    cell += ["--batch-size", "100", "--kl-schedule", "none", "--eval-every", "2"]
    cell += ["--checkpoint-dir", str(ckpt)]
    images.main(
        ["sweep", *cell, "--test-samples", "2", "--trace-samples", "2"]
        + ["--elbo-rows", "100", "--out", str(out)]
    )
    images.main(["evaluate", *cell, "--samples", "2,5", "--eval-out", str(scores)])
    images.main(["evaluate", *cell, "--samples", "5", "--eval-out", str(scores)])
    lines = [json.loads(line) for line in scores.read_text().splitlines()]
    assert [(t["samples"], t["eval_seed"]) for t in lines] == [(2, 0), (5, 0), (5, 0)]
    assert lines[1]["accuracy"] == lines[2]["accuracy"] and lines[1]["ece"] == lines[2]["ece"]
    assert all(0 <= t["accuracy"] <= 1 and np.isfinite(t["test_ll"]) for t in lines)
    assert images.cell_key(lines[0]) == images.cell_key(json.loads(out.read_text()))
    # a cell not trained to --steps is refused, not trained
    bad = [a if a != "2" else "4" for a in cell[:2]] + cell[2:]
    with pytest.raises(SystemExit, match="not --steps 4"):
        images.main(["evaluate", *bad, "--eval-out", str(scores)])


@pytest.mark.slow  # builds and trains the benchmark's models
def test_layer_widths_reach_the_model_the_keys_and_the_report(tmp_path, monkeypatch):
    import deepgp_gi as dg

    seen = []
    real = dg.build_conv_bnn

    def spy(*a, **kw):
        model = real(*a, **kw)
        seen.append(model)
        return model

    monkeypatch.setattr(dg, "build_conv_bnn", spy)
    out = tmp_path / "wide.jsonl"
    base = ["sweep", "--steps", "2", "--seeds", "0", "--posteriors", "factorised"]
    base += ["--priors", "neal", "--test-samples", "2", "--out", str(out)]
    images.main(base)
    images.main(base + ["--channels", "4,8", "--hidden", "16"])
    images.main(base + ["--channels", "4,8", "--hidden", "16"])  # the same cell: skipped
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and "channels" not in rows[0]
    assert (rows[1]["channels"], rows[1]["hidden"]) == ([4, 8], [16])
    widths = [layer.output_shape[-1] for layer in seen[1].layers if "conv" in layer.name]
    dense = [layer.output_dim for layer in seen[1].layers if "dense" in layer.name]
    assert widths == [4, 8] and dense == [16, 10]
    assert images.net_name(rows[1]) == "lenet c4-8 h16" and images.net_name(rows[0]) == "lenet"
    assert images.cell_key(rows[0]) != images.cell_key(rows[1])
    assert images.run_key(rows[0]) != images.run_key(rows[1])
    assert images.net_name(dict(rows[0], hidden=[])) == "lenet hnone"
    images.main(["report", "--results", str(out), "--out", str(tmp_path / "wide.md")])
    report = (tmp_path / "wide.md").read_text()
    assert "| digits | lenet c4-8 h16 | 2 | neal | factorised | 1 |" in report
    assert "| digits | lenet | 2 | neal | factorised | 1 |" in report


def test_layer_widths_are_checked_before_training():
    with pytest.raises(SystemExit):
        images.main(["sweep", "--out", "x.jsonl", "--channels", "4,8,16"])
    with pytest.raises(SystemExit):
        images.main(["sweep", "--out", "x.jsonl", "--architecture", "resnet", "--hidden", "8"])
    with pytest.raises(ValueError, match="--hidden: every width must be positive"):
        images.parse_widths("8,0", "--hidden")
    with pytest.raises(ValueError, match="--channels takes comma-separated widths"):
        images.parse_widths("a,b", "--channels")
    assert images.parse_widths("", "--hidden") == [] and images.parse_widths(None, "x") is None


def test_the_mnist_report_links_the_trace_figures_that_exist_but_not_its_own(tmp_path):
    assert images._trace_figures(str(tmp_path), None) == []
    (tmp_path / "mnist_long.png").write_bytes(b"png")
    lines = images._trace_figures(str(tmp_path), str(tmp_path / "mnist.png"))
    assert [line for line in lines if line.startswith("![")] == [
        "![the 30-epoch LeNet runs against epochs (`mnist_long.md`)](mnist_long.png)"
    ]
    assert images._trace_figures(str(tmp_path), str(tmp_path / "mnist_long.png")) == []
    (tmp_path / "mnist_dgp.png").write_bytes(b"png")
    lines = images._trace_figures(str(tmp_path), str(tmp_path / "mnist_long.png"))
    assert [line for line in lines if line.startswith("![")] == [
        "![the DSVI deep-GP cells against steps (`mnist_dgp.md`)](mnist_dgp.png)"
    ]
