"""The benchmarks of deepgp_gi: scripts that train, time and tabulate, and their result files.

Every script is a module of this package and runs from the repository root either way:

    python benchmarks/uci.py report
    python -m benchmarks.uci report

The modules import their siblings as ``from benchmarks import common``. ``python -m`` finds the
package through the working directory. Run by path, Python puts ``benchmarks/`` itself, not the
repository root, first on ``sys.path``; so a script's first lines then import
:mod:`benchmarks._by_path` (found beside the script), which loads this folder as the package
``benchmarks`` without touching ``sys.path``, and the script's imports work as under ``python -m``
(also in the worker processes a script spawns). The tests import the modules as
``benchmarks.<name>`` (the repository root is on pytest's ``pythonpath``). The scripts import the
library as installed (``make install``).

:mod:`benchmarks.common` holds what the scripts share: the commit stamp of a result line, appending
and reading result lines (JSON lines), mean ± standard error and TensorFlow's thread limits.
:mod:`benchmarks.timing` holds the compiled steps that ``speed.py`` and ``gpu.py`` time.
:mod:`benchmarks.experiment_config` matches the UCI sweeps' result lines to configurations (the
values of keys older lines predate). The results and the commands that regenerate each table are
under ``benchmarks/results/``.
"""
