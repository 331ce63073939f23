"""What the benchmark scripts share: the commit stamp of a result line, appending and reading result
lines (one JSON object a line), mean ± one standard error, and TensorFlow's thread limits."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from typing import Dict, Iterable, List, Optional, Tuple

import numpy as np

__all__ = ["code_commit", "append_line", "read_lines", "mean_se", "set_threads"]


def code_commit() -> str:
    """The commit a result line records: ``DEEPGP_GI_COMMIT`` when set (a copied tree, whose git
    metadata may be missing or stale), else the short hash of the checkout the imported
    ``deepgp_gi`` comes from, with ``-dirty`` when ``deepgp_gi/`` has uncommitted edits;
    ``"unknown"`` without git."""
    if os.environ.get("DEEPGP_GI_COMMIT"):
        return os.environ["DEEPGP_GI_COMMIT"]
    import deepgp_gi

    package = os.path.dirname(os.path.abspath(deepgp_gi.__file__))
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=package, capture_output=True, text=True,
                             timeout=10).stdout.strip()
        if not rev:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", "deepgp_gi"],
                               cwd=os.path.dirname(package), capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):  # no git on the machine
        return "unknown"


def append_line(path: str, record: Dict) -> None:
    """Append ``record`` to the results file ``path`` as one JSON line (its folder made if missing),
    flushed to the disk, so that a run killed later loses nothing already written."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as fh:
        fh.write(json.dumps(record) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read_lines(path: str) -> List[Dict]:
    """The JSON records of a results file, one per line, in file order (a line that does not parse,
    such as the truncated last line of a killed run, is skipped; a missing file has none)."""
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    return out


def mean_se(values: Iterable[float]) -> Tuple[float, float, int]:
    """``(mean, standard error, n)`` of ``values``: the standard error is the sample standard
    deviation (ddof 1) over ``sqrt(n)``, NaN for one value; the mean is NaN too for none."""
    v = np.asarray(list(values), dtype=float)
    n = len(v)
    if n == 0:
        return float("nan"), float("nan"), 0
    se = float(np.std(v, ddof=1) / math.sqrt(n)) if n > 1 else float("nan")
    return float(np.mean(v)), se, n


def set_threads(threads: Optional[int]) -> None:
    """Limit TensorFlow to ``threads`` intra- and inter-op threads (``None`` or 0: leave it). When
    TensorFlow is already initialised in this process (e.g. under pytest), warn instead of failing."""
    import tensorflow as tf

    if threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError as err:
            if tf.config.threading.get_intra_op_parallelism_threads() != threads:
                print(f"warning: --threads {threads} not applied: {err}", file=sys.stderr)
