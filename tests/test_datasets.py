"""Tests for deepgp_gi.datasets: bundled UCI splits and toy data generators."""

import os
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

import deepgp_gi.datasets
from deepgp_gi.datasets import (
    UCI_FOLDERS,
    UCI_NAMES,
    deep_linear,
    deep_linear_log_evidence,
    gap_regression,
    load_uci,
    load_uci_raw,
)

# the original UCI folders (Gal et al. splits), when a checkout has them: DEEPGP_GI_UCI_SOURCE=/path
SHARED = Path(os.environ.get("DEEPGP_GI_UCI_SOURCE", "/nonexistent"))
BUNDLE = (
    Path(deepgp_gi.__file__).parent / "data" / "uci"
)  # package data, beside the datasets package

# short name -> (N, D, number of splits), from the table in the source README.
EXPECTED = {
    "boston": (506, 13, 20),
    "concrete": (1030, 8, 20),
    "energy": (768, 8, 20),
    "kin8nm": (8192, 8, 20),
    "naval": (11934, 16, 20),
    "power": (9568, 4, 20),
    "protein": (45730, 9, 5),
    "wine": (1599, 11, 20),
    "yacht": (308, 6, 20),
}


def test_names():
    assert set(UCI_NAMES) == set(EXPECTED)
    assert len(UCI_NAMES) == 9


@pytest.mark.parametrize("name", UCI_NAMES)
def test_split0_shapes_and_normalisation(name):
    n, d, n_splits = EXPECTED[name]
    ds = load_uci(name, 0)
    assert ds.name == name and ds.split == 0 and ds.n_splits == n_splits
    assert ds.X_train.shape[1] == ds.X_test.shape[1] == d
    assert ds.Y_train.shape[1] == ds.Y_test.shape[1] == 1
    assert len(ds.X_train) + len(ds.X_test) == n
    assert len(ds.Y_train) == len(ds.X_train) and len(ds.Y_test) == len(ds.X_test)
    for a in (ds.X_train, ds.Y_train, ds.X_test, ds.Y_test, ds.x_mean, ds.x_std):
        assert a.dtype == np.float64
    assert isinstance(ds.y_mean, float) and isinstance(ds.y_std, float)
    assert ds.x_mean.shape == ds.x_std.shape == (d,)

    nonconst = np.ptp(ds.X_train, axis=0) > 0
    np.testing.assert_allclose(ds.X_train.mean(0), 0.0, atol=1e-10)
    np.testing.assert_allclose(ds.X_train[:, nonconst].std(0), 1.0, rtol=1e-10)
    np.testing.assert_array_equal(ds.x_std[~nonconst], 1.0)
    np.testing.assert_allclose(ds.Y_train.mean(), 0.0, atol=1e-10)
    np.testing.assert_allclose(ds.Y_train.std(), 1.0, rtol=1e-10)


@pytest.mark.parametrize("name", UCI_NAMES)
def test_all_splits_partition_rows(name):
    n, _, n_splits = EXPECTED[name]
    with np.load(BUNDLE / f"{name}.npz") as f:
        assert int(f["n_splits"]) == n_splits
        assert str(f["folder"]) == UCI_FOLDERS[name]
        assert f["X"].shape == (n, EXPECTED[name][1]) and f["Y"].shape == (n, 1)
        for k in range(n_splits):
            train, test = f[f"train_idx_{k}"], f[f"test_idx_{k}"]
            assert train.dtype == test.dtype == np.int32
            assert np.intersect1d(train, test).size == 0
            np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(n))


@pytest.mark.parametrize("name", UCI_NAMES)
def test_bundle_matches_shared_folder(name):
    if not SHARED.is_dir():
        pytest.skip("shared data folder not present")
    split = EXPECTED[name][2] - 1
    bundled = load_uci(name, split)
    for data_dir in (SHARED, SHARED / UCI_FOLDERS[name]):
        shared = load_uci(name, split, data_dir=data_dir)
        for attr in ("X_train", "Y_train", "X_test", "Y_test", "x_mean", "x_std"):
            np.testing.assert_array_equal(getattr(bundled, attr), getattr(shared, attr))
        assert (bundled.y_mean, bundled.y_std) == (shared.y_mean, shared.y_std)


def test_long_folder_names_are_aliases():
    a, b = load_uci("bostonHousing", 3), load_uci("boston", 3)
    np.testing.assert_array_equal(a.X_test, b.X_test)
    assert a.name == "boston"
    assert load_uci("wine-quality-red").name == "wine"


def test_protein_has_five_splits():
    assert load_uci_raw("protein")[2] == 5
    load_uci("protein", 4)
    with pytest.raises(ValueError, match=r"split=5.*5 splits"):
        load_uci("protein", 5)


def test_unnormalise_y_inverts_normalisation():
    ds = load_uci("concrete", 2)
    X, Y, _ = load_uci_raw("concrete")
    with np.load(BUNDLE / "concrete.npz") as f:
        train, test = f["train_idx_2"], f["test_idx_2"]
    np.testing.assert_allclose(ds.unnormalise_y(ds.Y_train), Y[train], rtol=1e-12)
    np.testing.assert_allclose(ds.unnormalise_y(ds.Y_test), Y[test], rtol=1e-12)
    np.testing.assert_allclose(ds.X_test * ds.x_std + ds.x_mean, X[test], rtol=1e-12, atol=1e-12)


def test_bad_name():
    with pytest.raises(ValueError, match=r"unknown dataset 'bostn'; choose one of boston"):
        load_uci("bostn")


@pytest.mark.parametrize("split", [20, -1, 100])
def test_split_out_of_range(split):
    with pytest.raises(ValueError, match=rf"split={split}.*20 splits"):
        load_uci("yacht", split)


@pytest.mark.parametrize("split", [1.0, "0", None, True])
def test_split_not_integer(split):
    with pytest.raises(TypeError, match="split"):
        load_uci("yacht", split)


def test_data_dir_without_data():
    with pytest.raises(FileNotFoundError):
        load_uci("yacht", data_dir=Path(__file__).parent)


def test_gap_regression():
    X, Y = gap_regression(40, seed=3)
    assert X.shape == Y.shape == (40, 1)
    x = X[:, 0]
    left, right = (x >= -4) & (x <= -2), (x >= 2) & (x <= 4)
    assert np.all(left | right) and left.sum() == right.sum() == 20
    X2, Y2 = gap_regression(40, seed=3)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(Y, Y2)
    X3, _ = gap_regression(40, seed=4)
    assert not np.array_equal(X, X3)
    # Residuals around the cubic have the stated noise sd 3: with 40 draws the sample sd has a
    # standard error of about 3 / sqrt(80) = 0.34, so 3 +- 1 is a 3-sigma band (0 or a wrong
    # scale such as 1 or 9 fails).
    assert abs(np.std(Y[:, 0] - x**3) - 3.0) < 1.0


def test_deep_linear_shapes_and_seed():
    data = deep_linear(num_train=50, num_test=10, input_dim=5, noise_variance=0.1, seed=1)
    assert data.X_train.shape == (50, 5) and data.Y_train.shape == (50, 1)
    assert data.X_test.shape == (10, 5) and data.Y_test.shape == (10, 1)
    assert data.w.shape == (5, 1) and data.noise_variance == 0.1
    again = deep_linear(num_train=50, num_test=10, input_dim=5, noise_variance=0.1, seed=1)
    np.testing.assert_array_equal(data.Y_train, again.Y_train)


def test_deep_linear_log_evidence_matches_scipy():
    data = deep_linear(num_train=60, num_test=10, input_dim=5, noise_variance=0.1, seed=0)
    X, Y = data.X_train, data.Y_train
    ours = deep_linear_log_evidence(X, Y, input_dim=5, noise_variance=0.1)
    cov = X @ X.T / 5 + 0.1 * np.eye(len(X))
    ref = scipy.stats.multivariate_normal(mean=np.zeros(len(X)), cov=cov).logpdf(Y[:, 0])
    np.testing.assert_allclose(ours, ref, rtol=1e-10)


def test_extrapolation_protocol_splits_along_a_random_projection():
    """Train rows are exactly the lower half of the projection on the split's direction: every
    training projection is <= every test projection, the halves partition the data, the direction
    depends on the split, and the data are normalised with the training statistics."""
    X, Y, _ = deepgp_gi.datasets.load_uci_raw("concrete")
    for split in (0, 1):
        data = deepgp_gi.datasets.load_uci("concrete", split, protocol="extrapolation")
        assert (
            data.X_train.shape[0] == X.shape[0] // 2
            and data.X_test.shape[0] == X.shape[0] - X.shape[0] // 2
        )
        train, test = deepgp_gi.datasets.extrapolation_split(X, split)
        assert len(np.intersect1d(train, test)) == 0 and len(train) + len(test) == X.shape[0]
        std = X.std(0)
        w = np.random.default_rng(split).standard_normal(X.shape[1])
        z = ((X - X.mean(0)) / np.where(std > 0, std, 1.0)) @ w
        assert z[train].max() <= z[test].min()
        np.testing.assert_allclose(
            data.X_train, (X[train] - X[train].mean(0)) / X[train].std(0), rtol=1e-12
        )
        np.testing.assert_allclose(data.Y_test * data.y_std + data.y_mean, Y[test], rtol=1e-12)
    a = deepgp_gi.datasets.extrapolation_split(X, 0)[0]
    b = deepgp_gi.datasets.extrapolation_split(X, 1)[0]
    assert not np.array_equal(a, b)
    with pytest.raises(ValueError, match="protocol 'interpolation'"):
        deepgp_gi.datasets.load_uci("concrete", 0, protocol="interpolation")


# ---------------------------------------------------------------------------- validation split
def _raw(ds, X, Y):
    """Rows of a split back in the original units (the loader's normalisation undone)."""
    return np.hstack([X * ds.x_std + ds.x_mean, ds.unnormalise_y(Y)])


def _row_set(A):
    return sorted(map(tuple, np.round(A, 8)))


@pytest.mark.parametrize("name, split", [("boston", 0), ("yacht", 3), ("wine", 19)])
def test_a_validation_split_holds_out_ten_percent_of_the_training_rows(name, split):
    """``validation=0.1``: the training rows fall into the fitted rows and round(0.1 N) held-out
    rows, disjoint; the test rows are those of the plain split; the statistics are the
    fitted rows'."""
    from deepgp_gi.datasets.uci import UCIValidationSplit

    plain = load_uci(name, split)
    ds = load_uci(name, split, validation=0.1)
    assert isinstance(ds, UCIValidationSplit) and ds.validation == 0.1
    n = len(plain.X_train)
    assert len(ds.X_valid) == int(np.floor(0.1 * n + 0.5)) and len(ds.X_train) == n - len(
        ds.X_valid
    )
    assert (
        ds.Y_valid.shape == (len(ds.X_valid), 1) and ds.X_valid.shape[1] == plain.X_train.shape[1]
    )
    fitted, held = _raw(ds, ds.X_train, ds.Y_train), _raw(ds, ds.X_valid, ds.Y_valid)
    # together exactly the split's training rows (as a multiset), and the test rows untouched
    assert _row_set(np.vstack([fitted, held])) == _row_set(
        _raw(plain, plain.X_train, plain.Y_train)
    )
    np.testing.assert_allclose(
        _raw(ds, ds.X_test, ds.Y_test), _raw(plain, plain.X_test, plain.Y_test), atol=1e-8
    )
    # normalised with the fitted rows' own statistics
    nonconst = np.ptp(ds.X_train, axis=0) > 0
    np.testing.assert_allclose(ds.X_train.mean(0), 0.0, atol=1e-10)
    np.testing.assert_allclose(ds.X_train[:, nonconst].std(0), 1.0, rtol=1e-10)
    assert abs(ds.Y_train.mean()) < 1e-10 and abs(ds.Y_train.std() - 1) < 1e-10
    assert "X_valid=" in repr(ds)


def test_the_validation_rows_follow_the_documented_seeded_rule():
    """The permutation comes from default_rng(1000 + split); its first round(f N) positions are held
    out. The same split always holds out the same rows, another split others."""
    from deepgp_gi.datasets.uci import VALIDATION_SEED_OFFSET, validation_rows

    fit, valid = validation_rows(455, 4, 0.1)
    order = np.random.default_rng(VALIDATION_SEED_OFFSET + 4).permutation(455)
    np.testing.assert_array_equal(valid, np.sort(order[:46]))  # 45.5 rounds up
    np.testing.assert_array_equal(fit, np.sort(order[46:]))
    assert not set(fit) & set(valid) and len(fit) + len(valid) == 455
    again = validation_rows(455, 4, 0.1)
    np.testing.assert_array_equal(again[1], valid)
    assert not np.array_equal(validation_rows(455, 5, 0.1)[1], valid)
    a, b = load_uci("energy", 2, validation=0.1), load_uci("energy", 2, validation=True)
    np.testing.assert_array_equal(a.X_valid, b.X_valid)
    assert len(validation_rows(100, 0, 0.25)[1]) == 25


def test_the_validation_split_works_on_the_extrapolation_protocol_too():
    plain = load_uci("concrete", 1, protocol="extrapolation")
    ds = load_uci("concrete", 1, protocol="extrapolation", validation=0.2)
    assert len(ds.X_train) + len(ds.X_valid) == len(plain.X_train)
    np.testing.assert_allclose(
        _raw(ds, ds.X_test, ds.Y_test), _raw(plain, plain.X_test, plain.Y_test), atol=1e-8
    )


def test_no_validation_split_is_the_plain_split():
    from deepgp_gi.datasets import UCIDataset
    from deepgp_gi.datasets.uci import UCIValidationSplit

    for off in (None, False):
        ds = load_uci("yacht", 0, validation=off)
        assert type(ds) is UCIDataset and not isinstance(ds, UCIValidationSplit)


@pytest.mark.parametrize(
    "bad, error",
    [
        (0, ValueError),
        (0.0, ValueError),
        (1, ValueError),
        (1.0, ValueError),
        (-0.1, ValueError),
        (1.5, ValueError),
        (float("nan"), ValueError),
        ("0.1", TypeError),
        ([0.1], TypeError),
    ],
)
def test_bad_validation_fractions_are_refused(bad, error):
    from deepgp_gi.datasets.uci import check_validation_fraction

    with pytest.raises(error, match="validation"):
        load_uci("yacht", 0, validation=bad)
    with pytest.raises(error, match="validation"):
        check_validation_fraction(bad)


def test_a_validation_fraction_that_empties_a_part_is_refused():
    from deepgp_gi.datasets.uci import check_validation_fraction, validation_rows

    assert (
        check_validation_fraction(True) == 0.1 and check_validation_fraction(np.float64(0.3)) == 0.3
    )
    with pytest.raises(TypeError, match="validation"):
        check_validation_fraction(False)
    with pytest.raises(ValueError, match="at least one row"):
        validation_rows(4, 0, 0.1)  # round(0.4) = 0 rows held out
    with pytest.raises(ValueError, match="at least one row"):
        validation_rows(4, 0, 0.9)  # round(3.6) = 4: nothing left to fit


def test_the_80_20_protocol_splits_rows_at_random_seeded_by_the_split():
    """Eight seeded random 80/20 partitions (Rossi et al.'s protocol): the test rows are a fifth,
    the two parts partition the data, the same split gives the same rows, another split other
    rows, protein's sixth split exists (its standard splits are five), and the data are
    normalised with the training rows' statistics."""
    from deepgp_gi.datasets.uci import RANDOM_80_20_SPLITS, random_80_20_split

    X, Y, _ = deepgp_gi.datasets.load_uci_raw("energy")
    train, test = random_80_20_split(len(X), 3)
    assert len(test) == round(0.2 * len(X)) and len(np.intersect1d(train, test)) == 0
    assert len(train) + len(test) == len(X)
    order = np.random.default_rng(2003).permutation(len(X))
    np.testing.assert_array_equal(test, np.sort(order[: len(test)]))
    data = deepgp_gi.datasets.load_uci("energy", 3, protocol="random_80_20")
    np.testing.assert_allclose(data.Y_test * data.y_std + data.y_mean, Y[test], rtol=1e-12)
    np.testing.assert_allclose(data.Y_train.mean(), 0.0, atol=1e-12)
    assert data.n_splits == RANDOM_80_20_SPLITS == 8
    assert not np.array_equal(random_80_20_split(len(X), 4)[1], test)
    assert deepgp_gi.datasets.load_uci("protein", 7, protocol="random_80_20").X_test.shape[0] == (
        round(0.2 * 45730)
    )
    with pytest.raises(ValueError, match="split=8 is out of range.*random_80_20"):
        deepgp_gi.datasets.load_uci("energy", 8, protocol="random_80_20")
