"""Sphinx configuration of deepgp_gi's documentation: ``make docs`` builds it into docs/_build/html.

The Markdown pages are read with MyST, the notebooks under notebooks/ are rendered from their
committed outputs (never executed here), and the API reference has one page per module, generated
by autosummary from the docstrings (docs/_templates/autosummary/module.rst,
docs/_ext/api_reference.py).
"""
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS / "_ext"))

import api_reference  # noqa: E402  (docs/_ext)

import deepgp_gi  # noqa: E402

project = "deepgp_gi"
author = "deepgp_gi developers"
copyright = "deepgp_gi developers"
release = version = deepgp_gi.__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "api_reference",
]

# -- the notebooks: copies of notebooks/NN_*.ipynb (the executed ones), rendered as they are ------
NOTEBOOKS = DOCS / "notebooks"
NOTEBOOKS.mkdir(exist_ok=True)
for source in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
    copy = NOTEBOOKS / source.name
    if not copy.exists() or copy.read_bytes() != source.read_bytes():
        shutil.copyfile(source, copy)
for stale in NOTEBOOKS.glob("*.ipynb"):
    if not (ROOT / "notebooks" / stale.name).exists():
        stale.unlink()

nb_execution_mode = "off"
nb_merge_streams = True

# -- Markdown ------------------------------------------------------------------------------------
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
myst_enable_extensions: list = []
myst_heading_anchors = 4
exclude_patterns = ["_build", "_templates", "_ext", "Thumbs.db", ".DS_Store"]
root_doc = "index"

# -- the API reference ---------------------------------------------------------------------------
autosummary_generate = True
autosummary_context = {"api": api_reference.scan()}
autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
add_module_names = False
python_use_unqualified_type_names = True

# Strict: `make docs` runs sphinx-build -W --keep-going -n, so every unresolved reference fails the
# build, except references to the types of the libraries below (no intersphinx: the build must not
# need the network).
nitpicky = True
_EXTERNAL = ["tf", "tensorflow", "tfp", "tensorflow_probability", "tf_keras", "gpflow",
             "check_shapes", "np", "numpy", "scipy", "typing", "collections", "pathlib", "os"]
nitpick_ignore_regex = [("py:.*", rf"({'|'.join(_EXTERNAL)})(\..*)?")]

# -- HTML ----------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = "deepgp_gi"
html_theme_options = {
    "navigation_with_keys": False,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_show_sourcelink = False
templates_path = ["_templates"]
