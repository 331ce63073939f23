"""deepgp_gi: deep Gaussian processes and Bayesian neural networks with structured posteriors.

>>> import deepgp_gi as dg
>>> model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field")
>>> history = dg.fit(model, (X, Y), steps=1000)
"""
import os as _os

_os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from . import autocorrelation, conv_layers, datasets, families, kernels, layers, linalg, metrics, noise, posteriors, priors  # noqa: E402,E501
from .bnn import build_bnn  # noqa: E402
from .builders import build_deep_gp  # noqa: E402
from .conv_bnn import build_conv_bnn  # noqa: E402
from .kernels import WeightKernel  # noqa: E402
from .layers import DenseLayer, GPLayer  # noqa: E402
from .linalg import safe_cholesky  # noqa: E402
from .models import DeepGP  # noqa: E402
from .posteriors.counting import parameter_count, parameter_table  # noqa: E402
from .training import History, KLSchedule, LinearSchedule, PaperSchedule, fit  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "DeepGP",
    "DenseLayer",
    "GPLayer",
    "WeightKernel",
    "build_bnn",
    "build_conv_bnn",
    "History",
    "KLSchedule",
    "LinearSchedule",
    "PaperSchedule",
    "build_deep_gp",
    "fit",
    "safe_cholesky",
    "parameter_count",
    "parameter_table",
    "autocorrelation",
    "conv_layers",
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
