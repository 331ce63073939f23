"""``build_bnn``: a BNN as a deep GP, with the papers' defaults and initialisations.

Usage in README.md ("Ten lines"); the initial values in docs/algorithms.md, "Posterior families".
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import gpflow
import numpy as np

from .families import check_options
from .initialisation import pseudo_targets, weight_prior_factory
from .kernels import ACTIVATIONS
from .layers import DenseLayer
from .models import DeepGP
from .posteriors.registry import BNN_FAMILIES, family_class
from .priors import WeightPrior
from .validation import as_data_array, check_data_pair, check_positive_int, check_seed

__all__ = ["build_bnn", "BNN_POSTERIORS", "DEFAULT_BNN_NOISE_VARIANCE"]

#: Names accepted by ``build_bnn(posterior=...)`` (the keys of the BNN family table).
BNN_POSTERIORS = tuple(BNN_FAMILIES)

#: Initial Gaussian noise variance when ``likelihood`` is None: exp(-3) (O&A UCI BNN setting).
DEFAULT_BNN_NOISE_VARIANCE = float(np.exp(-3.0))


def _check_hidden(hidden) -> tuple:
    if isinstance(hidden, (int, np.integer)) and not isinstance(hidden, bool):
        hidden = (hidden,)
    if not isinstance(hidden, (tuple, list)):
        raise TypeError(
            f"hidden must be a tuple of layer widths, got {type(hidden).__name__} {hidden!r}"
        )
    out = []
    for i, h in enumerate(hidden):
        if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 1:
            raise ValueError(f"hidden widths must be positive integers; hidden[{i}] is {h!r}")
        out.append(int(h))
    return tuple(out)


def build_bnn(
    X,
    Y,
    *,
    hidden: Sequence[int] = (50, 50),
    posterior: str = "global",
    prior: Union[str, WeightPrior] = "neal",
    num_inducing: int = 100,
    activation: Union[str, Callable] = "relu",
    likelihood: Optional[gpflow.likelihoods.Likelihood] = None,
    seed: Optional[int] = None,
    **posterior_options,
) -> DeepGP:
    """A fully-connected BNN as a :class:`~deepgp_gi.DeepGP`, initialised as in O&A (2021).

    :param X: training inputs ``[N, D]`` (used for shapes and the inducing initialisation).
    :param Y: training targets ``[N, P]`` (class labels ``[N, 1]`` for Softmax/MultiClass).
    :param hidden: hidden-layer widths, e.g. ``(50, 50)``; ``()`` gives Bayesian linear regression.
    :param posterior: a name in :data:`~deepgp_gi.families.BNN_FAMILIES`: ``"factorised"`` (fac,
        local reparameterisation), ``"local"`` (li, ``fan_in`` inducing features per layer;
        ``num_inducing`` is not used), ``"global"`` (gi), ``"factorised_global"`` (fac->gi),
        ``"random_global"`` (rand->gi), ``"ffg_u"`` / ``"ensemble_u"`` (inducing weights, Ritter et
        al. 2021; ``num_inducing`` is M of the M x M inducing weights), ``"ensemble_w"`` (an
        ensemble of point-mass weights).
    :param prior: ``"standard"`` (N(0,1)), ``"neal"`` (N(0, 1/fan_in)), ``"scale"`` (learned
        Gamma scale), ``"spatial_iw"`` (the spatial inverse-Wishart prior, ``p = 1`` on dense
        layers: precision ``fan_in * L``, ``L ~ InvGamma(1, 1)``, learned ``q(L)``), or
        a :class:`~deepgp_gi.priors.WeightPrior` instance used as a template (each layer gets its
        own deep copy).
    :param num_inducing: M, the number of global inducing points (gi, fac->gi, rand->gi), or the
        size of the inducing weights (ffg_u, ensemble_u: ``min(M, d_out) x min(M, d_in)`` per
        layer).
    :param activation: hidden nonlinearity, a name in :data:`deepgp_gi.kernels.ACTIVATIONS` or a
        callable.
    :param likelihood: a GPflow likelihood; default Gaussian with variance ``exp(-3)``.
    :param seed: seeds every random initial value (the shuffle choosing ``U_0``, random
        pseudo-outputs, inducing features and factorised means).
    :param posterior_options: options of the family (e.g. ``precision="shared_diagonal"``,
        ``kl="analytic"``); anything the family does not accept raises a ``ValueError`` naming
        the accepted ones.

    Initialisation (docs/algorithms.md, "Posterior families"): ``U_0`` = the first ``M`` inputs
    of a seeded shuffle and
    the top pseudo-outputs their targets (one-hot labels for classification); if ``M > N``,
    ``U_0`` and the top pseudo-outputs are ``N(0, 1)`` (the toy set-up). Hidden pseudo-outputs
    ``N(0, 1)``; log-precisions -4 for hidden layers and 0 for the output (gi, fac->gi), -4 for
    every li layer, with inducing features ``N(0, 1)``; factorised means ``N(0, 1/fan_in)`` and
    variances ``1e-3/fan_in``; a random-scale prior's ``q(s)`` with ``alpha = beta = 6``; a spatial
    inverse-Wishart prior's ``q(L)`` with ``y ~ N(0, 1)`` and ``omega = -5``.
    """
    family = family_class(posterior, "bnn")
    check_options(posterior, family, posterior_options)
    prior_factory = weight_prior_factory(prior)
    if not callable(activation) and activation not in ACTIVATIONS:
        raise ValueError(
            f"unknown activation {activation!r}; choose one of {', '.join(map(repr, ACTIVATIONS))} "
            "or pass a callable"
        )
    hidden = _check_hidden(hidden)
    num_inducing = check_positive_int(num_inducing, "num_inducing")
    seed = check_seed(seed)
    if likelihood is None:
        likelihood = gpflow.likelihoods.Gaussian(variance=DEFAULT_BNN_NOISE_VARIANCE)
    if not isinstance(likelihood, gpflow.likelihoods.Likelihood):
        raise TypeError(
            f"likelihood must be a gpflow.likelihoods.Likelihood, got {type(likelihood).__name__}"
        )

    dtype = gpflow.default_float()
    Xt = as_data_array(X, "X", dtype)
    Yt = as_data_array(Y, "Y", dtype)
    check_data_pair(Xt, Yt, "X", "Y")
    Xn, Yn = Xt.numpy().astype(np.float64), Yt.numpy().astype(np.float64)
    N, D0 = Xn.shape
    latent = getattr(likelihood, "latent_dim", None)
    output_dim = int(latent) if latent is not None else Yn.shape[1]
    targets = pseudo_targets(Yn, likelihood, output_dim)
    if targets.shape[1] != output_dim:
        raise ValueError(
            f"Y has {Yn.shape[1]} columns but the likelihood expects {output_dim} latent functions"
        )

    rng = np.random.default_rng(seed)
    widths = (D0,) + hidden + (output_dim,)
    layers = []
    for l in range(len(widths) - 1):
        fan_in = widths[l] + 1
        features = family.initial_inducing_features(fan_in, rng)
        layers.append(
            DenseLayer(
                widths[l],
                widths[l + 1],
                activation="identity" if l == 0 else activation,
                prior=prior_factory(),
                bias=True,
                inducing_features=features,
                name=f"dense_{l}",
            )
        )
    post_seed = int(rng.integers(2**31 - 1))
    post = family.from_data(
        layers, Xn, targets, num_inducing=num_inducing, seed=post_seed, **posterior_options
    )
    return DeepGP(layers, likelihood, posterior=post, num_data=N)
