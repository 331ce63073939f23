"""Approximate posteriors for deep GPs; each implements :class:`DeepPosterior`.

``POSTERIORS`` maps the names accepted by ``DeepGP(..., posterior=name)`` to classes that can be
built from the layers alone.
"""
from .base import DeepPosterior, Propagation
from .mean_field import MeanFieldPosterior

POSTERIORS = {
    "mean_field": MeanFieldPosterior,
}

__all__ = ["DeepPosterior", "Propagation", "MeanFieldPosterior", "POSTERIORS"]
