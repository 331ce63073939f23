"""Every notebook (``notebooks/NN_*.py``, jupytext percent scripts) runs top to bottom in a fresh
kernel in its quick setting (``DEEPGP_GI_QUICK=1``); any cell error fails the test. The runs are
marked ``slow``: ``make test-all`` executes them, ``make test`` does not.

Needs the ``notebooks`` extra (jupytext, nbclient, ipykernel, matplotlib), which ``dev`` includes;
without it the tests are skipped with the reason.
"""

import importlib.util
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.py"))

_MISSING = [
    m
    for m in ("jupytext", "nbclient", "ipykernel", "matplotlib")
    if importlib.util.find_spec(m) is None
]
pytestmark = pytest.mark.skipif(
    bool(_MISSING),
    reason=f"notebook tests need {', '.join(_MISSING)} (pip install -e '.[notebooks]')",
)


def _runner():
    spec = importlib.util.spec_from_file_location(
        "run_notebooks", ROOT / "notebooks" / "run_notebooks.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_notebooks_exist():
    assert NOTEBOOKS, "no notebooks/NN_*.py found"


# tens of seconds each (a fresh kernel imports TensorFlow and trains): `make test-all`
@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_quick_mode(path, monkeypatch):
    runner = _runner()
    monkeypatch.setenv("DEEPGP_GI_QUICK", "1")
    pythonpath = os.environ.get("PYTHONPATH")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(ROOT)] + ([pythonpath] if pythonpath else []))
    )
    nb = runner.execute(path, timeout=600)  # raises nbclient's CellExecutionError on any cell error
    errors = [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, errors
