"""The family tables: one per model kind, name -> posterior class, initialiser, options.

Every place that lists family names reads these two tables: ``DeepGP(layers, lik,
posterior=name)``, :func:`~deepgp_gi.build_deep_gp`, :func:`~deepgp_gi.build_bnn` and the
``deepgp-gi`` command. A family entry says

* ``posterior_class`` -- the :class:`~deepgp_gi.posteriors.DeepPosterior` it builds (also what
  ``DeepGP(..., posterior=name)`` constructs from the layers alone, with default values);
* ``layer_inducing`` -- what the layers carry for it: ``None`` (nothing), ``"kmeans"`` (k-means
  inducing inputs on every GP layer, DSVI), ``"normal"`` (``N(0, 1)`` inducing inputs, O&A's
  local inducing) or ``"features"`` (``N(0, 1)`` inducing features on every DenseLayer);
* ``initialise(layers, X, Y, num_inducing, seed, **options)`` -- the papers' initialisation of the
  variational parameters;
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
  kin8nm (mean-field: 17 KB, STAR: 66 KB), so its budget is smaller.

The global-inducing class is one for deep GPs and BNNs: on DenseLayers it takes the weight-space
path, so ``DeepGP(dense_layers, lik, posterior="global")`` and ``build_bnn(..., posterior="global")``
run the same code.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import numpy as np

from .posteriors import (
    FactorisedGlobalPosterior,
    FactorisedWeightPosterior,
    FullyCoupledPosterior,
    GlobalInducingPosterior,
    LocalInducingPosterior,
    MeanFieldPosterior,
    RandomGlobalPosterior,
    StripesArrowPosterior,
)
from .posteriors.inducing import global_inducing_from_data, local_inducing_from_data
from .posteriors.inducing_weights import EnsembleInducingPosterior, EnsembleWeightPosterior, FFGInducingPosterior

__all__ = ["Family", "DEEP_GP_FAMILIES", "BNN_FAMILIES", "posterior_class", "check_options"]


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


def _from_layers(cls):
    def initialise(layers, X, Y, num_inducing, seed, **options):
        return cls(layers, **options)

    return initialise


def _global_gp(layers, X, Y, num_inducing, seed, **options):
    return global_inducing_from_data(layers, X, Y, num_inducing, seed=seed, **options)


def _local(layers, X, Y, num_inducing, seed, **options):
    return local_inducing_from_data(layers, X, Y, seed=seed, **options)


def _global_inducing_rows(X, Y, num_inducing, rng):
    """``U_0`` and the top pseudo-outputs: a seeded shuffle of the data (targets already in
    pseudo-target form), or ``N(0, 1)`` draws when ``M > N`` (the toy set-up)."""
    N = X.shape[0]
    if num_inducing <= N:
        idx = rng.permutation(N)[:num_inducing]
        return X[idx], Y[idx]
    return rng.standard_normal((num_inducing, X.shape[1])), rng.standard_normal((num_inducing, Y.shape[1]))


def _factorised_bnn(layers, X, Y, num_inducing, seed, **options):
    return FactorisedWeightPosterior(layers, seed=seed, **options)


def _inducing_weights(cls):
    def initialise(layers, X, Y, num_inducing, seed, **options):
        return cls(layers, num_inducing=num_inducing, seed=seed, **options)

    return initialise


def _ensemble_w(layers, X, Y, num_inducing, seed, **options):
    return EnsembleWeightPosterior(layers, seed=seed, **options)


def _global_bnn(layers, X, Y, num_inducing, seed, **options):
    rng = np.random.default_rng(seed)
    U0, V_top = _global_inducing_rows(X, Y, num_inducing, rng)
    V = [rng.standard_normal((num_inducing, layer.output_dim)) for layer in layers[:-1]] + [V_top]
    return GlobalInducingPosterior(layers, inducing_inputs=U0, pseudo_outputs=V, seed=seed, **options)


def _hybrid_bnn(cls):
    def initialise(layers, X, Y, num_inducing, seed, **options):
        rng = np.random.default_rng(seed)
        U0, V_top = _global_inducing_rows(X, Y, num_inducing, rng)
        return cls(layers, U0, V_top, log_precision_init=0.0, seed=seed, **options)

    return initialise


_GI = ("precision", "kl", "last_layer", "residual_mean", "rho", "space")

#: Deep-GP families (``build_deep_gp(posterior=...)``, ``DeepGP(gp_layers, ..., posterior=...)``).
DEEP_GP_FAMILIES: Dict[str, Family] = {
    f.name: f
    for f in (
        Family("mean_field", MeanFieldPosterior, _from_layers(MeanFieldPosterior), ("whiten", "q_sqrt_scales"),
               "kmeans", "DSVI mean-field (Salimbeni & Deisenroth 2017)"),
        Family("fully_coupled", FullyCoupledPosterior, _from_layers(FullyCoupledPosterior),
               ("whiten", "inner_scale", "precondition_offdiagonal"), "kmeans",
               "fully-coupled Gaussian over all layers (Lindinger et al. 2020)",
               eval_row_samples=8192),
        Family("stripes_arrow", StripesArrowPosterior, _from_layers(StripesArrowPosterior),
               ("whiten", "inner_scale", "stripes", "arrow", "precondition_offdiagonal"), "kmeans",
               "stripes-and-arrow coupled Gaussian (Lindinger et al. 2020)"),
        Family("global", GlobalInducingPosterior, _global_gp,
               _GI + ("log_precision_hidden", "log_precision_output"), None,
               "global inducing points (Ober & Aitchison 2021)", positive_transform="exp"),
        Family("local", LocalInducingPosterior, _local, ("precision", "kl", "residual_mean", "rho", "log_precision"),
               "normal", "local inducing with pseudo-data (Ober & Aitchison 2021)", positive_transform="exp"),
    )
}

#: BNN families (``build_bnn(posterior=...)``, ``DeepGP(dense_layers, ..., posterior=...)``).
BNN_FAMILIES: Dict[str, Family] = {
    f.name: f
    for f in (
        Family("factorised", FactorisedWeightPosterior, _factorised_bnn, ("local_reparameterisation",), None,
               "factorised Gaussian weights (fac)"),
        Family("local", LocalInducingPosterior, _local, ("precision", "kl", "rho", "log_precision"), "features",
               "local inducing features (li)"),
        Family("global", GlobalInducingPosterior, _global_bnn, ("precision", "kl", "last_layer", "rho", "space"), None,
               "global inducing points (gi)"),
        Family("factorised_global", FactorisedGlobalPosterior, _hybrid_bnn(FactorisedGlobalPosterior),
               ("precision", "kl", "last_layer", "rho"), None,
               "factorised lower layers, global-inducing last layer (fac->gi)"),
        Family("random_global", RandomGlobalPosterior, _hybrid_bnn(RandomGlobalPosterior),
               ("precision", "kl", "last_layer", "rho"), None,
               "prior lower layers, global-inducing last layer (rand->gi)"),
        Family("ffg_u", FFGInducingPosterior, _inducing_weights(FFGInducingPosterior),
               ("lambda_init", "lambda_max", "sd_init", "sd_max", "d_init", "jitter"), None,
               "inducing weights, factorised Gaussian q(U) (FFG-U, Ritter et al. 2021)"),
        Family("ensemble_u", EnsembleInducingPosterior, _inducing_weights(EnsembleInducingPosterior),
               ("num_members", "lambda_init", "lambda_max", "d_init", "jitter", "member_spread",
                "prior_regulariser"), None, "inducing weights, ensemble of point masses q(U) (Ensemble-U)"),
        Family("ensemble_w", EnsembleWeightPosterior, _ensemble_w, ("num_members", "prior_regulariser"), None,
               "ensemble of point-mass weights (Ensemble-W)"),
    )
}


def _table_for(layers) -> Tuple[str, Dict[str, Family]]:
    from .posteriors.inducing import has_feature_map

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
