"""Approximate posteriors for deep GPs and BNNs; each implements :class:`DeepPosterior`.

What lives where. The *kit* modules hold the maths the families share:

* :mod:`.base` -- the interface: :class:`DeepPosterior` (abstract, shape-checked
  ``propagate``), :class:`Propagation`, the ``propagate`` prologue and the last layer's draw;
* :mod:`.conditionals` -- the per-layer GP conditional as pure functions (one batched solve),
  and the check that layers carry local inducing inputs;
* :mod:`.pseudo_data` -- pseudo-outputs and precisions, and the one Bayesian linear regression
  behind every inducing posterior, in function and in weight space: weight draws, log-ratios,
  analytic KLs, marginal variances, the per-layer regulariser and the ``kl`` /
  ``last_layer`` option values;
* :mod:`.weight_space` -- the BNN side: :class:`~.weight_space.WeightSpacePosterior` (the base of
  the weight posteriors), factorised Gaussian weights with their KL and local
  reparameterisation, and the weight-space inducing layer;
* :mod:`.prior_scales` -- the weight prior's precision, ``q(s)`` of random-scale priors and ``q(L)``
  of the spatial inverse-Wishart prior;
* :mod:`.structured_linalg` -- the fully-coupled and STAR families' linear algebra;
* :mod:`.draws` -- one draw of every layer's inducing outputs (a latent-variable model's input);
* :mod:`.counting` -- counting variational parameters.

The *family* modules each define posteriors from the kit and import no other family module:
:mod:`.mean_field`, :mod:`.structured` (fully-coupled, and the base it shares with STAR),
:mod:`.stripes_arrow` (STAR), :mod:`.inducing` (global and local
inducing, deep GPs and BNNs), :mod:`.factorised` (BNN factorised, fac->gi, rand->gi),
:mod:`.convolutional` (convolutional BNNs), :mod:`.inducing_weights` (FFG-U, Ensemble-U,
Ensemble-W; Ritter et al. 2021) and :mod:`.sghmc` (SGHMC samples of a deep GP's inducing outputs,
Havasi et al. 2018: a sampler, not a variational family), :mod:`.dspp` (deep sigma point
processes, Jankowiak et al. 2020: mean-field with learned sigma-point paths), and :mod:`.bsgp`
(BSGP, Rossi et al. 2021: SGHMC's sampler over the inducing inputs and kernel hyperparameters too, a
subclass of SGHMC's).

The name tables (``"mean_field"`` -> class) and :func:`register`, which adds a family defined
outside the package, are in :mod:`.registry`.
"""

from .base import DeepPosterior, Propagation
from .bsgp import BSGPPosterior
from .convolutional import (
    ConvNetPosterior,
    FactorisedConvPosterior,
    FactorisedGlobalConvPosterior,
    GlobalConvPosterior,
    LocalConvPosterior,
)
from .draws import InducingDraw
from .dspp import DSPPPosterior
from .factorised import FactorisedGlobalPosterior, FactorisedWeightPosterior, RandomGlobalPosterior
from .inducing import (
    GlobalInducingBNNPosterior,
    GlobalInducingPosterior,
    LocalInducingBNNPosterior,
    LocalInducingPosterior,
)
from .inducing_weights import (
    EnsembleInducingPosterior,
    EnsembleWeightPosterior,
    FFGInducingPosterior,
)
from .mean_field import MeanFieldPosterior
from .prior_scales import ScalePosterior, SpatialIWPosterior
from .pseudo_data import PseudoData
from .registry import (
    BNN_FAMILIES,
    CONV_BNN_FAMILIES,
    DEEP_GP_FAMILIES,
    family_class,
    family_name,
    register,
)
from .sghmc import SGHMCPosterior
from .stripes_arrow import StripesArrowPosterior
from .structured import FullyCoupledPosterior

__all__ = [
    "DeepPosterior",
    "Propagation",
    "MeanFieldPosterior",
    "FullyCoupledPosterior",
    "StripesArrowPosterior",
    "GlobalInducingPosterior",
    "LocalInducingPosterior",
    "GlobalInducingBNNPosterior",
    "LocalInducingBNNPosterior",
    "ConvNetPosterior",
    "FactorisedConvPosterior",
    "LocalConvPosterior",
    "GlobalConvPosterior",
    "FactorisedGlobalConvPosterior",
    "InducingDraw",
    "FactorisedWeightPosterior",
    "FactorisedGlobalPosterior",
    "RandomGlobalPosterior",
    "FFGInducingPosterior",
    "EnsembleInducingPosterior",
    "EnsembleWeightPosterior",
    "SGHMCPosterior",
    "BSGPPosterior",
    "DSPPPosterior",
    "PseudoData",
    "ScalePosterior",
    "SpatialIWPosterior",
    "DEEP_GP_FAMILIES",
    "BNN_FAMILIES",
    "CONV_BNN_FAMILIES",
    "register",
    "family_class",
    "family_name",
]
