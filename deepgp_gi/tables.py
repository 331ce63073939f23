"""A user's data table: read, checked column by column, and written (the ``deepgp-gi`` table
commands).

A table is a CSV file with a header row, or a Parquet file (``.parquet`` or ``.pq``; reading and
writing it needs ``pyarrow``). Rows are counted from 1, the header excluded, in every message.
Every problem raises a :class:`TableError` (a ``ValueError``) whose one-line message names the
file, and the column and row where there is one.
"""

from __future__ import annotations

import csv
import math
import os
import tempfile
from typing import Dict, List, Optional, Sequence

import numpy as np

__all__ = [
    "Table",
    "TableError",
    "read_table",
    "write_table",
    "check_writable",
    "is_parquet",
    "ClassLabels",
]

PARQUET_SUFFIXES = (".parquet", ".pq")


class TableError(ValueError):
    """A table that cannot be read or used; the message names the file, column and row."""


def is_parquet(path: str) -> bool:
    """Whether ``path`` names a Parquet file (by its suffix)."""
    return os.fspath(path).lower().endswith(PARQUET_SUFFIXES)


def _pyarrow(path: str, what: str):
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise TableError(
            f"{path}: {what} a Parquet file needs pyarrow (pip install pyarrow), or use CSV"
        ) from None
    return pyarrow


class Table:
    """The columns of a table, in file order: name -> ``[N]`` array of its cells (strings from
    CSV, the stored values from Parquet).

    :ivar path: the file it was read from.
    :ivar names: the column names.
    :ivar num_rows: N.
    """

    def __init__(self, path: str, columns: Dict[str, np.ndarray]):
        self.path, self.columns = path, columns
        self.names = list(columns)
        self.num_rows = len(next(iter(columns.values()))) if columns else 0

    def require(self, names: Sequence[str], what: str) -> None:
        """Refuse names that are not columns of the table (``what`` says whose they are)."""
        missing = [n for n in names if n not in self.columns]
        if missing:
            raise TableError(
                f"{self.path}: no column {missing[0]!r} ({what}); its columns are "
                f"{', '.join(map(repr, self.names))}"
            )

    def numeric(self, names: Sequence[str]) -> np.ndarray:
        """The columns ``names`` as a float64 ``[N, len(names)]`` array.

        :raises TableError: a missing column, or a cell that is empty, not a number, NaN or infinite
            (the column and row are named).
        """
        self.require(names, "asked for")
        out = np.empty((self.num_rows, len(names)), dtype=np.float64)
        for j, name in enumerate(names):
            for i, cell in enumerate(self.columns[name]):
                out[i, j] = self._number(cell, name, i)
        return out

    def _number(self, cell, name: str, i: int) -> float:
        where = f"{self.path}: column {name!r}, row {i + 1}"
        if cell is None or (isinstance(cell, str) and not cell.strip()):
            raise TableError(f"{where} is empty; every cell must hold a number")
        if isinstance(cell, (bool, np.bool_)):
            raise TableError(f"{where} holds {cell!r}, not a number")
        try:
            value = float(cell.strip() if isinstance(cell, str) else cell)
        except (TypeError, ValueError):
            raise TableError(f"{where} holds {str(cell)[:40]!r}, not a number") from None
        if not math.isfinite(value):
            raise TableError(f"{where} holds {value}, not a finite number")
        return value

    def cells(self, name: str) -> List[str]:
        """Column ``name``'s cells as stripped strings (class labels).

        :raises TableError: a missing column or an empty cell.
        """
        self.require([name], "asked for")
        out = []
        for i, cell in enumerate(self.columns[name]):
            text = "" if cell is None else str(cell).strip()
            if not text:
                raise TableError(
                    f"{self.path}: column {name!r}, row {i + 1} is empty; every cell must hold a "
                    "label"
                )
            out.append(text)
        return out


def _read_csv(path: str) -> Dict[str, np.ndarray]:
    with open(
        path, newline="", encoding="utf-8-sig"
    ) as fh:  # a spreadsheet's byte-order mark is dropped
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or not any(h.strip() for h in header):
            raise TableError(f"{path}: the table is empty (no header row)")
        names = [h.strip() for h in header]
        rows = []
        for line, row in enumerate(reader, start=2):
            if not row:  # a blank line
                continue
            if len(row) != len(names):
                raise TableError(
                    f"{path}: row {len(rows) + 1} (line {line}) has {len(row)} cells but the "
                    f"header has {len(names)} columns"
                )
            rows.append(row)
    _check_names(path, names)
    return {name: np.array([row[j] for row in rows], dtype=object) for j, name in enumerate(names)}


def _check_names(path: str, names: List[str]) -> None:
    if any(not n for n in names):
        raise TableError(f"{path}: column {names.index('') + 1} of the header has no name")
    seen = set()
    for n in names:
        if n in seen:
            raise TableError(f"{path}: the header names column {n!r} twice")
        seen.add(n)


def _read_parquet(path: str) -> Dict[str, np.ndarray]:
    pa = _pyarrow(path, "reading")
    table = pa.parquet.read_table(path)
    names = [str(n) for n in table.column_names]
    _check_names(path, names)
    return {
        name: np.array(table.column(j).to_pylist(), dtype=object) for j, name in enumerate(names)
    }


def read_table(path) -> Table:
    """The table at ``path`` (CSV, or Parquet by its suffix).

    :raises TableError: a missing or unreadable file, no header, a row of the wrong length, a
        duplicated or empty column name, or no data rows.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise TableError(f"{path}: no such file")
    try:
        columns = _read_parquet(path) if is_parquet(path) else _read_csv(path)
    except TableError:
        raise
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise TableError(f"{path}: cannot be read ({err})") from None
    except Exception as err:  # pyarrow's errors  # pragma: no cover - needs pyarrow
        raise TableError(f"{path}: cannot be read as Parquet ({err})") from None
    table = Table(path, columns)
    if table.num_rows == 0:
        raise TableError(f"{path}: the table is empty (a header and no rows)")
    return table


def check_writable(path, overwrite: bool, flag: str = "--out") -> str:
    """``path`` as a str, refused if it exists and ``overwrite`` is False (checked before any work).

    :raises TableError: ``path`` exists (naming ``flag``'s remedy), or its directory does not.
    """
    path = os.fspath(path)
    if os.path.lexists(path) and not overwrite:
        raise TableError(f"{path} already exists; pass --overwrite to replace it")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise TableError(f"{flag} {path}: the directory {parent} does not exist")
    return path


def write_table(path, columns: Dict[str, np.ndarray], overwrite: bool = False) -> None:
    """Write ``columns`` (name -> ``[N]`` floats) to ``path`` (CSV with a header, floats written
    exactly; or Parquet by the suffix), atomically: a temporary file beside it renamed into place.

    :raises TableError: ``path`` exists and ``overwrite`` is False, or Parquet without pyarrow.
    """
    path = check_writable(path, overwrite)
    names = list(columns)
    arrays = [np.asarray(columns[n], dtype=np.float64) for n in names]
    pa = _pyarrow(path, "writing") if is_parquet(path) else None
    fd, tmp = tempfile.mkstemp(
        prefix=f".{os.path.basename(path)}.",
        suffix=".partial",
        dir=os.path.dirname(os.path.abspath(path)),
    )
    try:
        if pa is not None:
            os.close(fd)
            pa.parquet.write_table(pa.table({n: a for n, a in zip(names, arrays)}), tmp)
        else:
            with os.fdopen(fd, "w", newline="") as fh:
                writer = csv.writer(fh)
                writer.writerow(names)
                for row in zip(*arrays):
                    writer.writerow([repr(float(v)) for v in row])
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


class ClassLabels:
    """A classifier's class names and the map from a table's label cells to indices 0..C-1.

    Labels that are all integers are ordered numerically (so labels 0..C-1 keep their values);
    any others are class names in sorted order.

    :ivar names: the class names, index ``c`` for class ``c``.
    """

    def __init__(self, names: Sequence[str]):
        self.names = [str(n) for n in names]
        self._index = {n: c for c, n in enumerate(self.names)}

    @classmethod
    def from_cells(cls, cells: Sequence[str], column: str, path: str) -> "ClassLabels":
        """The classes of a training table's label column.

        :raises TableError: fewer than two classes.
        """
        unique = sorted(set(cells))
        as_int = [_integer(c) for c in unique]
        if all(v is not None for v in as_int):
            names = [str(v) for v in sorted(set(as_int))]
        else:
            names = unique
        if len(names) < 2:
            raise TableError(
                f"{path}: column {column!r} holds one class only ({names[0]!r}); a classifier "
                "needs two or more"
            )
        return cls(names)

    def indices(self, cells: Sequence[str], column: str, path: str) -> np.ndarray:
        """The class indices ``[N, 1]`` (floats) of label cells.

        :raises TableError: a label that is not one of the classes (column and row named).
        """
        out = np.empty((len(cells), 1), dtype=np.float64)
        for i, cell in enumerate(cells):
            c = self._index.get(cell)
            if c is None:
                number = _integer(cell)
                c = None if number is None else self._index.get(str(number))
            if c is None:
                raise TableError(
                    f"{path}: column {column!r}, row {i + 1} holds {cell!r}, which is not one of "
                    f"the model's classes {', '.join(map(repr, self.names))}"
                )
            out[i, 0] = c
        return out


def _integer(text: str) -> Optional[int]:
    """``text`` as an int if it is an integer (``"3"``, ``"3.0"``), else None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if math.isfinite(value) and value == int(value) else None
