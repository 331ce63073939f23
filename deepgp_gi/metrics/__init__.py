"""Metrics of a trained model: of its predictive distribution on test data, of its ELBO, and of its
training trace.

* :mod:`~deepgp_gi.metrics.predictive`: regression (test log-likelihood, RMSE, in the original
  units), calibration (:func:`predictive_cdf`, :func:`calibration_curve`) and classification
  (accuracy, ECE, predictive entropy) from Monte Carlo samples of the predictive mixture.
* :mod:`~deepgp_gi.metrics.elbo`: :func:`estimate_elbo`, the ELBO per datapoint on the full
  training set, to a target standard error.
* :mod:`~deepgp_gi.metrics.traces`: :func:`smooth_trace` and :func:`steps_to_fraction`, summaries
  of a logged training ELBO trace.
* :mod:`~deepgp_gi.metrics.layers`: :func:`layer_variances`, each layer's between-row against
  within-sample variance (a deep GP whose output layer stopped following its inputs).
"""

from . import predictive as _predictive
from .elbo import estimate_elbo
from .layers import LayerVariances, layer_variances
from .predictive import (  # noqa: F401 (re-exported: __all__ takes predictive.__all__)
    accuracy,
    calibration_curve,
    categorical_entropy,
    chunk_seed,
    constant_gaussian_test_ll,
    ece,
    evaluate_dataset,
    expected_calibration_error,
    pointwise_log_density,
    predict_class_probabilities,
    predict_in_chunks,
    predictive_cdf,
    predictive_entropy,
    rmse,
    test_log_likelihood,
    top1_accuracy,
)
from .traces import smooth_trace, steps_to_fraction

#: Every public name of :mod:`~deepgp_gi.metrics.predictive`, then those of the other modules.
__all__ = [
    *_predictive.__all__,
    "estimate_elbo",
    "smooth_trace",
    "steps_to_fraction",
    "layer_variances",
    "LayerVariances",
]
