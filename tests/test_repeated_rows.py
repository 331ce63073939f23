"""The repeated-rows report (benchmarks/repeated_rows.py): which test rows repeat a fitted row,
and the split of a line's test log densities between them and the rest."""

import numpy as np
import pytest

from benchmarks import repeated_rows as rr


def test_repeated_test_rows_marks_exact_repeats_of_inputs_and_of_whole_rows():
    X_fit = np.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]])
    Y_fit = np.array([[1.0], [2.0], [3.0]])
    X_test = np.array([[2.0, 3.0], [2.0, 3.0], [4.0, 5.0 + 1e-12], [-0.0, 1.0], [9.0, 9.0]])
    Y_test = np.array([[2.0], [7.0], [3.0], [1.0], [1.0]])
    same_inputs, same_row = rr.repeated_test_rows(X_fit, Y_fit, X_test, Y_test)
    # row 1 repeats inputs with another target; row 2 differs in the last bit; -0.0 equals 0.0
    assert same_inputs.tolist() == [True, True, False, True, False]
    assert same_row.tolist() == [True, False, False, True, False]


def test_a_target_of_another_row_with_the_same_inputs_is_a_repeat_only_of_inputs():
    X_fit = np.array([[1.0], [1.0]])
    Y_fit = np.array([[0.0], [5.0]])
    _, same_row = rr.repeated_test_rows(
        X_fit, Y_fit, np.array([[1.0], [1.0]]), np.array([[5.0], [0.5]])
    )
    assert same_row.tolist() == [True, False]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(X_fit=np.zeros(3)), "X_fit must be 2-D"),
        (dict(Y_test=np.zeros((4, 1))), "X_test and Y_test have 2 and 4 rows"),
        (dict(X_test=np.zeros((2, 3))), "X_fit and X_test have 2 and 3 columns"),
    ],
)
def test_repeated_test_rows_rejects_mismatched_arrays_by_name(kwargs, message):
    args = dict(
        X_fit=np.zeros((3, 2)),
        Y_fit=np.zeros((3, 1)),
        X_test=np.zeros((2, 2)),
        Y_test=np.zeros((2, 1)),
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=message):
        rr.repeated_test_rows(**args)


def test_standardised_splits_find_the_repeats_of_the_raw_rows():
    """Wine split 0: the masks from load_uci's standardised rows equal those from the raw rows and
    the bundled split indices (the standardisation keeps equal rows equal)."""
    from deepgp_gi.datasets import load_uci_raw
    from deepgp_gi.datasets.uci import _load

    X, Y, _ = load_uci_raw("wine")
    _, _, _, _, (train, test) = _load("wine", 0, None)
    raw = rr.repeated_test_rows(X[train], Y[train], X[test], Y[test])
    got = rr.split_repeats("wine", 0)
    np.testing.assert_array_equal(got["same_inputs"], raw[0])
    np.testing.assert_array_equal(got["same_row"], raw[1])
    # wine repeats rows: a quarter of its test rows
    assert got["same_row"].sum() > 0.2 * got["n_test"]


def test_the_validation_rows_that_repeat_a_fitted_row_match_the_raw_rows():
    from deepgp_gi.datasets import load_uci_raw
    from deepgp_gi.datasets.uci import _load, validation_rows

    X, Y, _ = load_uci_raw("wine")
    _, _, _, _, (train, _) = _load("wine", 1, None)
    fit, valid = (np.asarray(train)[p] for p in validation_rows(len(train), 1, 0.1))
    _, raw = rr.repeated_test_rows(X[fit], Y[fit], X[valid], Y[valid])
    got = rr.split_repeats("wine", 1, validation=0.1)
    np.testing.assert_array_equal(got["valid_same_row"], raw)
    assert "valid_same_row" not in rr.split_repeats("wine", 1)


def test_split_points_averages_the_repeated_and_the_other_test_points():
    repeats = rr.split_repeats("wine", 0, validation=0.1)
    same = repeats["same_row"]
    line = dict(
        dataset="wine", split=0, validation=0.1, test_ll_points=np.where(same, -0.5, -2.0).tolist()
    )
    p = rr.split_points(line)
    assert (p["n"], p["n_same"]) == (len(same), int(same.sum()))
    assert p["same"] == pytest.approx(-0.5) and p["other"] == pytest.approx(-2.0)
    assert p["all"] == pytest.approx(np.mean(line["test_ll_points"]))
    with pytest.raises(ValueError, match="has 3 test points; the split has 160 test rows"):
        rr.split_points(dict(line, test_ll_points=[0.0, 0.0, 0.0]))
