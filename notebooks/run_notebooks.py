"""Execute the notebooks' jupytext sources and write the paired ``.ipynb`` files with outputs.

    python notebooks/run_notebooks.py                 # every notebooks/NN_*.py, full setting
    python notebooks/run_notebooks.py 02 03           # the notebooks whose names start with 02, 03
    DEEPGP_GI_QUICK=1 python notebooks/run_notebooks.py   # the quick setting (seconds each)

Each notebook runs top to bottom in a fresh kernel whose environment is this process's, with
the repository root on ``PYTHONPATH`` (so the working copy of ``deepgp_gi`` is imported).
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def notebook_sources(prefixes=()) -> list[Path]:
    paths = sorted(p for p in HERE.glob("[0-9][0-9]_*.py"))
    if prefixes:
        paths = [p for p in paths if any(p.name.startswith(x) for x in prefixes)]
    return paths


def kernel_environment() -> None:
    """Put the repository root on PYTHONPATH and set the TensorFlow variables for the kernel."""
    parts = [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


#: stderr lines that TensorFlow and tqdm print at start-up on a CPU-only machine (not results).
_NOISE = re.compile(
    r"^(WARNING: All log messages before absl|[IWE]\d{4} [\d:.]+\s+\d+ \S+\] |"
    r".*TqdmWarning: IProgress not found|\s+from \.autonotebook import tqdm)"
)


def strip_startup_noise(nb) -> None:
    """Drop TensorFlow/tqdm start-up log lines from stderr outputs (kept: everything else)."""
    for cell in nb.cells:
        outputs = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                lines = [ln for ln in out["text"].splitlines(keepends=True) if not _NOISE.match(ln)]
                if not "".join(lines).strip():
                    continue
                out["text"] = "".join(lines)
            outputs.append(out)
        if cell.cell_type == "code":
            cell["outputs"] = outputs


def execute(path: Path, timeout: int = 1800):
    """Read a percent script with jupytext, run it with nbclient, return the executed notebook."""
    import jupytext
    import nbclient

    nb = jupytext.read(path)
    nb.metadata.setdefault(
        "kernelspec", {"display_name": "Python 3", "language": "python", "name": "python3"}
    )
    client = nbclient.NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()
    strip_startup_noise(nb)
    return nb


def main(argv=None) -> None:
    import jupytext

    kernel_environment()
    for path in notebook_sources(tuple(sys.argv[1:] if argv is None else argv)):
        start = time.time()
        nb = execute(path)
        jupytext.write(nb, path.with_suffix(".ipynb"))
        print(
            f"{path.name}: executed in {time.time() - start:.0f} s -> "
            f"{path.with_suffix('.ipynb').name}",
            flush=True,
        )


if __name__ == "__main__":
    main()
