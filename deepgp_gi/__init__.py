"""deepgp_gi: deep Gaussian processes and Bayesian neural networks with structured posteriors.

>>> import deepgp_gi as dg
>>> model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field")
>>> history = dg.fit(model, (X, Y), steps=1000)

``import deepgp_gi`` itself does not import TensorFlow: the first use of a name listed in
``__all__`` (``dg.build_deep_gp``, ``dg.kernels``, ...) imports all of them, as an eager import
would; another module of the package (``dg.uci_protocol``, ``from deepgp_gi import cli``) is
imported on its own.
The ``deepgp-gi`` command relies on this to set TensorFlow's logging environment before
TensorFlow loads (:mod:`deepgp_gi.cli`).
"""

import importlib as _importlib
import importlib.util as _importlib_util
import os as _os
from typing import TYPE_CHECKING as _TYPE_CHECKING

_os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from .version import __version__  # noqa: F401  (no TensorFlow: a plain module)

# The names a star import takes (a literal list, which type checkers and linters read).
__all__ = [
    "DeepGP",
    "LatentDeepGP",
    "DenseLayer",
    "GPLayer",
    "WeightKernel",
    "build_bnn",
    "build_conv_bnn",
    "History",
    "KLSchedule",
    "LinearSchedule",
    "PaperSchedule",
    "ConstantSchedule",
    "build_deep_gp",
    "fit",
    "collect_samples",
    "save",
    "load",
    "safe_cholesky",
    "parameter_count",
    "parameter_table",
    "autocorrelation",
    "datasets",
    "families",
    "kernels",
    "layers",
    "linalg",
    "metrics",
    "noise",
    "posteriors",
    "priors",
]

# The exported names that are not modules: name -> the module (relative to the package) that
# defines it; _load imports them in this order, after the modules.
_NAMES = {
    "build_bnn": "bnn",
    "build_deep_gp": "builders",
    "build_conv_bnn": "conv_bnn",
    "WeightKernel": "kernels",
    "DenseLayer": "layers",
    "GPLayer": "layers",
    "safe_cholesky": "linalg",
    "DeepGP": "models",
    "LatentDeepGP": "latent",
    "parameter_count": "posteriors.counting",
    "parameter_table": "posteriors.counting",
    "History": "training",
    "KLSchedule": "training",
    "LinearSchedule": "training",
    "PaperSchedule": "training",
    "ConstantSchedule": "training",
    "fit": "training",
    "collect_samples": "training",
    "save": "saving",
    "load": "saving",
}
# The exported modules (the rest of __all__), in the order _load imports them.
_MODULES = tuple(name for name in __all__ if name not in _NAMES)
_loading = False

if _TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from . import (
        autocorrelation,
        datasets,
        families,
        kernels,
        layers,
        linalg,
        metrics,
        noise,
        posteriors,
        priors,
    )  # noqa: E501,F401
    from .bnn import build_bnn  # noqa: F401
    from .builders import build_deep_gp  # noqa: F401
    from .conv_bnn import build_conv_bnn  # noqa: F401
    from .kernels import WeightKernel  # noqa: F401
    from .latent import LatentDeepGP  # noqa: F401
    from .layers import DenseLayer, GPLayer  # noqa: F401
    from .linalg import safe_cholesky  # noqa: F401
    from .models import DeepGP  # noqa: F401
    from .posteriors.counting import parameter_count, parameter_table  # noqa: F401
    from .saving import load, save  # noqa: F401
    from .training import (  # noqa: F401
        ConstantSchedule,
        History,
        KLSchedule,
        LinearSchedule,
        PaperSchedule,
        collect_samples,
        fit,
    )


def _load() -> None:
    """Import every exported module and name (once; a module that imports the package's names
    while this runs gets them from the modules themselves)."""
    global _loading
    if _loading or all(name in globals() for name in _NAMES):
        return
    _loading = True
    try:
        g = globals()
        for module in _MODULES:
            g[module] = _importlib.import_module(f"{__name__}.{module}")
        for name, module in _NAMES.items():
            g[name] = getattr(_importlib.import_module(f"{__name__}.{module}"), name)
    finally:
        _loading = False


def __getattr__(name: str):
    if name in _MODULES or name in _NAMES:
        _load()
        return globals()[name]
    # any other module of the package (``from deepgp_gi import cli``, ``dg.uci_protocol``): just it
    if not name.startswith("_") and _importlib_util.find_spec(f"{__name__}.{name}") is not None:
        return _importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
