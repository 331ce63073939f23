"""``build_bnn``: a BNN as a deep GP, with the papers' defaults and initialisations.

See API.md ("Building models") and ALGORITHMS.md §2.4 ("Initialisation").
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

import gpflow
import numpy as np

from .dense import ACTIVATIONS, DenseLayer
from .models import DeepGP
from .posteriors.weights import (
    FactorisedGlobalPosterior,
    FactorisedWeightPosterior,
    GlobalInducingWeightPosterior,
    LocalInducingWeightPosterior,
    RandomGlobalPosterior,
)
from .priors import PRIORS, WeightPrior
from .validation import as_data_array, check_data_pair, check_positive_int

__all__ = ["build_bnn", "BNN_POSTERIORS", "DEFAULT_BNN_NOISE_VARIANCE"]

#: Names accepted by ``build_bnn(posterior=...)``: fac, li, gi, fac->gi, rand->gi.
BNN_POSTERIORS = ("factorised", "local", "global", "factorised_global", "random_global")

#: Initial Gaussian noise variance when ``likelihood`` is None: exp(-3) (O&A UCI BNN setting).
DEFAULT_BNN_NOISE_VARIANCE = float(np.exp(-3.0))

_CLASSIFICATION = (gpflow.likelihoods.Softmax, gpflow.likelihoods.MultiClass)


def _check_hidden(hidden) -> tuple:
    if isinstance(hidden, (int, np.integer)) and not isinstance(hidden, bool):
        hidden = (hidden,)
    if not isinstance(hidden, (tuple, list)):
        raise TypeError(f"hidden must be a tuple of layer widths, got {type(hidden).__name__} {hidden!r}")
    out = []
    for i, h in enumerate(hidden):
        if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 1:
            raise ValueError(f"hidden widths must be positive integers; hidden[{i}] is {h!r}")
        out.append(int(h))
    return tuple(out)


def _pseudo_targets(Y: np.ndarray, likelihood, output_dim: int) -> np.ndarray:
    """Initial top-layer pseudo-outputs from targets: the targets, or one-hot class labels."""
    if isinstance(likelihood, _CLASSIFICATION) and Y.shape[1] == 1 and output_dim > 1:
        labels = Y[:, 0].astype(int)
        return np.eye(output_dim)[labels]
    return np.asarray(Y, dtype=np.float64)


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
) -> DeepGP:
    """A fully-connected BNN as a :class:`~deepgp_gi.DeepGP`, initialised as in O&A (2021).

    :param X: training inputs ``[N, D]`` (used for shapes and the inducing initialisation).
    :param Y: training targets ``[N, P]`` (class labels ``[N, 1]`` for Softmax/MultiClass).
    :param hidden: hidden-layer widths, e.g. ``(50, 50)``; ``()`` gives Bayesian linear regression.
    :param posterior: one of ``"factorised"`` (fac, local reparameterisation), ``"local"``
        (li, ``fan_in + 1`` inducing features per layer; ``num_inducing`` is not used),
        ``"global"`` (gi), ``"factorised_global"`` (fac->gi), ``"random_global"`` (rand->gi).
    :param prior: ``"standard"`` (N(0,1)), ``"neal"`` (N(0, 1/fan_in)), ``"scale"`` (learned
        Gamma scale), or a :class:`~deepgp_gi.priors.WeightPrior` instance used as a template
        (each layer gets its own deep copy, so layers do not share a learned scale).
    :param num_inducing: M, the number of global inducing points (gi, fac->gi, rand->gi).
    :param activation: hidden nonlinearity, a name in :data:`deepgp_gi.dense.ACTIVATIONS` or a
        callable.
    :param likelihood: a GPflow likelihood; default Gaussian with variance ``exp(-3)``.
    :param seed: seeds every random initial value (the shuffle choosing ``U_0``, random
        pseudo-outputs, inducing features and factorised means).

    Initialisation (ALGORITHMS.md §2.4): ``U_0`` = the first ``M`` inputs of a seeded shuffle and
    the top pseudo-outputs their targets (one-hot labels for classification); if ``M > N``,
    ``U_0`` and the top pseudo-outputs are ``N(0, 1)`` (the toy set-up). Hidden pseudo-outputs
    ``N(0, 1)``; log-precisions -4 for hidden layers and 0 for the output (gi, fac->gi), -4 for
    every li layer, with inducing features ``N(0, 1)``; factorised means ``N(0, 1/fan_in)`` and
    variances ``1e-3/fan_in``; ScalePrior ``q(s)`` with ``alpha = beta = 6``.
    """
    if posterior not in BNN_POSTERIORS:
        raise ValueError(f"unknown posterior {posterior!r}; choose one of {', '.join(map(repr, BNN_POSTERIORS))}")
    if isinstance(prior, str):
        if prior not in PRIORS:
            raise ValueError(f"unknown prior {prior!r}; choose one of {', '.join(map(repr, PRIORS))}")
        prior_factory = PRIORS[prior]
    elif isinstance(prior, WeightPrior):
        template = prior
        prior_factory = lambda: gpflow.utilities.deepcopy(template)  # noqa: E731
    else:
        raise ValueError(f"unknown prior {prior!r}; choose one of {', '.join(map(repr, PRIORS))}")
    if not callable(activation) and activation not in ACTIVATIONS:
        raise ValueError(
            f"unknown activation {activation!r}; choose one of {', '.join(map(repr, ACTIVATIONS))} or pass a callable"
        )
    hidden = _check_hidden(hidden)
    num_inducing = check_positive_int(num_inducing, "num_inducing")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer))):
        raise TypeError(f"seed must be an integer or None, got {type(seed).__name__} {seed!r}")
    if likelihood is None:
        likelihood = gpflow.likelihoods.Gaussian(variance=DEFAULT_BNN_NOISE_VARIANCE)
    if not isinstance(likelihood, gpflow.likelihoods.Likelihood):
        raise TypeError(f"likelihood must be a gpflow.likelihoods.Likelihood, got {type(likelihood).__name__}")

    dtype = gpflow.default_float()
    Xt = as_data_array(X, "X", dtype)
    Yt = as_data_array(Y, "Y", dtype)
    check_data_pair(Xt, Yt, "X", "Y")
    Xn, Yn = Xt.numpy().astype(np.float64), Yt.numpy().astype(np.float64)
    N, D0 = Xn.shape
    latent = getattr(likelihood, "latent_dim", None)
    output_dim = int(latent) if latent is not None else Yn.shape[1]
    if Yn.shape[1] < 1:
        raise ValueError("Y has 0 columns")

    rng = np.random.default_rng(seed)
    widths = (D0,) + hidden + (output_dim,)
    depth = len(widths) - 1
    layers = []
    for l in range(depth):
        fan_in = widths[l] + 1
        Z = rng.standard_normal((fan_in, fan_in)) if posterior == "local" else None
        layers.append(
            DenseLayer(
                widths[l],
                widths[l + 1],
                activation="identity" if l == 0 else activation,
                prior=prior_factory(),
                bias=True,
                inducing_features=Z,
                name=f"dense_{l}",
            )
        )

    post_seed = int(rng.integers(2**31 - 1))
    if posterior == "factorised":
        post = FactorisedWeightPosterior(layers, seed=post_seed)
    elif posterior == "local":
        post = LocalInducingWeightPosterior(layers, log_precisions=[-4.0] * depth, seed=post_seed)
    else:
        M = num_inducing
        if M <= N:
            idx = rng.permutation(N)[:M]
            U0 = Xn[idx]
            V_top = _pseudo_targets(Yn[idx], likelihood, output_dim)
        else:
            U0 = rng.standard_normal((M, D0))
            V_top = rng.standard_normal((M, output_dim))
        if V_top.shape != (M, output_dim):
            raise ValueError(
                f"Y has {Yn.shape[1]} columns but the likelihood expects {output_dim} latent functions"
            )
        if posterior == "global":
            V = [rng.standard_normal((M, w)) for w in widths[1:-1]] + [V_top]
            post = GlobalInducingWeightPosterior(
                layers, U0, pseudo_outputs=V, log_precisions=[-4.0] * (depth - 1) + [0.0], seed=post_seed
            )
        elif posterior == "factorised_global":
            post = FactorisedGlobalPosterior(layers, U0, V_top, log_precision=0.0, seed=post_seed)
        else:
            post = RandomGlobalPosterior(layers, U0, V_top, log_precision=0.0, seed=post_seed)
    return DeepGP(layers, likelihood, posterior=post, num_data=N)
