"""Input checks shared by every public entry point.

Each check raises ``ValueError`` or ``TypeError`` with a message that names the argument and the
problem, before any work starts. Nothing is silently repaired.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import tensorflow as tf

__all__ = [
    "as_data_array",
    "check_data_pair",
    "check_positive_int",
    "check_positive_float",
    "check_seed",
    "check_choice",
]


def _describe_bad(arr: np.ndarray, name: str) -> str:
    bad = ~np.isfinite(arr)
    rows = np.nonzero(bad.reshape(arr.shape[0], -1).any(axis=1))[0]
    kind = "NaN" if np.isnan(arr).any() else "inf"
    return f"{name} contains {kind} at row {int(rows[0])}" + (
        f" (and {len(rows) - 1} more rows)" if len(rows) > 1 else ""
    )


def as_data_array(
    value,
    name: str,
    dtype: tf.DType,
    *,
    ndim: int = 2,
    columns: Optional[int] = None,
    allow_empty: bool = False,
) -> tf.Tensor:
    """Validate a data array and return it as a tensor of ``dtype``.

    Accepts numpy arrays and tensors of any real floating or integer dtype whose values convert
    exactly enough; rejects complex, boolean, string or object data (``TypeError``), a tensor of
    a different floating dtype than the model's (``TypeError``: cast it explicitly), the wrong rank
    or column count, empty data and NaN/inf (``ValueError``). In compiled code (symbolic tensors)
    only the static checks run.
    """
    if isinstance(value, tf.Tensor) and not tf.executing_eagerly():
        if value.shape.rank is not None and value.shape.rank != ndim:
            raise ValueError(f"{name} must be {ndim}-D, got shape {value.shape}")
        if value.dtype != dtype:
            raise TypeError(f"{name} has dtype {value.dtype.name} but the model uses {dtype.name}")
        return value
    if isinstance(value, (tf.Tensor, tf.Variable)):
        if value.dtype.is_floating and value.dtype != dtype:
            raise TypeError(
                f"{name} is a {value.dtype.name} tensor but the model uses {dtype.name}; cast it explicitly"
            )
        arr = value.numpy()
    else:
        try:
            arr = np.asarray(value)
        except Exception as err:  # pragma: no cover - numpy error text is enough context
            raise TypeError(f"{name} cannot be converted to an array: {err}") from err
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if arr.ndim != ndim:
        hint = f"; reshape it, e.g. {name}[:, None]" if (ndim == 2 and arr.ndim == 1) else ""
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}{hint}")
    if arr.shape[0] == 0 and not allow_empty:
        raise ValueError(f"{name} is empty (0 rows)")
    if columns is not None and arr.shape[-1] != columns:
        raise ValueError(f"{name} has {arr.shape[-1]} columns but {columns} are expected")
    if arr.size and not np.all(np.isfinite(arr)):
        raise ValueError(_describe_bad(arr, name))
    return tf.convert_to_tensor(arr, dtype=dtype)


def check_data_pair(X: tf.Tensor, Y: tf.Tensor, x_name: str = "X", y_name: str = "Y") -> None:
    """Raise if X and Y have different numbers of rows."""
    nx, ny = X.shape[0], Y.shape[0]
    if nx is not None and ny is not None and nx != ny:
        raise ValueError(f"{x_name} has {nx} rows but {y_name} has {ny}")


def check_positive_int(value, name: str, minimum: int = 1) -> int:
    """An integer >= ``minimum``; bools and floats are rejected."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def check_choice(value, name: str, choices: Tuple[str, ...]) -> str:
    """``value`` must be one of ``choices``."""
    if value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(map(repr, choices))}")
    return value


def check_positive_float(value, name: str) -> float:
    """A positive finite real number (int or float; bools rejected), returned as ``float``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def check_seed(seed, name: str = "seed") -> Optional[int]:
    """``None`` or an integer that fits in int64 (bools rejected); returned as ``int`` or ``None``."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{name} must be an integer or None, got {seed!r}")
    seed = int(seed)
    if not -(2**63) <= seed < 2**63:
        raise ValueError(f"{name} must fit in a 64-bit integer, got {seed}")
    return seed
