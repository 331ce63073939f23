"""Approximate posteriors for deep GPs; each implements :class:`DeepPosterior`.

``POSTERIORS`` maps the names accepted by ``DeepGP(..., posterior=name)`` to classes that can be
built from the layers alone.
"""
from .base import DeepPosterior, Propagation
from .mean_field import MeanFieldPosterior
from .global_inducing import GlobalInducingPosterior, LocalInducingPosterior
from .structured import FullyCoupledPosterior, StripesArrowPosterior
from .weights import (
    FactorisedGlobalPosterior,
    FactorisedWeightPosterior,
    GlobalInducingWeightPosterior,
    LocalInducingWeightPosterior,
    RandomGlobalPosterior,
)

POSTERIORS = {
    "mean_field": MeanFieldPosterior,
    "fully_coupled": FullyCoupledPosterior,
    "stripes_arrow": StripesArrowPosterior,
    "global": GlobalInducingPosterior,
    "local": LocalInducingPosterior,
}

__all__ = [
    "DeepPosterior",
    "Propagation",
    "MeanFieldPosterior",
    "FullyCoupledPosterior",
    "StripesArrowPosterior",
    "GlobalInducingPosterior",
    "LocalInducingPosterior",
    "FactorisedWeightPosterior",
    "LocalInducingWeightPosterior",
    "GlobalInducingWeightPosterior",
    "FactorisedGlobalPosterior",
    "RandomGlobalPosterior",
    "POSTERIORS",
]
