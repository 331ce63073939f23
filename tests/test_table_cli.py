"""The deepgp-gi commands on a user's table: fit, predict, evaluate (deepgp_gi.table_commands).

Oracles: predict's columns are the loaded model's predict_y (mean, sd) and the mixture quantiles
of its components (deepgp_gi.intervals), row by row in table order; evaluate's figures are those
of the same predictions; every bad table or argument gives exit status 2, one line on stderr that
names the column (and row), and writes nothing.
"""

import csv
import json
import math
import os

import numpy as np
import pytest

import deepgp_gi as dg
from deepgp_gi import cli
from deepgp_gi.intervals import central_interval

FIT = ["--steps", "20", "--num-inducing", "5", "--no-progress"]


def write_csv(path, header, rows):
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


def read_csv(path, columns=None):
    """The header and the values ``[N, C]`` of a CSV file (of its first ``columns`` columns)."""
    with open(path, newline="") as fh:
        rows = list(csv.reader(fh))
    return rows[0], np.array([row[:columns] for row in rows[1:]], dtype=float)


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """A training and a test table (inputs a, b in large units; target y around 100; label) and
    a regression model fitted on the training table by ``deepgp-gi fit``."""
    root = tmp_path_factory.mktemp("tables")
    rng = np.random.default_rng(7)

    def rows(n):
        a, b = rng.uniform(-300, 300, n), rng.uniform(0, 5, n)
        y = 100.0 + 20.0 * np.sin(a / 100.0) + b + rng.standard_normal(n)
        label = np.where(a > 0, "up", "down")
        return [[f"{a[i]!r}", f"{b[i]!r}", f"{y[i]!r}", label[i]] for i in range(n)]

    header = ["a", "b", "y", "label"]
    train = write_csv(root / "train.csv", header, rows(30))
    test = write_csv(root / "test.csv", header, rows(12))
    regression = str(root / "regression")
    assert (
        cli.main(["fit", train, "--target", "y", "--features", "a,b", "--out", regression] + FIT)
        == 0
    )
    return root, train, test, regression


@pytest.fixture(scope="module")
def classifier(tables):
    """A classifier of the label column fitted on the training table by ``deepgp-gi fit``."""
    root, train, _, _ = tables
    out = str(root / "classifier")
    assert (
        cli.main(
            ["fit", train, "--target", "label", "--features", "a,b", "--classes", "--out", out]
            + FIT
        )
        == 0
    )
    return out


def test_predict_writes_the_mixture_interval_in_the_table_units(tables, tmp_path, capsys):
    _, _, test, regression = tables
    out = str(tmp_path / "p.csv")
    assert (
        cli.main(
            [
                "predict",
                regression,
                test,
                "--out",
                out,
                "--interval",
                "0.8",
                "--num-samples",
                "7",
                "--seed",
                "3",
            ]
        )
        == 0
    )
    header, values = read_csv(out)
    assert header == ["mean", "sd", "lower", "upper"] and values.shape == (12, 4)
    X = read_csv(test, 2)[1]
    loaded = dg.load(regression)
    assert (
        loaded.input_names == ["a", "b"]
        and loaded.output_names == ["y"]
        and loaded.transform is not None
    )
    mean, var = loaded.predict_y(X, 7, seed=3)
    lower, upper = central_interval(
        0.8, *(t.numpy() for t in loaded.predict_y_components(X, 7, seed=3))
    )
    np.testing.assert_allclose(values[:, 0], mean.numpy()[:, 0], rtol=1e-15)
    np.testing.assert_allclose(values[:, 1], np.sqrt(var.numpy()[:, 0]), rtol=1e-15)
    np.testing.assert_allclose(values[:, 2], lower[:, 0], rtol=1e-15)
    np.testing.assert_allclose(values[:, 3], upper[:, 0], rtol=1e-15)
    assert np.all(values[:, 2] < values[:, 0]) and np.all(values[:, 0] < values[:, 3])
    assert 60 < values[:, 0].mean() < 140  # the table's units, not standardised ones


def test_evaluate_prints_the_figures_of_the_predictions(tables, capsys):
    _, _, test, regression = tables
    capsys.readouterr()
    assert (
        cli.main(
            ["evaluate", regression, test, "--target", "y", "--num-samples", "6", "--seed", "2"]
        )
        == 0
    )
    record = json.loads(capsys.readouterr().out)
    _, values = read_csv(test, 3)
    X, y = values[:, :2], values[:, 2:3]
    loaded = dg.load(regression)
    logp = loaded.predict_log_density((X, y), 6, seed=2).numpy()
    mean = loaded.predict_y(X, 6, seed=2)[0].numpy()
    lower, upper = central_interval(
        0.9, *(t.numpy() for t in loaded.predict_y_components(X, 6, seed=2))
    )
    assert record["rows"] == 12 and record["num_samples"] == 6 and record["interval"] == 0.9
    assert math.isclose(record["test_log_likelihood"], float(np.mean(logp)), rel_tol=1e-12)
    assert math.isclose(record["rmse"], float(np.sqrt(np.mean((mean - y) ** 2))), rel_tol=1e-12)
    assert record["coverage"] == float(np.mean((lower <= y) & (y <= upper)))


@pytest.mark.slow  # trains, saves and loads a classifier through the command line
def test_a_classifier_predicts_one_probability_per_class(tables, classifier, tmp_path, capsys):
    _, _, test, _ = tables
    out = str(tmp_path / "p.csv")
    assert cli.main(["predict", classifier, test, "--out", out]) == 0
    header, probs = read_csv(out)
    assert header == ["prob_down", "prob_up"] and probs.shape == (12, 2)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-12)
    assert dg.load(classifier).record["class_names"] == ["down", "up"]
    capsys.readouterr()
    assert cli.main(["evaluate", classifier, test, "--target", "label"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert (
        set(record) >= {"test_log_likelihood", "accuracy", "ece"} and 0 <= record["accuracy"] <= 1
    )
    assert "rmse" not in record and record["test_log_likelihood"] < 0


def _fails(capsys, argv, *fragments):
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"deepgp-gi {argv[0]}: error: "), err
    for fragment in fragments:
        assert fragment in err, err
    return err


def test_bad_tables_give_one_line_and_write_nothing(tables, tmp_path, capsys):
    root, train, test, regression = tables
    out = str(tmp_path / "out")
    fit = ["fit", train, "--out", out] + FIT
    _fails(capsys, fit + ["--target", "price"], "no column 'price' (--target)")
    _fails(capsys, fit + ["--target", "y", "--features", "a,c"], "no column 'c' (--features)")
    _fails(
        capsys,
        fit + ["--target", "y", "--features", "a,y"],
        "--features names the target column 'y'",
    )
    _fails(
        capsys, fit + ["--target", "y"], "column 'label', row 1 holds "
    )  # every other column is an input
    bad = write_csv(tmp_path / "bad.csv", ["a", "b", "y"], [["1", "2", "3"], ["4", "x5", "6"]])
    _fails(
        capsys,
        ["fit", bad, "--target", "y", "--out", out] + FIT,
        "bad.csv: column 'b', row 2 holds 'x5'",
    )
    for value, shown in (("nan", "nan"), ("inf", "inf"), ("-Infinity", "-inf"), ("", "is empty")):
        bad = write_csv(
            tmp_path / "bad.csv",
            ["a", "b", "y"],
            [["1", "2", "3"], ["4", "5", "6"], ["7", value, "9"]],
        )
        _fails(
            capsys, ["fit", bad, "--target", "y", "--out", out] + FIT, "column 'b', row 3", shown
        )
    empty = write_csv(tmp_path / "empty.csv", ["a", "b", "y"], [])
    _fails(
        capsys, ["fit", empty, "--target", "y", "--out", out] + FIT, "empty.csv: the table is empty"
    )
    (tmp_path / "nothing.csv").write_text("")
    _fails(
        capsys,
        ["fit", str(tmp_path / "nothing.csv"), "--target", "y", "--out", out] + FIT,
        "the table is empty",
    )
    _fails(
        capsys,
        ["fit", str(tmp_path / "absent.csv"), "--target", "y", "--out", out] + FIT,
        "no such file",
    )
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("a,b,y\n1,2,3\n4,5\n")
    _fails(
        capsys,
        ["fit", str(ragged), "--target", "y", "--out", out] + FIT,
        "row 2 (line 3) has 2 cells",
    )
    one_class = write_csv(tmp_path / "one.csv", ["a", "label"], [["1", "x"], ["2", "x"]])
    _fails(
        capsys,
        ["fit", one_class, "--target", "label", "--classes", "--out", out] + FIT,
        "one class only",
    )
    assert not os.path.exists(out)

    pred = str(tmp_path / "p.csv")
    no_b = write_csv(tmp_path / "no_b.csv", ["a", "y"], [["1", "3"]])
    _fails(capsys, ["predict", regression, no_b, "--out", pred], "no column 'b'", "trained on")
    bad = write_csv(tmp_path / "bad.csv", ["a", "b"], [["1", "2"], ["oops", "5"]])
    _fails(capsys, ["predict", regression, bad, "--out", pred], "column 'a', row 2 holds 'oops'")
    _fails(
        capsys,
        ["predict", str(root / "train.csv"), test, "--out", pred],
        "train.csv' is not a saved model",
    )
    _fails(
        capsys, ["predict", str(tmp_path), test, "--out", pred], "is not a deepgp_gi saved model"
    )
    _fails(capsys, ["predict", str(tmp_path / "none"), test, "--out", pred], "no saved model at")
    _fails(capsys, ["evaluate", regression, test, "--target", "z"], "no column 'z' (--target)")
    assert not os.path.exists(pred)


def test_an_existing_output_is_replaced_only_with_overwrite(tables, tmp_path, capsys):
    _, train, test, regression = tables
    pred = tmp_path / "p.csv"
    pred.write_text("keep")
    _fails(
        capsys,
        ["predict", regression, test, "--out", str(pred)],
        "already exists; pass --overwrite",
    )
    assert pred.read_text() == "keep"
    assert cli.main(["predict", regression, test, "--out", str(pred), "--overwrite"]) == 0
    assert read_csv(pred)[1].shape == (12, 4)
    saved_before = sorted(os.listdir(regression))
    _fails(
        capsys,
        ["fit", train, "--target", "y", "--out", regression] + FIT,
        "already exists; pass --overwrite",
    )
    assert sorted(os.listdir(regression)) == saved_before


def test_parquet_tables(tables, tmp_path, capsys, monkeypatch):
    _, _, test, regression = tables
    try:
        import pyarrow
        import pyarrow.parquet as pq
    except ImportError:
        import sys

        monkeypatch.setitem(sys.modules, "pyarrow", None)
        (tmp_path / "t.parquet").write_bytes(b"PAR1")
        _fails(
            capsys,
            ["predict", regression, str(tmp_path / "t.parquet"), "--out", str(tmp_path / "p.csv")],
            "needs pyarrow",
        )
        return
    header, values = read_csv(test, 3)
    pq.write_table(
        pyarrow.table({name: values[:, j] for j, name in enumerate(header[:3])}),
        tmp_path / "t.parquet",
    )
    assert (
        cli.main(
            [
                "predict",
                regression,
                str(tmp_path / "t.parquet"),
                "--out",
                str(tmp_path / "p.parquet"),
            ]
        )
        == 0
    )
    assert cli.main(["predict", regression, test, "--out", str(tmp_path / "p.csv")]) == 0
    from_parquet = pq.read_table(tmp_path / "p.parquet")
    np.testing.assert_allclose(
        np.asarray(from_parquet.column("mean")), read_csv(tmp_path / "p.csv")[1][:, 0], rtol=1e-15
    )


def test_class_labels_map_to_indices():
    from deepgp_gi.tables import ClassLabels, TableError

    labels = ClassLabels.from_cells(["2", "0", "1", "0"], "y", "t.csv")
    assert labels.names == ["0", "1", "2"]  # labels 0..C-1 keep their values
    assert labels.indices(["2", "0", "1.0"], "y", "t.csv")[:, 0].tolist() == [2.0, 0.0, 1.0]
    assert ClassLabels.from_cells(["10", "3", "3"], "y", "t.csv").names == [
        "3",
        "10",
    ]  # numeric order
    names = ClassLabels.from_cells(["cat", "dog", "ant"], "y", "t.csv")
    assert names.names == ["ant", "cat", "dog"]
    with pytest.raises(
        TableError, match="column 'y', row 2 holds 'cow', which is not one of the model's classes"
    ):
        names.indices(["cat", "cow"], "y", "t.csv")


def test_help_lists_the_table_commands(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert all(name in out for name in ("fit", "predict", "evaluate"))
