"""The documentation: every page stays short enough to read, and the site builds strictly.

The strict build (``make docs``: Sphinx with ``-W -n``, so a broken link, a broken reference or a
docstring that is not valid reStructuredText fails it) is marked ``slow`` and needs the ``docs``
extra (``pip install -e '.[docs]'``); without it the test is skipped with the reason.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: The longest a page of docs/ may be, in characters: longer topics get a page each.
MAX_PAGE_CHARS = 25_000


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_no_documentation_page_is_longer_than_the_limit(page):
    length = len((DOCS / page).read_text(encoding="utf-8"))
    assert length <= MAX_PAGE_CHARS, (
        f"docs/{page} has {length} characters (at most {MAX_PAGE_CHARS}): split it by topic"
    )


#: The longest the README may be: read in five minutes; results go to docs/results.md.
MAX_README_CHARS = 10_000


def test_the_readme_is_short():
    length = len((ROOT / "README.md").read_text(encoding="utf-8"))
    assert length < MAX_README_CHARS, (
        f"README.md has {length} characters (under {MAX_README_CHARS}): move detail to docs/"
    )


def test_the_index_lists_every_page():
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    entries = {line.strip() for line in index.splitlines()}
    missing = [p.stem for p in DOCS.glob("*.md") if p.stem != "index" and p.stem not in entries]
    assert missing == []


_MISSING = [
    m for m in ("sphinx", "myst_nb", "pydata_sphinx_theme") if importlib.util.find_spec(m) is None
]


@pytest.mark.slow
@pytest.mark.skipif(
    bool(_MISSING), reason=f"the docs build needs {', '.join(_MISSING)} (pip install -e '.[docs]')"
)
def test_the_documentation_builds_without_a_warning(tmp_path):
    """What ``make docs`` runs, into a temporary folder (about two minutes on 2 CPU cores)."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", TF_USE_LEGACY_KERAS="1")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "sphinx",
            "-b",
            "html",
            "-E",
            "-W",
            "--keep-going",
            "-n",
            "-q",
            "-d",
            str(tmp_path / "doctrees"),
            str(DOCS),
            str(tmp_path / "html"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line or "ERROR" in line]
    assert result.returncode == 0, "\n".join(warnings) or result.stderr[-3000:]
    assert (tmp_path / "html" / "index.html").exists()
    assert (tmp_path / "html" / "api" / "deepgp_gi.html").exists()
