"""How every builder initialises a posterior from data: deep GPs, dense BNNs and conv BNNs.

The family tables (:mod:`deepgp_gi.families`) name one initialiser per family from this module;
:func:`~deepgp_gi.build_deep_gp`, :func:`~deepgp_gi.build_bnn` and
:func:`~deepgp_gi.build_conv_bnn` call it through :meth:`Family.build_posterior
<deepgp_gi.families.Family.build_posterior>`. Every initialiser has the signature
``initialise(posterior_class, layers, X, Y, num_inducing, seed, **options)``: ``X`` is ``[N, D]``
(or ``[N, H, W, C]`` images), ``Y`` the targets already in pseudo-target form
(:func:`pseudo_targets`), ``seed`` an int that seeds one NumPy generator.

One policy decides the global inducing rows of every model kind (:func:`global_inducing_rows`):

* ``M <= N``: ``U_0`` is the first ``M`` rows of a seeded permutation of ``X`` and the last
  layer's pseudo-outputs are the matching rows of the pseudo-targets (O&A 2021, App. O);
* ``M > N``: the data cannot supply ``M`` distinct rows, so every inducing row and every
  pseudo-output is drawn ``N(0, 1)`` (O&A's toy regression: 100 inducing points for 40 data
  points; on standardised data ``N(0, 1)`` covers the data's range).

Hidden layers' pseudo-outputs are ``N(0, 1)`` (same generator); the hidden layers start with a
small precision (log -4: the prior dominates) and the last layer with log-precision 0.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple, Union

import gpflow
import numpy as np

from .priors import PRIORS, WeightPrior
from .validation import check_choice, check_finite_array, check_float, check_positive_int

__all__ = [
    "pseudo_targets",
    "global_inducing_rows",
    "weight_prior_factory",
    "from_layers",
    "global_inducing",
    "local_inducing",
    "factorised_weights",
    "inducing_weights",
    "ensemble_weights",
    "global_weights",
    "factorised_below_global",
    "convolutional_network",
    "global_inducing_from_data",
    "local_inducing_from_data",
    "sghmc_chain",
]

_CLASSIFICATION = (gpflow.likelihoods.Softmax, gpflow.likelihoods.MultiClass)

#: Initial log-precisions of the pseudo-data: hidden layers (prior-dominated) and the last layer.
LOG_PRECISION_HIDDEN = -4.0
LOG_PRECISION_OUTPUT = 0.0


def pseudo_targets(Y: np.ndarray, likelihood, output_dim: int) -> np.ndarray:
    """The targets as the last layer's pseudo-outputs ``[N, output_dim]``: one-hot rows for class
    labels ``[N, 1]`` under a Softmax or MultiClass likelihood with ``output_dim > 1``, the
    targets themselves otherwise."""
    Y = np.asarray(Y, dtype=np.float64)
    if isinstance(likelihood, _CLASSIFICATION) and Y.shape[1] == 1 and output_dim > 1:
        labels = Y[:, 0]
        if np.any(labels < 0) or np.any(labels >= output_dim) or np.any(labels != np.round(labels)):
            raise ValueError(f"Y must hold integer class labels 0..{output_dim - 1}")
        return np.eye(output_dim)[labels.astype(int)]
    return Y


def global_inducing_rows(X: np.ndarray, targets: np.ndarray, num_inducing: int,
                         rng: np.random.Generator) -> Tuple[np.ndarray, np.ndarray]:
    """``(U_0 [M, ...], V_L [M, P])``: the policy in the module docs (a seeded subset of the data
    rows when ``M <= N``, ``N(0, 1)`` draws when ``M > N``)."""
    M = check_positive_int(num_inducing, "num_inducing")
    N = X.shape[0]
    if M <= N:
        idx = rng.permutation(N)[:M]
        return X[idx], targets[idx]
    return rng.standard_normal((M,) + X.shape[1:]), rng.standard_normal((M, targets.shape[1]))


def weight_prior_factory(prior: Union[str, WeightPrior]) -> Callable[[], WeightPrior]:
    """A function that makes one fresh prior per layer: from a name in
    :data:`~deepgp_gi.priors.PRIORS`, or deep copies of a :class:`~deepgp_gi.priors.WeightPrior`."""
    if isinstance(prior, WeightPrior):
        return lambda: gpflow.utilities.deepcopy(prior)
    if isinstance(prior, str):
        return PRIORS[check_choice(prior, "prior", tuple(PRIORS))]
    raise ValueError(f"unknown prior {prior!r}; choose one of {', '.join(map(repr, PRIORS))}")


def _log_precisions(layers: Sequence, hidden: float, output: float) -> list:
    return [hidden] * (len(layers) - 1) + [output]


# --------------------------------------------------------------------------- the initialisers


def from_layers(posterior_class, layers, X, Y, num_inducing, seed, **options):
    """The posterior's own defaults from the layers alone (mean-field, fully-coupled, STAR: the
    inducing inputs are on the layers already)."""
    return posterior_class(layers, **options)


def sghmc_chain(posterior_class, layers, X, Y, num_inducing, seed, **options):
    """SGHMC (Havasi et al. 2018): the chain starts where the reference code starts it, every
    layer's whitened inducing outputs ``V_l = 0`` with zero momenta and adaptation statistics 1;
    the inducing inputs are the layers' (k-means, as mean-field). ``X``, ``Y``, ``num_inducing``
    and ``seed`` are not used (the chain's draws are seeded by ``fit`` and ``collect_samples``)."""
    return posterior_class(layers, **options)


def global_inducing(posterior_class, layers, X, Y, num_inducing, seed, *,
                    log_precision_hidden: float = LOG_PRECISION_HIDDEN,
                    log_precision_output: float = LOG_PRECISION_OUTPUT, **options):
    """Global inducing on GP layers (O&A 2021, App. O): :func:`global_inducing_rows`, hidden
    pseudo-outputs ``N(0, 1)``, uniform log-precisions per layer."""
    layers = list(layers)
    if not layers:
        raise ValueError("layers must contain at least one layer (depth >= 1)")
    Xa = check_finite_array(X, "X", ndim=2)
    Ya = check_finite_array(Y, "Y", ndim=2)
    if Xa.shape[1] != layers[0].input_dim:
        raise ValueError(f"X must have shape [N, {layers[0].input_dim}], got {list(Xa.shape)}")
    P = layers[-1].output_dim
    if Ya.shape[1] != P or Ya.shape[0] != Xa.shape[0]:
        raise ValueError(
            f"Y must have shape [{Xa.shape[0]}, {P}] (one column per output of the last layer) to "
            f"initialise the last pseudo-outputs, got {list(Ya.shape)}"
        )
    M = check_positive_int(num_inducing, "num_inducing")
    lp_hidden = check_float(log_precision_hidden, "log_precision_hidden")
    lp_out = check_float(log_precision_output, "log_precision_output")
    rng = np.random.default_rng(seed)
    U0, V_top = global_inducing_rows(Xa, Ya, M, rng)
    V = [rng.standard_normal((M, layer.output_dim)) for layer in layers[:-1]] + [V_top]
    return posterior_class(layers, M, inducing_inputs=U0, pseudo_outputs=V,
                           log_precision_init=_log_precisions(layers, lp_hidden, lp_out), **options)


def local_inducing(posterior_class, layers, X, Y, num_inducing, seed, *, log_precision: Optional[float] = None,
                   **options):
    """Local inducing (O&A 2021, App. O): the inducing inputs are on the layers (the builders draw
    them ``N(0, 1)``); pseudo-outputs ``N(0, 1)`` and a uniform log-precision (default 0 for GP
    layers, -4 for DenseLayers). ``X``, ``Y`` and ``num_inducing`` are not used."""
    return posterior_class(layers, log_precision_init=log_precision, seed=seed, **options)


def factorised_weights(posterior_class, layers, X, Y, num_inducing, seed, **options):
    """Factorised Gaussian weights (means ``N(0, 1/fan_in)``, variances ``1e-3/fan_in``), and
    ensembles of point-mass weights: the posterior draws them from ``seed``."""
    return posterior_class(layers, seed=seed, **options)


ensemble_weights = factorised_weights


def inducing_weights(posterior_class, layers, X, Y, num_inducing, seed, **options):
    """Inducing weights (Ritter et al. 2021): ``num_inducing`` is the size of each layer's
    inducing weight matrix; the posterior draws its values from ``seed``."""
    return posterior_class(layers, num_inducing=num_inducing, seed=seed, **options)


def global_weights(posterior_class, layers, X, Y, num_inducing, seed, **options):
    """Global inducing on DenseLayers (a BNN): :func:`global_inducing_rows`, hidden
    pseudo-outputs ``N(0, 1)``, the posterior's default precisions."""
    rng = np.random.default_rng(seed)
    U0, V_top = global_inducing_rows(np.asarray(X), np.asarray(Y), num_inducing, rng)
    V = [rng.standard_normal((num_inducing, layer.output_dim)) for layer in layers[:-1]] + [V_top]
    return posterior_class(layers, inducing_inputs=U0, pseudo_outputs=V, seed=seed, **options)


def factorised_below_global(posterior_class, layers, X, Y, num_inducing, seed, **options):
    """fac->gi and rand->gi: factorised (or prior) lower layers and a global-inducing last layer
    from :func:`global_inducing_rows`, log-precision 0."""
    rng = np.random.default_rng(seed)
    U0, V_top = global_inducing_rows(np.asarray(X), np.asarray(Y), num_inducing, rng)
    return posterior_class(layers, U0, V_top, log_precision_init=0.0, seed=seed, **options)


def convolutional_network(posterior_class, layers, X, Y, num_inducing, seed, *, network_family: str, **options):
    """A convolutional network's posterior of family ``network_family`` (``"factorised"``,
    ``"local"``, ``"global"`` or ``"factorised_global"``; O&A 2021, App. O): global rows by
    :func:`global_inducing_rows` (their pseudo-outputs the one-hot labels) for the global
    families, ``N(0, 1)`` local inducing images and features on the layers for ``"local"``
    (:func:`local_inducing_images`)."""
    from .layers import weighted_layers

    rng = np.random.default_rng(seed)
    U0 = pseudo = None
    if network_family in ("global", "factorised_global"):
        U0, V_top = global_inducing_rows(np.asarray(X), np.asarray(Y), num_inducing, rng)
        pseudo = [None] * (len(weighted_layers(layers)) - 1) + [V_top]
    elif network_family == "local":
        local_inducing_images(layers, rng)
    return posterior_class(layers, network_family, U0, pseudo_outputs=pseudo, seed=int(rng.integers(2**31 - 1)),
                           **options)


def local_inducing_images(layers, rng: np.random.Generator) -> None:
    """Put ``N(0, 1)`` local inducing inputs on a convolutional network's weighted layers: a
    convolution gets ``ceil(D / (H' W'))`` images (the fewest whose patch rows can pin down its
    ``D`` weights), a dense layer ``D`` feature rows."""
    from .layers import Conv2DLayer, weighted_layers

    dtype = gpflow.default_float()
    for layer in weighted_layers(layers):
        if isinstance(layer, Conv2DLayer):
            H, W = layer.output_shape[:2]
            M = -(-layer.fan_in // (H * W))
            layer.inducing_images = gpflow.Parameter(rng.standard_normal((M,) + layer.input_shape).astype(dtype),
                                                     name="inducing_images")
        else:
            layer.inducing_features = gpflow.Parameter(rng.standard_normal((layer.fan_in, layer.fan_in)).astype(dtype),
                                                       name="inducing_features")


# --------------------------------------------------------------------------- direct use


def global_inducing_from_data(layers: Sequence, X, Y, num_inducing: int, *, seed: Optional[int] = None,
                              log_precision_hidden: float = LOG_PRECISION_HIDDEN,
                              log_precision_output: float = LOG_PRECISION_OUTPUT, **options):
    """A :class:`~deepgp_gi.posteriors.GlobalInducingPosterior` on GP layers initialised from data
    (:func:`global_inducing`; ``Y [N, P]`` with ``P = layers[-1].output_dim`` may already be
    pseudo-targets, e.g. one-hot labels)."""
    from .posteriors import GlobalInducingPosterior

    return global_inducing(GlobalInducingPosterior, layers, X, Y, num_inducing, seed,
                           log_precision_hidden=log_precision_hidden, log_precision_output=log_precision_output,
                           **options)


def local_inducing_from_data(layers: Sequence, X=None, Y=None, *, seed: Optional[int] = None,
                             log_precision: Optional[float] = None, **options):
    """A :class:`~deepgp_gi.posteriors.LocalInducingPosterior` (:func:`local_inducing`)."""
    from .posteriors import LocalInducingPosterior

    return local_inducing(LocalInducingPosterior, layers, X, Y, None, seed, log_precision=log_precision, **options)
