"""The family tables: one per model kind, name -> posterior class, initialiser, options.

Every place that lists family names reads these tables: ``DeepGP(layers, lik,
posterior=name)``, :func:`~deepgp_gi.build_deep_gp` (:data:`DEEP_GP_FAMILIES`),
:func:`~deepgp_gi.build_bnn` (:data:`BNN_FAMILIES`), :func:`~deepgp_gi.build_conv_bnn`
(:data:`CONV_BNN_FAMILIES`) and the ``deepgp-gi`` command. A family entry says

* ``posterior_class`` -- the :class:`~deepgp_gi.posteriors.DeepPosterior` it builds (also what
  ``DeepGP(..., posterior=name)`` constructs from the layers alone, with default values);
* ``layer_inducing`` -- what the layers carry for it: ``None`` (nothing), ``"kmeans"`` (k-means
  inducing inputs on every GP layer, DSVI), ``"normal"`` (``N(0, 1)`` inducing inputs, O&A's
  local inducing), ``"features"`` (``N(0, 1)`` inducing features on every DenseLayer) or
  ``"images"`` (``N(0, 1)`` inducing images and features on a conv network's weighted layers);
* ``initialise`` -- a named initialiser of :mod:`deepgp_gi.initialisation`, called as
  ``initialise(posterior_class, layers, X, Y, num_inducing, seed, **initialiser_options,
  **options)`` by :meth:`Family.build_posterior` (the papers' initialisation of the variational
  parameters; one policy for the global inducing rows of every model kind, stated there);
* ``options`` -- the keyword options a builder passes on (anything else is refused with this
  list in the message);
* ``positive_transform`` -- the default transform of the layers' positive hyperparameters in
  :func:`~deepgp_gi.build_deep_gp` (kernel variances and lengthscales, the white noise, the
  Gaussian likelihood's variance), following the family's reference code: ``"softplus"``
  (GPflow's, used by the DSVI and Lindinger code) or ``"exp"`` (log-parameterised, as
  bayesfunc's kernels for O&A's global and local inducing). Under Adam the exp transform moves
  a hyperparameter by a relative step per iteration instead of an absolute one, which matters
  when lengthscales must grow from 2 to 100 or more (``benchmarks/results/gi_convergence.md``).
* ``eval_row_samples`` -- how many (data row, Monte Carlo sample) pairs one evaluation call
  (``model.elbo``, ``predict_log_density``, ...) should hold at once; evaluation code
  (:func:`~deepgp_gi.experiments.run_split`) slices the rows into chunks of
  ``eval_row_samples // num_samples``. The fully-coupled family keeps the cross-covariance of
  every data row with all layers' inducing outputs, about 220 KB per pair at depth 3, M = 100 on
  kin8nm (mean-field: 17 KB, STAR: 66 KB), so its budget is smaller. It is the family's memory
  per pair, which every evaluation caller (the UCI driver, the metrics, the CLI) needs, so it
  lives with the family rather than beside one of them.

The global-inducing class is one for deep GPs and BNNs: on DenseLayers it takes the weight-space
path, so ``DeepGP(dense_layers, lik, posterior="global")`` and ``build_bnn(..., posterior="global")``
run the same code.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Tuple

from . import initialisation as init
from .posteriors import (
    BSGPPosterior,
    EnsembleInducingPosterior,
    EnsembleWeightPosterior,
    FactorisedGlobalPosterior,
    FactorisedWeightPosterior,
    FFGInducingPosterior,
    FullyCoupledPosterior,
    GlobalInducingPosterior,
    LocalInducingPosterior,
    MeanFieldPosterior,
    RandomGlobalPosterior,
    SGHMCPosterior,
    StripesArrowPosterior,
)
from .posteriors.convolutional import ConvNetPosterior

__all__ = ["Family", "DEEP_GP_FAMILIES", "BNN_FAMILIES", "CONV_BNN_FAMILIES", "posterior_class", "check_options"]


@dataclass(frozen=True)
class Family:
    """One approximate-posterior family of a model kind (see the module docs)."""

    name: str
    posterior_class: type
    initialise: Callable
    options: Tuple[str, ...]
    layer_inducing: Optional[str]
    summary: str
    positive_transform: str = "softplus"
    eval_row_samples: int = 100_000
    #: fixed keyword arguments of ``initialise`` for this family (e.g. a conv network's family name)
    initialiser_options: Dict[str, object] = field(default_factory=dict)

    def build_posterior(self, layers, X, Y, num_inducing: int, seed: int, **options):
        """The family's posterior on ``layers``, initialised from the data by its initialiser
        (:mod:`deepgp_gi.initialisation`); ``Y`` in pseudo-target form."""
        return self.initialise(self.posterior_class, layers, X, Y, num_inducing, seed,
                               **self.initialiser_options, **options)


_GI = ("precision", "kl", "last_layer", "residual_mean", "rho", "space")

#: Deep-GP families (``build_deep_gp(posterior=...)``, ``DeepGP(gp_layers, ..., posterior=...)``).
DEEP_GP_FAMILIES: Dict[str, Family] = {
    f.name: f
    for f in (
        Family("mean_field", MeanFieldPosterior, init.from_layers, ("whiten", "q_sqrt_scales"),
               "kmeans", "DSVI mean-field (Salimbeni & Deisenroth 2017)"),
        Family("fully_coupled", FullyCoupledPosterior, init.from_layers,
               ("whiten", "inner_scale", "precondition_offdiagonal"), "kmeans",
               "fully-coupled Gaussian over all layers (Lindinger et al. 2020)",
               eval_row_samples=8192),
        Family("stripes_arrow", StripesArrowPosterior, init.from_layers,
               ("whiten", "inner_scale", "stripes", "arrow", "precondition_offdiagonal", "offdiagonal_step"),
               "kmeans",
               "stripes-and-arrow coupled Gaussian (Lindinger et al. 2020)"),
        Family("global", GlobalInducingPosterior, init.global_inducing,
               _GI + ("log_precision_hidden", "log_precision_output"), None,
               "global inducing points (Ober & Aitchison 2021)", positive_transform="exp"),
        Family("local", LocalInducingPosterior, init.local_inducing,
               ("precision", "kl", "residual_mean", "rho", "log_precision"),
               "normal", "local inducing with pseudo-data (Ober & Aitchison 2021)", positive_transform="exp"),
        Family("sghmc", SGHMCPosterior, init.sghmc_chain, ("step_size", "momentum_decay", "window_size"), "kmeans",
               "SGHMC samples of the inducing outputs (Havasi et al. 2018)", positive_transform="exp"),
        Family("bsgp", BSGPPosterior, init.sghmc_chain,
               ("step_size", "momentum_decay", "window_size", "inducing_prior", "log_lengthscale_prior",
                "log_variance_prior"), "kmeans",
               "BSGP: SGHMC samples of the inducing outputs, inducing inputs and kernel hyperparameters "
               "(Rossi et al. 2021)", positive_transform="exp"),
    )
}

_FFG_U = ("lambda_init", "lambda_max", "sd_init", "sd_max", "d_init", "jitter")
_ENSEMBLE_U = ("num_members", "lambda_init", "lambda_max", "d_init", "jitter", "member_spread", "prior_regulariser")
_ENSEMBLE_W = ("num_members", "prior_regulariser")

#: The inducing-weight families (Ritter et al. 2021) and their weight-space baseline: the same
#: entries in the dense and the convolutional BNN tables (they put matrix-normal inducing weights
#: on every weighted layer, dense or convolutional).
_INDUCING_WEIGHT_FAMILIES = (
    Family("ffg_u", FFGInducingPosterior, init.inducing_weights, _FFG_U, None,
           "inducing weights, factorised Gaussian q(U) (FFG-U, Ritter et al. 2021)"),
    Family("ensemble_u", EnsembleInducingPosterior, init.inducing_weights, _ENSEMBLE_U, None,
           "inducing weights, ensemble of point masses q(U) (Ensemble-U)"),
    Family("ensemble_w", EnsembleWeightPosterior, init.ensemble_weights, _ENSEMBLE_W, None,
           "ensemble of point-mass weights (Ensemble-W)"),
)

#: BNN families (``build_bnn(posterior=...)``, ``DeepGP(dense_layers, ..., posterior=...)``).
BNN_FAMILIES: Dict[str, Family] = {
    f.name: f
    for f in (
        Family("factorised", FactorisedWeightPosterior, init.factorised_weights, ("local_reparameterisation",), None,
               "factorised Gaussian weights (fac)"),
        Family("local", LocalInducingPosterior, init.local_inducing, ("precision", "kl", "rho", "log_precision"),
               "features", "local inducing features (li)"),
        Family("global", GlobalInducingPosterior, init.global_weights, ("precision", "kl", "last_layer", "rho", "space"),
               None, "global inducing points (gi)"),
        Family("factorised_global", FactorisedGlobalPosterior, init.factorised_below_global,
               ("precision", "kl", "last_layer", "rho"), None,
               "factorised lower layers, global-inducing last layer (fac->gi)"),
        Family("random_global", RandomGlobalPosterior, init.factorised_below_global,
               ("precision", "kl", "last_layer", "rho"), None,
               "prior lower layers, global-inducing last layer (rand->gi)"),
    ) + _INDUCING_WEIGHT_FAMILIES
}

_CONV = ("log_precision_init", "dense_precision", "kl", "rho")

#: Convolutional BNN families (``build_conv_bnn(posterior=...)``): one :class:`ConvNetPosterior`
#: whose weighted layers are all factorised, local or global, or factorised below a global last
#: layer; and the inducing-weight families of the BNN table on the network's weighted layers
#: (a filter is the ``[C_out, k k C_in + 1]`` matrix).
CONV_BNN_FAMILIES: Dict[str, Family] = {
    f.name: f
    for f in (
        Family("factorised", ConvNetPosterior, init.convolutional_network, _CONV, None,
               "factorised Gaussian weights in every layer", initialiser_options={"network_family": "factorised"}),
        Family("local", ConvNetPosterior, init.convolutional_network, _CONV, "images",
               "local inducing images and features in every layer",
               initialiser_options={"network_family": "local"}),
        Family("global", ConvNetPosterior, init.convolutional_network, _CONV, None,
               "global inducing images, propagated through every layer (gi)",
               initialiser_options={"network_family": "global"}),
        Family("factorised_global", ConvNetPosterior, init.convolutional_network, _CONV, None,
               "factorised lower layers, global-inducing last layer (fac->gi)",
               initialiser_options={"network_family": "factorised_global"}),
    ) + _INDUCING_WEIGHT_FAMILIES
}


def _table_for(layers) -> Tuple[str, Dict[str, Family]]:
    from .posteriors.weight_space import has_feature_map

    if layers and all(has_feature_map(layer) for layer in layers):
        return "BNN", BNN_FAMILIES
    return "deep GP", DEEP_GP_FAMILIES


def posterior_class(name: str, layers) -> type:
    """The posterior class that ``DeepGP(layers, ..., posterior=name)`` builds for these layers."""
    kind, table = _table_for(layers)
    if not isinstance(name, str) or name not in table:
        raise ValueError(f"unknown posterior {name!r} for {kind} layers; choose one of {', '.join(map(repr, table))}")
    return table[name].posterior_class


def check_options(family: Family, options: dict) -> None:
    """Refuse options the family does not take, naming the ones it accepts."""
    unknown = sorted(set(options) - set(family.options))
    if unknown:
        accepted = ", ".join(family.options) if family.options else "none"
        raise ValueError(
            f"posterior {family.name!r} does not accept option(s) {', '.join(unknown)}; accepted options: {accepted}"
        )
