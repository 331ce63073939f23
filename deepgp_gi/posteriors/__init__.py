"""Approximate posteriors for deep GPs and BNNs; each implements :class:`DeepPosterior`.

What lives where:

* :mod:`.base` -- the interface (:class:`DeepPosterior`, :class:`Propagation`) and the
  ``propagate`` prologue;
* :mod:`.conditionals` -- the per-layer GP conditional as pure functions (one batched solve);
* :mod:`.pseudo_data` -- pseudo-outputs and precisions, and the one Bayesian linear regression
  behind every inducing posterior, in function and in weight space;
* :mod:`.prior_scales` -- the weight prior's precision, ``q(s)`` of random-scale priors and ``q(L)``
  of the spatial inverse-Wishart prior;
* :mod:`.mean_field`, :mod:`.structured` (fully-coupled, STAR), :mod:`.inducing` (global and
  local inducing, deep GPs and BNNs), :mod:`.factorised` (BNN factorised, fac->gi, rand->gi),
  :mod:`.inducing_weights` (FFG-U, Ensemble-U, Ensemble-W; Ritter et al. 2021).

The name tables (``"mean_field"`` -> class and initialiser) are in :mod:`deepgp_gi.families`.
"""
from .base import DeepPosterior, Propagation
from .factorised import FactorisedGlobalPosterior, FactorisedWeightPosterior, RandomGlobalPosterior
from .inducing import GlobalInducingPosterior, LocalInducingPosterior
from .inducing_weights import EnsembleInducingPosterior, EnsembleWeightPosterior, FFGInducingPosterior
from .mean_field import MeanFieldPosterior
from .prior_scales import ScalePosterior, SpatialIWPosterior
from .pseudo_data import PseudoData
from .structured import FullyCoupledPosterior, StripesArrowPosterior

__all__ = [
    "DeepPosterior",
    "Propagation",
    "MeanFieldPosterior",
    "FullyCoupledPosterior",
    "StripesArrowPosterior",
    "GlobalInducingPosterior",
    "LocalInducingPosterior",
    "FactorisedWeightPosterior",
    "FactorisedGlobalPosterior",
    "RandomGlobalPosterior",
    "FFGInducingPosterior",
    "EnsembleInducingPosterior",
    "EnsembleWeightPosterior",
    "PseudoData",
    "ScalePosterior",
    "SpatialIWPosterior",
]
