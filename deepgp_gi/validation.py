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
    "check_choice",
    "check_float",
    "check_positive_float",
    "check_nonnegative_float",
    "check_bool",
    "check_seed",
    "check_finite_array",
    "per_layer_floats",
    "per_layer_list",
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
    item_shape: Optional[Tuple[int, ...]] = None,
) -> tf.Tensor:
    """Validate a data array and return it as a tensor of ``dtype``.

    Accepts numpy arrays and tensors of any real floating or integer dtype whose values convert
    exactly enough; rejects complex, boolean, string or object data (``TypeError``), a tensor of
    a different floating dtype than the model's (``TypeError``: cast it explicitly), the wrong rank
    or column count, empty data and NaN/inf (``ValueError``). In compiled code (symbolic tensors)
    only the static checks run. ``item_shape`` (e.g. ``(8, 8, 1)`` for images) fixes the shape of
    one row: the rank is then ``1 + len(item_shape)``.
    """
    if item_shape is not None:
        item_shape = tuple(int(d) for d in item_shape)
        ndim = 1 + len(item_shape)
    if isinstance(value, tf.Tensor) and not tf.executing_eagerly():
        if value.shape.rank is not None and value.shape.rank != ndim:
            raise ValueError(f"{name} must be {ndim}-D, got shape {value.shape}")
        if (
            item_shape is not None
            and value.shape.rank is not None
            and not value.shape[1:].is_compatible_with(item_shape)
        ):
            raise ValueError(
                f"{name} must have rows of shape {item_shape}, got shape {value.shape}"
            )
        if value.dtype != dtype:
            raise TypeError(f"{name} has dtype {value.dtype.name} but the model uses {dtype.name}")
        return value
    if isinstance(value, (tf.Tensor, tf.Variable)):
        if value.dtype.is_floating and value.dtype != dtype:
            raise TypeError(
                f"{name} is a {value.dtype.name} tensor but the model uses {dtype.name}; cast it "
                "explicitly"
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
    if item_shape is not None and tuple(arr.shape[1:]) != item_shape:
        raise ValueError(
            f"{name} must have shape [N, {', '.join(map(str, item_shape))}], got {arr.shape}"
        )
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


def check_float(value, name: str) -> float:
    """A finite real number (bools rejected)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def check_positive_float(value, name: str) -> float:
    """A positive finite real number (int or float; bools rejected), returned as ``float``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def check_float_above(value, name: str, bound: float, reason: str = "") -> float:
    """A finite number strictly above ``bound`` (int or float; bools rejected), returned as
    ``float``; ``reason``, when given, is said in the error after the bound."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float, np.integer, np.floating))
        or not bound < float(value) < np.inf
    ):
        why = f" ({reason})" if reason else ""
        raise ValueError(f"{name} must be a finite number above {bound:g}{why}, got {value!r}")
    return float(value)


def check_nonnegative_float(value, name: str) -> float:
    """A finite number >= 0 (int or float; bools rejected), returned as ``float``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")
    if not (np.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")
    return float(value)


def check_bool(value, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)


def check_seed(seed, name: str = "seed") -> Optional[int]:
    """``None`` or an integer that fits in int64 (bools rejected); returned as ``int`` or
    ``None``."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{name} must be an integer or None, got {seed!r}")
    seed = int(seed)
    if not -(2**63) <= seed < 2**63:
        raise ValueError(f"{name} must fit in a 64-bit integer, got {seed}")
    return seed


def resolve_seed(seed, name: str = "seed") -> int:
    """:func:`check_seed`, with ``None`` replaced by a freshly drawn seed (for runs that record the
    seed they used)."""
    seed = check_seed(seed, name)
    return int(np.random.default_rng().integers(0, 2**31 - 1)) if seed is None else seed


def check_finite_array(
    value, name: str, *, ndim: Optional[int] = None, shape: Optional[Tuple[int, ...]] = None
):
    """A finite real float64 NumPy array, optionally of rank ``ndim`` or exactly ``shape``."""
    if isinstance(value, (tf.Tensor, tf.Variable)):
        value = value.numpy()
    try:
        arr = np.asarray(value)
    except Exception as err:  # pragma: no cover
        raise TypeError(f"{name} cannot be converted to an array: {err}") from err
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if shape is not None and arr.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(arr.shape)}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {list(arr.shape)}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr.astype(np.float64)


def per_layer_list(value, name: str, depth: int) -> list:
    """``None`` -> ``[None] * depth``; a sequence must have one entry per layer."""
    if value is None:
        return [None] * depth
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
        raise TypeError(
            f"{name} must be a list of {depth} entries (one per layer), got {type(value).__name__}"
        )
    if len(value) != depth:
        raise ValueError(f"{name} needs {depth} entries (one per layer), got {len(value)}")
    return list(value)


def per_layer_floats(value, name: str, depth: int, default) -> list:
    """Per-layer values from None (-> ``default``), one number, or ``depth`` entries; an entry
    is a number or an array (checked where it is used)."""
    if value is None:
        value = default
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return [check_float(value, name)] * depth
    if isinstance(value, np.ndarray):
        value = list(value)
    value = per_layer_list(value, name, depth)
    return [
        v
        if isinstance(v, np.ndarray) or isinstance(v, (list, tuple))
        else check_float(v, f"{name}[{i}]")
        for i, v in enumerate(value)
    ]
