"""The data transform a saved model keeps: inputs and targets standardised on the training set.

A model fitted to standardised data predicts in standardised units. :class:`Standardisation`
records the training set's column means and scales so that a saved model
(:func:`deepgp_gi.save`) takes inputs and returns predictions in the data's own units: inputs
``x -> (x - input_mean) / input_scale`` before the model, predictive means
``m -> m * target_scale + target_mean``, variances ``v -> v * target_scale^2`` and log densities
``l -> l - sum_p log target_scale_p`` after it. A classifier keeps no target part (its targets
are class labels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

__all__ = ["Standardisation"]


def _vector(value, name: str) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be a vector of numbers, got {value!r}") from err
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty vector, got shape {list(arr.shape)}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {arr.tolist()}")
    return arr


@dataclass(frozen=True, eq=False)
class Standardisation:
    """Column means and scales of the inputs ``[D]`` and, for regression, of the targets ``[P]``.

    :param input_mean: ``[D]`` subtracted from every input row.
    :param input_scale: ``[D]`` positive; the centred inputs are divided by it.
    :param target_mean: ``[P]`` or ``None`` (a classifier: labels are not transformed).
    :param target_scale: ``[P]`` positive, or ``None`` with ``target_mean``.
    :raises ValueError: a vector that is empty, not finite or (a scale) not positive, or target
        parts of which only one is given.
    """

    input_mean: np.ndarray
    input_scale: np.ndarray
    target_mean: Optional[np.ndarray] = None
    target_scale: Optional[np.ndarray] = None

    def __post_init__(self):
        set_ = object.__setattr__
        set_(self, "input_mean", _vector(self.input_mean, "input_mean"))
        set_(self, "input_scale", _vector(self.input_scale, "input_scale"))
        if self.input_mean.shape != self.input_scale.shape:
            raise ValueError(
                f"input_mean has {self.input_mean.size} entries but input_scale has "
                f"{self.input_scale.size}"
            )
        if (self.target_mean is None) != (self.target_scale is None):
            raise ValueError("give both target_mean and target_scale, or neither (a classifier)")
        if self.target_mean is not None:
            set_(self, "target_mean", _vector(self.target_mean, "target_mean"))
            set_(self, "target_scale", _vector(self.target_scale, "target_scale"))
            if self.target_mean.shape != self.target_scale.shape:
                raise ValueError(
                    f"target_mean has {self.target_mean.size} entries but target_scale has "
                    f"{self.target_scale.size}"
                )
        for name in ("input_scale", "target_scale"):
            scale = getattr(self, name)
            if scale is not None and np.any(scale <= 0):
                raise ValueError(f"{name} must be positive, got {scale.tolist()}")

    def __eq__(self, other) -> bool:
        if not isinstance(other, Standardisation):
            return NotImplemented
        return self.to_json() == other.to_json()

    __hash__ = None

    @classmethod
    def fit(cls, X, Y=None) -> "Standardisation":
        """The column means and standard deviations of ``X`` ``[N, D]`` (and ``Y`` ``[N, P]``;
        ``None`` for a classifier). A constant column gets scale 1 (it is only centred).

        :raises ValueError: ``X`` or ``Y`` not 2-D, empty or not finite.
        """

        def moments(A, name):
            A = np.asarray(A, dtype=np.float64)
            if A.ndim != 2 or A.shape[0] == 0:
                raise ValueError(
                    f"{name} must be a non-empty [N, columns] array, got shape {list(A.shape)}"
                )
            if not np.all(np.isfinite(A)):
                raise ValueError(f"{name} must be finite to be standardised")
            scale = A.std(axis=0)
            return A.mean(axis=0), np.where(scale > 0, scale, 1.0)

        x_mean, x_scale = moments(X, "X")
        if Y is None:
            return cls(x_mean, x_scale)
        y_mean, y_scale = moments(Y, "Y")
        return cls(x_mean, x_scale, y_mean, y_scale)

    @property
    def has_targets(self) -> bool:
        """Whether the targets are transformed (regression) or not (a classifier)."""
        return self.target_mean is not None

    # Each map below takes NumPy arrays or float64 tensors (the arithmetic is the same).
    def inputs(self, X):
        """Data-unit inputs ``[N, D]`` -> the model's."""
        return (X - self.input_mean) / self.input_scale

    def targets(self, Y):
        """Data-unit targets ``[N, P]`` -> the model's (identity for a classifier)."""
        return Y if not self.has_targets else (Y - self.target_mean) / self.target_scale

    def mean(self, M):
        """A predictive mean ``[..., P]`` in the model's units -> the data's."""
        return M if not self.has_targets else M * self.target_scale + self.target_mean

    def variance(self, V):
        """A predictive variance ``[..., P]`` in the model's units -> the data's."""
        return V if not self.has_targets else V * np.square(self.target_scale)

    def log_density(self, L):
        """A log density of a whole target row ``[N]`` in the model's units -> the data's."""
        return L if not self.has_targets else L - float(np.sum(np.log(self.target_scale)))

    def to_json(self) -> dict:
        """The transform as plain lists (the saved model's record)."""
        listed = lambda a: None if a is None else a.tolist()  # noqa: E731
        return {
            "kind": "standardisation",
            "input_mean": listed(self.input_mean),
            "input_scale": listed(self.input_scale),
            "target_mean": listed(self.target_mean),
            "target_scale": listed(self.target_scale),
        }

    @classmethod
    def from_json(cls, record: dict) -> "Standardisation":
        """The transform of :meth:`to_json`'s record.

        :raises ValueError: a record of another kind of transform or with missing entries.
        """
        if not isinstance(record, dict) or record.get("kind") != "standardisation":
            raise ValueError(f"not a standardisation record: {record!r}")
        try:
            return cls(
                record["input_mean"],
                record["input_scale"],
                record.get("target_mean"),
                record.get("target_scale"),
            )
        except KeyError as err:
            raise ValueError(f"the standardisation record has no {err.args[0]!r}") from None
