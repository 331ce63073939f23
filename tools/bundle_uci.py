#!/usr/bin/env python
"""Convert the UCI benchmark folders into the compressed files bundled with deepgp_gi.

Each source folder (``data.txt``, ``index_features.txt``, ``index_target.txt``,
``n_splits.txt``, ``index_train_K.txt``, ``index_test_K.txt``) becomes one file
``deepgp_gi/data/uci/<short>.npz`` holding

* ``X``: float64 [N, D] inputs, ``Y``: float64 [N, 1] target,
* ``train_idx_K`` / ``test_idx_K``: int32 row numbers of split ``K``,
* ``n_splits``: int, ``folder``: the original folder name.

Every split is checked (disjoint, covers all rows, indices in range) and N, D and the
number of splits are compared with the table in the source README.

Usage::

    python tools/bundle_uci.py --src PATH/TO/UCI/FOLDERS [--dst deepgp_gi/data/uci]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

# short name -> (source folder, N, D, number of splits), as in the source README.
DATASETS: dict[str, tuple[str, int, int, int]] = {
    "boston": ("bostonHousing", 506, 13, 20),
    "concrete": ("concrete", 1030, 8, 20),
    "energy": ("energy", 768, 8, 20),
    "kin8nm": ("kin8nm", 8192, 8, 20),
    "naval": ("naval-propulsion-plant", 11934, 16, 20),
    "power": ("power-plant", 9568, 4, 20),
    "protein": ("protein-tertiary-structure", 45730, 9, 5),
    "wine": ("wine-quality-red", 1599, 11, 20),
    "yacht": ("yacht", 308, 6, 20),
}

REPO_ROOT = Path(__file__).resolve().parent.parent


def _read_ints(path: Path) -> np.ndarray:
    return np.atleast_1d(np.loadtxt(path, dtype=np.int64))


def convert(folder: Path, expected: tuple[int, int, int]) -> dict[str, np.ndarray]:
    """Read one source folder, check it, and return the arrays to store."""
    data = np.loadtxt(folder / "data.txt", dtype=np.float64, ndmin=2)
    features = _read_ints(folder / "index_features.txt")
    target = int(_read_ints(folder / "index_target.txt")[0])
    n_splits = int(_read_ints(folder / "n_splits.txt")[0])

    X = np.ascontiguousarray(data[:, features])
    Y = np.ascontiguousarray(data[:, [target]])
    n, d = X.shape
    if (n, d, n_splits) != expected:
        raise RuntimeError(
            f"{folder.name}: got N, D, splits = {(n, d, n_splits)}, expected {expected}"
        )

    arrays: dict[str, np.ndarray] = {
        "X": X,
        "Y": Y,
        "n_splits": np.asarray(n_splits, dtype=np.int64),
        "folder": np.asarray(folder.name),
    }
    for k in range(n_splits):
        train = _read_ints(folder / f"index_train_{k}.txt")
        test = _read_ints(folder / f"index_test_{k}.txt")
        for idx in (train, test):
            if idx.min() < 0 or idx.max() >= n or len(np.unique(idx)) != len(idx):
                raise RuntimeError(f"{folder.name} split {k}: indices out of range or repeated")
        if np.intersect1d(train, test).size:
            raise RuntimeError(f"{folder.name} split {k}: train and test overlap")
        if len(train) + len(test) != n:
            raise RuntimeError(f"{folder.name} split {k}: train + test do not cover all {n} rows")
        arrays[f"train_idx_{k}"] = train.astype(np.int32)
        arrays[f"test_idx_{k}"] = test.astype(np.int32)
    return arrays


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", type=Path, required=True,
                        help="the folder holding the original UCI data folders and their split index files")
    parser.add_argument("--dst", type=Path, default=REPO_ROOT / "deepgp_gi" / "data" / "uci")
    args = parser.parse_args(argv)

    args.dst.mkdir(parents=True, exist_ok=True)
    total = 0
    for short, (folder, *expected) in DATASETS.items():
        arrays = convert(args.src / folder, tuple(expected))
        out = args.dst / f"{short}.npz"
        np.savez_compressed(out, **arrays)
        size = out.stat().st_size
        total += size
        n, d = arrays["X"].shape
        print(f"{short:9s} <- {folder:28s} N={n:6d} D={d:3d} splits={int(arrays['n_splits']):3d} "
              f"{size / 1e6:6.2f} MB")
    print(f"total {total / 1e6:.2f} MB in {args.dst}")


if __name__ == "__main__":
    main()
