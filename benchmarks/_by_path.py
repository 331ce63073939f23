"""Loads the folder of a benchmark script run by path as the package ``benchmarks``.

``python benchmarks/uci.py`` puts ``benchmarks/`` first on ``sys.path``, not the repository root, so
``import benchmarks`` would fail (or find another project's ``benchmarks``). A script run that way
imports this module first (``if not __package__: import _by_path``); importing it loads
``benchmarks/__init__.py`` as the package ``benchmarks`` with this folder as its path, so that the
script's ``from benchmarks import common`` imports its siblings as ``python -m benchmarks.uci``
would. ``sys.path`` is left as it is. A process the script spawns runs the script again by path
and loads the package the same way.
"""

import importlib.util
import os
import sys

_FOLDER = os.path.dirname(os.path.abspath(__file__))

if list(getattr(sys.modules.get("benchmarks"), "__path__", ())) != [_FOLDER]:
    _spec = importlib.util.spec_from_file_location(
        "benchmarks", os.path.join(_FOLDER, "__init__.py"), submodule_search_locations=[_FOLDER]
    )
    _package = importlib.util.module_from_spec(_spec)
    sys.modules["benchmarks"] = _package
    _spec.loader.exec_module(_package)
