"""The object every loader of :mod:`deepgp_gi.datasets` returns, and what the loaders share.

:class:`UCIDataset` is one normalised train/test split, of a UCI regression set
(:mod:`deepgp_gi.datasets.uci`) or of an image set (:mod:`deepgp_gi.datasets.images`).
``DATA_DIR`` is the package's bundled data, ``deepgp_gi/data/``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

import numpy as np

__all__ = ["UCIDataset", "DATA_DIR", "PathLike"]

PathLike = Union[str, Path]

#: The bundled data sets: ``deepgp_gi/data/`` (``uci/``, ``digits/``), package data.
DATA_DIR = Path(__file__).resolve().parent.parent / "data"


@dataclass(frozen=True, eq=False, repr=False)
class UCIDataset:
    """One train/test split of a data set, normalised: a UCI regression set or an image set.

    ``X_* = (X_raw - x_mean) / x_std`` and ``Y_* = (Y_raw - y_mean) / y_std``. For the UCI
    sets (:func:`load_uci`) the statistics are the mean and (population, ddof=0) standard
    deviation of the training points; input columns that are constant on the training points
    get ``x_std = 1`` (they are centred but not scaled). For the image sets
    (:func:`load_digits`, :func:`load_mnist`, :func:`load_cifar10`) ``x_mean = 0`` and
    ``x_std`` is the largest pixel value (16 or 255), both 0-d arrays, so the pixels lie in
    [0, 1]; ``y_mean = 0`` and ``y_std = 1``: the targets are the integer class labels.
    """

    #: Short name, one of :data:`~deepgp_gi.datasets.UCI_NAMES`, ``"digits"``, ``"mnist"`` or
    #: ``"cifar10"``.
    name: str
    #: Split number.
    split: int
    #: ``[N_train, D]`` normalised training inputs (``[N_train, H, W, C]`` for images).
    X_train: np.ndarray
    #: ``[N_train, 1]`` normalised training targets (class labels 0..9 for images).
    Y_train: np.ndarray
    #: ``[N_test, D]`` test inputs, normalised with the training statistics
    #: (``[N_test, H, W, C]`` for images).
    X_test: np.ndarray
    #: ``[N_test, 1]`` test targets, normalised with the training statistics.
    Y_test: np.ndarray
    #: ``[D]`` training input means (``[]`` for images).
    x_mean: np.ndarray
    #: ``[D]`` training input standard deviations, 1 for constant columns (``[]`` for images).
    x_std: np.ndarray
    #: Training target mean.
    y_mean: float
    #: Training target standard deviation.
    y_std: float
    #: Number of splits of this data set.
    n_splits: int = field(default=1)

    @property
    def input_dim(self) -> int:
        """Number of input values per point: D (H * W * C for images)."""
        return int(np.prod(self.X_train.shape[1:]))

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one input: ``(D,)``, or ``(H, W, C)`` for images."""
        return tuple(self.X_train.shape[1:])

    def unnormalise_y(self, Y: np.ndarray) -> np.ndarray:
        """Map normalised outputs (any shape) back to the original units: ``Y * y_std + y_mean``."""
        return np.asarray(Y) * self.y_std + self.y_mean

    def __repr__(self) -> str:
        return (
            f"UCIDataset(name={self.name!r}, split={self.split}, "
            f"X_train={self.X_train.shape}, X_test={self.X_test.shape})"
        )


def check_split(split: int) -> None:
    if isinstance(split, bool) or not isinstance(split, (int, np.integer)):
        raise TypeError(f"split must be an integer, got {type(split).__name__}")


def check_split_range(split: int, name: str, n_splits: int) -> int:
    check_split(split)
    split = int(split)
    if not 0 <= split < n_splits:
        raise ValueError(
            f"split={split} is out of range: {name} has {n_splits} splits (0 to {n_splits - 1})"
        )
    return split
