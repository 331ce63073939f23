"""What the benchmark scripts share: the commit stamp of a result line, appending and reading result
lines (one JSON object a line), a resumed run's trace up to its checkpoint, mean ± one standard
error, and TensorFlow's thread limits.

Result lines travel: :func:`append_line` writes every string of a record through :func:`portable`,
so a command or an error message names paths relative to the checkout (``benchmarks/...``), a
checkpoint directory as ``CKPT_DIR``, another checkout as ``CHECKOUT`` and any other folder of the
machine as ``TMP_DIR``, never the machine's own folders."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np

__all__ = [
    "code_commit",
    "append_line",
    "read_lines",
    "trace_to_checkpoint",
    "add_drop_lost_trace_option",
    "DROP_LOST_TRACE",
    "mean_se",
    "set_threads",
    "portable",
    "replace_between_markers",
]


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
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=package,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        if not rev:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", "deepgp_gi"],
            cwd=os.path.dirname(package),
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):  # no git on the machine
        return "unknown"


#: The checkout holding this module.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The checkout's top-level folders: an absolute path through one of them is made relative to it.
_CHECKOUT_FOLDERS = ("benchmarks", "deepgp_gi", "tests", "docs", "notebooks", "tools")
#: An absolute path in a command or message: starts at a separator-like character (or the start).
_ABSOLUTE = re.compile(r"(?<![\w.~/:-])(/[^\s\"'`),;:]+)")
_CHECKOUT_PATH = re.compile(r"^/\S*?/(" + "|".join(_CHECKOUT_FOLDERS) + r")(/\S*)?$")
_CHECKPOINT_FLAG = re.compile(r"(--checkpoint[-_]dir(?:=|\s+))(\S+)")


def _portable_path(path: str) -> str:
    if path.startswith("/path/to/"):  # a placeholder already
        return path
    match = _CHECKOUT_PATH.match(path)
    prefix = path[: match.start(1)] if match else ""
    if match and not any(part.startswith(".") for part in prefix.split("/")):  # not a cache folder
        return match.group(1) + (match.group(2) or "")
    if "ckpt" in path or "checkpoint" in path:
        return "CKPT_DIR"
    home = os.path.expanduser("~")
    if home not in ("", "/") and (path == home or path.startswith(home + "/")):
        return "~" + path[len(home) :]
    if os.path.isdir(os.path.join(path, "deepgp_gi")) or path.rstrip("/") == _ROOT:
        return "CHECKOUT"
    return "TMP_DIR/" + os.path.basename(path.rstrip("/")) if path.rstrip("/") else path


def portable(text: str) -> str:
    """``text`` with the machine's own folders replaced (module docs): a path through the
    checkout's folders becomes relative (``/x/y/benchmarks/uci.py`` -> ``benchmarks/uci.py``), a
    checkpoint directory (the value of ``--checkpoint-dir``, or a path naming a checkpoint)
    ``CKPT_DIR``, the home folder ``~``, a checkout ``CHECKOUT``, any other absolute path
    ``TMP_DIR/<its last name>``."""
    text = _CHECKPOINT_FLAG.sub(
        lambda m: m.group(1) + (m.group(2) if not m.group(2).startswith("/") else "CKPT_DIR"), text
    )
    return _ABSOLUTE.sub(lambda m: _portable_path(m.group(1)), text)


def _portable_record(value):
    if isinstance(value, str):
        return portable(value)
    if isinstance(value, dict):
        return {k: _portable_record(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_portable_record(v) for v in value]
    return value


def append_line(path: str, record: Dict) -> None:
    """Append ``record`` to the results file ``path`` as one JSON line (its folder made if missing),
    flushed to the disk, so that a run killed later loses nothing already written. Its strings
    are written through :func:`portable`."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as fh:
        fh.write(json.dumps(_portable_record(record)) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def commands_footer(lines: Iterable[Dict]) -> List[str]:
    """The closing lines of a results table: ``Commands:`` and each distinct ``command`` of
    ``lines`` (sorted, in backticks), with a blank line before and after."""
    commands = sorted({line["command"] for line in lines})
    return ["", "Commands:", *[f"- `{c}`" for c in commands], ""]


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


#: The sweep option that lets :func:`trace_to_checkpoint` drop a run's trace past its checkpoint.
DROP_LOST_TRACE = "--drop-lost-trace"


def add_drop_lost_trace_option(parser) -> None:
    """Add :data:`DROP_LOST_TRACE` (``args.drop_lost_trace``) to an argparse ``parser``."""
    parser.add_argument(
        DROP_LOST_TRACE,
        action="store_true",
        help="a run whose trace goes past its checkpoint (the checkpoint that run wrote is gone): "
        "drop those trace lines and train the steps again (default: stop with an error)",
    )


def trace_to_checkpoint(
    path: str, key: Callable[[Dict], tuple], run: tuple, done: int, drop_later: bool
) -> List[Dict]:
    """The trace lines of one run (those with ``key(line) == run``) up to step ``done``, the step
    its checkpoint holds, in file order.

    Lines of that run past ``done`` were written by an earlier invocation whose checkpoint is no
    longer there (another checkpoint folder, or one deleted): training again from ``done`` would
    trace those steps a second time. That raises ``SystemExit`` naming the steps and
    :data:`DROP_LOST_TRACE`; with ``drop_later`` those lines are removed from ``path`` instead
    (every other line, one that does not parse included, is kept byte for byte) and the run
    traces them anew."""
    raw = []
    if os.path.exists(path):
        with open(path) as fh:
            raw = fh.readlines()
    records = []  # (raw line, its record or None)
    for line in raw:
        try:
            record = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            record = None
        records.append((line, record if isinstance(record, dict) else None))
    mine = [r for _, r in records if r is not None and key(r) == run]
    later = sorted({r["step"] for r in mine if r["step"] > done})
    if later and not drop_later:
        raise SystemExit(
            f"{portable(path)} traces steps {later[0]}-{later[-1]} of this run, but its checkpoint "
            f"is at step {done}: is the checkpoint folder the one that run used? If that "
            f"checkpoint is gone, pass {DROP_LOST_TRACE} to drop those trace lines and train the "
            "steps again"
        )
    if later:
        partial = path + ".partial"
        with open(partial, "w") as fh:
            fh.writelines(
                line for line, r in records if r is None or key(r) != run or r["step"] <= done
            )
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(partial, path)
        print(f"dropped the trace lines of steps {later[0]}-{later[-1]} from {portable(path)}")
    return [r for r in mine if r["step"] <= done]


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
    TensorFlow is already initialised in this process (e.g. under pytest), warn instead
    of failing."""
    import tensorflow as tf

    if threads:
        try:
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError as err:
            if tf.config.threading.get_intra_op_parallelism_threads() != threads:
                print(f"warning: --threads {threads} not applied: {err}", file=sys.stderr)


def replace_between_markers(path: str, text: str, markers: Tuple[str, str]) -> None:
    """Write ``text`` between the two marker lines of the file at ``path`` (both must be there)."""
    with open(path) as fh:
        content = fh.read()
    start, end = content.find(markers[0]), content.find(markers[1])
    if start < 0 or end < start:
        raise ValueError(f"{path} lacks the generated-block markers {markers}")
    head = content[: start + len(markers[0])]
    with open(path, "w") as fh:
        fh.write(head + "\n" + text.rstrip("\n") + "\n" + content[end:])
