"""Builders with the papers' defaults: ``build_deep_gp`` (docs/algorithms.md, sections
"Mean-field deep GPs (DSVI)" to "Global inducing points").

The layers (kernels, mean functions, widths) follow DSVI for every posterior family:
ARD squared-exponential kernels with variance 2 and lengthscales 2 (``kernel_start="dsvi"``;
``"havasi"``: variance 0.01 and lengthscales ``sqrt(D_in)``), between-layer white noise
1e-5 on inner layers, inner width ``min(30, D)``, fixed linear mean functions on inner layers
(identity, PCA projection, or identity with zero padding) and zero mean on the last, a Gaussian
likelihood with variance 0.01. The posterior family changes the variational parameters and how
they are initialised, and the transform of those positive hyperparameters: GPflow's softplus for
the DSVI and Lindinger families, exp (log-parameterised, as bayesfunc's kernels) for O&A's global
and local inducing (the family class's ``positive_transform``; ``positive_transform=`` overrides
it).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import List, Optional

import gpflow
import numpy as np

from .families import check_options
from .initialisation import kmeans_inducing_inputs, pseudo_targets
from .latent import LatentDeepGP, check_latent_family, with_latent_columns
from .layers import GPLayer
from .layers.latent import LatentVariableLayer
from .models import DeepGP
from .posteriors.registry import family_class
from .validation import as_data_array, check_choice, check_data_pair, check_positive_int, check_seed

__all__ = [
    "build_deep_gp",
    "build_layers",
    "linear_mean_maps",
    "kmeans_inducing_inputs",
    "POSITIVE_TRANSFORMS",
    "KERNEL_STARTS",
    "kernel_start_values",
]

#: Transforms of the positive hyperparameters the builders create (GPflow's ``positive_bijector``).
POSITIVE_TRANSFORMS = ("exp", "softplus")

#: Where the kernels' hyperparameters start (``kernel_start``): ``"dsvi"``, the DSVI paper's
#: (variance 2, every lengthscale 2); ``"havasi"``, Havasi et al.'s SGHMC code's (variance 0.01,
#: every lengthscale ``sqrt(D_in)``, the square root of the layer's input width).
KERNEL_STARTS = ("dsvi", "havasi")


def kernel_start_values(kernel_start: str, input_dim: int):
    """The starting ``(variance, lengthscale)`` of a layer's kernel with ``input_dim`` inputs under
    ``kernel_start`` (a name in :data:`KERNEL_STARTS`); every input dimension's ARD lengthscale
    starts at that one value."""
    kernel_start = check_choice(kernel_start, "kernel_start", KERNEL_STARTS)
    if kernel_start == "havasi":
        return 0.01, float(np.sqrt(input_dim))
    return 2.0, 2.0


def positive_transform_context(positive_transform: Optional[str]):
    """A context in which new positive GPflow parameters use ``positive_transform`` (``None``:
    GPflow's current setting). ``"exp"`` stores ``log(value)`` (shifted by GPflow's positive
    minimum), so an Adam step changes the value by a relative amount; ``"softplus"`` stores
    ``softplus^-1(value)``, which for values of a few units or more is nearly the value itself,
    so an Adam step of size ``lr`` changes it by about ``lr`` whatever its size."""
    if positive_transform is None:
        return contextlib.nullcontext()
    check_choice(positive_transform, "positive_transform", POSITIVE_TRANSFORMS)
    return gpflow.config.as_context(
        dataclasses.replace(gpflow.config.config(), positive_bijector=positive_transform)
    )


def linear_mean_maps(X: np.ndarray, widths: List[int]) -> List[np.ndarray]:
    """The fixed linear maps of DSVI's inner mean functions, one ``[N_{l-1}, N_l]`` per inner layer.

    Equal widths: identity. Narrower: the top ``N_l`` right-singular vectors of the running data
    matrix (X pushed through the previous maps). Wider: identity with zero padding.
    """
    maps = []
    F = X
    dims = [X.shape[1]] + list(widths)
    for d_in, d_out in zip(dims[:-1], dims[1:]):
        if d_in == d_out:
            A = np.eye(d_in)
        elif d_out < d_in:
            _, _, Vt = np.linalg.svd(F, full_matrices=False)
            A = Vt[:d_out].T
        else:
            A = np.concatenate([np.eye(d_in), np.zeros((d_in, d_out - d_in))], axis=1)
        maps.append(A)
        F = F @ A
    return maps


def _fixed_linear(A: np.ndarray) -> gpflow.mean_functions.Linear:
    """A hidden layer's fixed mean function ``x -> x A`` (``A [D_in, D_out]``, offset ``b [D_out]``
    zero). Both parameters are created non-trainable: ``gpflow.set_trainable(..., False)`` after
    creation marks only the wrapper of a ``tf.distribute`` variable (whose ``trainable`` still reads
    True), so under a strategy the mean would be listed in ``trainable_variables`` and trained."""
    mean = gpflow.mean_functions.Linear(A=gpflow.Parameter(np.atleast_2d(A), trainable=False))
    mean.b = gpflow.Parameter(
        np.zeros(A.shape[1]), trainable=False
    )  # Linear would wrap a Parameter b again
    return mean


def _layer_kernel(
    input_dim: int, inner: bool, white: float, kernel_start: str
) -> gpflow.kernels.Kernel:
    variance, lengthscale = kernel_start_values(kernel_start, input_dim)
    kernel = gpflow.kernels.SquaredExponential(
        variance=variance, lengthscales=np.full(input_dim, lengthscale)
    )
    if inner and white > 0:
        kernel = kernel + gpflow.kernels.White(variance=white)
    return kernel


def build_layers(
    X: np.ndarray,
    output_dim: int,
    depth: int,
    inner_width: int,
    Z: Optional[np.ndarray],
    white: float = 1e-5,
    positive_transform: Optional[str] = None,
    kernel_start: str = "dsvi",
) -> List[GPLayer]:
    """DSVI-style layers. ``Z`` (``[M, D]`` or None) is pushed through the inner mean maps.

    :param positive_transform: ``"exp"`` or ``"softplus"``: the transform of the kernels'
        variances and lengthscales (``None``: GPflow's current ``positive_bijector``).
    :param kernel_start: where the kernels' variances and lengthscales start, a name in
        :data:`KERNEL_STARTS`.
    """
    kernel_start = check_choice(kernel_start, "kernel_start", KERNEL_STARTS)
    widths = [inner_width] * (depth - 1)
    maps = linear_mean_maps(X, widths)
    layers = []
    dims = [X.shape[1]] + widths + [output_dim]
    Z_l = Z
    for l in range(depth):
        inner = l < depth - 1
        mean = _fixed_linear(maps[l]) if inner else None
        with positive_transform_context(positive_transform):
            kernel = _layer_kernel(dims[l], inner, white, kernel_start)
        layers.append(
            GPLayer(
                kernel,
                output_dim=dims[l + 1],
                input_dim=dims[l],
                mean_function=mean,
                inducing_inputs=Z_l,
                name=f"layer_{l}",
            )
        )
        if Z_l is not None and inner:
            Z_l = Z_l @ maps[l]
    return layers


def build_deep_gp(
    X,
    Y,
    *,
    depth: int,
    posterior: str = "global",
    num_inducing: int = 100,
    likelihood: Optional[gpflow.likelihoods.Likelihood] = None,
    inner_width: Optional[int] = None,
    seed: Optional[int] = None,
    positive_transform: Optional[str] = None,
    latent_dim: Optional[int] = None,
    encoder=None,
    kernel_start: str = "dsvi",
    **posterior_options,
) -> DeepGP:
    """A deep GP with the papers' defaults and initialisation.

    :param X: training inputs ``[N, D]``.
    :param Y: training targets ``[N, P]``.
    :param depth: number of GP layers (1 = a single sparse GP).
    :param posterior: a name in :data:`~deepgp_gi.posteriors.registry.DEEP_GP_FAMILIES`
        (``"mean_field"``, ``"fully_coupled"``, ``"stripes_arrow"``, ``"global"``, ``"local"``).
    :param num_inducing: M, per layer (local families) or at the input (global inducing).
    :param likelihood: a GPflow likelihood; default Gaussian with variance 0.01.
    :param inner_width: width of the inner layers; default ``min(30, D)`` (``min(30, D + D_w)`` with
        ``latent_dim``).
    :param seed: seeds the k-means / inducing-point initialisation.
    :param positive_transform: transform of the positive hyperparameters the builder creates (the
        kernels' variances and lengthscales, the white noise and the default likelihood's
        variance): ``"exp"`` (log-parameterised: an Adam step changes them by a relative amount)
        or ``"softplus"`` (GPflow's default: an Adam step changes a value of a few units or more by
        about the learning rate). Default ``None``: the family's reference code, ``"exp"`` for
        ``"global"`` and ``"local"`` (bayesfunc's log-lengthscales and log-height), ``"softplus"``
        for the others (GPflow). With softplus, a lengthscale that must grow by orders of
        magnitude takes many steps to get there; see ``docs/global_inducing.md``.
    :param latent_dim: ``D_w``: if given, a latent-variable deep GP
        (:class:`~deepgp_gi.latent.LatentDeepGP`, Salimbeni et al. 2019): the first layer sees
        ``[x, w]`` with ``p(w) = N(0, I)`` and an amortised ``q(w | x, y)``; train it on the
        importance-weighted bound with ``fit(..., importance_samples=K)``. The inducing inputs get
        ``D_w`` more columns, ``N(0, 1)`` draws (learned); the inner layers are ``D + D_w`` wide by
        default and the first one's mean function passes ``w`` on (it drops ``w`` when they are
        narrower). Families: :data:`~deepgp_gi.latent.LATENT_FAMILIES` (a sampling family is
        refused, saying why).
    :param encoder: the ``tf.Module`` computing ``q(w | x, y)`` (contract:
        :mod:`deepgp_gi.layers.latent`); default the paper's MLP (two hidden layers of 20 tanh
        units). Needs ``latent_dim``.
    :param kernel_start: where the kernels' hyperparameters start: ``"dsvi"`` (the DSVI paper's
        variance 2 and lengthscales 2) or ``"havasi"`` (Havasi et al.'s SGHMC code's variance 0.01
        and lengthscales ``sqrt(D_in)``, each layer's input width ``D_in``); :data:`KERNEL_STARTS`.
    :param posterior_options: options of the family (e.g. ``whiten=True`` for mean-field,
        ``precision="diagonal"`` for global inducing); each family's accepted options are listed
        in its table entry, and anything else raises a ``ValueError`` naming them.
    """
    family = family_class(posterior, "deep_gp")
    check_options(posterior, family, posterior_options)
    depth = check_positive_int(depth, "depth")
    num_inducing = check_positive_int(num_inducing, "num_inducing")
    seed = check_seed(seed)
    if positive_transform is None:
        positive_transform = family.positive_transform
    positive_transform = check_choice(positive_transform, "positive_transform", POSITIVE_TRANSFORMS)
    kernel_start = check_choice(kernel_start, "kernel_start", KERNEL_STARTS)
    dtype = gpflow.default_float()
    X = as_data_array(X, "X", dtype).numpy()
    Y = as_data_array(Y, "Y", dtype).numpy()
    check_data_pair(X, Y)
    N, D = X.shape
    if encoder is not None and latent_dim is None:
        raise ValueError("encoder is for a latent-variable model: give latent_dim too")
    if latent_dim is not None:
        latent_dim = check_positive_int(latent_dim, "latent_dim")
        check_latent_family(posterior, family)
    if inner_width is None:  # a latent model's inner layers carry [x, w] (identity mean maps)
        inner_width = min(30, D + (latent_dim or 0))
    inner_width = check_positive_int(inner_width, "inner_width")
    if likelihood is None:
        with positive_transform_context(positive_transform):
            likelihood = gpflow.likelihoods.Gaussian(variance=0.01)
    output_dim = getattr(likelihood, "latent_dim", None) or Y.shape[1]
    Z = family.initial_inducing_inputs(X, num_inducing, seed)  # pushed through the inner mean maps
    X_layers, X_init = X, X
    if (
        latent_dim is not None
    ):  # [x, w]: N(0, 1) latent columns for the inducing rows, zeros for the mean maps
        rng = np.random.default_rng(None if seed is None else seed + 1)
        Z = None if Z is None else with_latent_columns(Z, latent_dim, rng)
        X_layers, X_init = (
            with_latent_columns(X, latent_dim, None),
            with_latent_columns(X, latent_dim, rng),
        )
    layers = build_layers(
        X_layers,
        output_dim,
        depth,
        inner_width,
        Z,
        positive_transform=positive_transform,
        kernel_start=kernel_start,
    )
    targets = pseudo_targets(Y, likelihood, output_dim)
    post = family.from_data(
        layers, X_init, targets, num_inducing=num_inducing, seed=seed, **posterior_options
    )
    if latent_dim is not None:
        latent = LatentVariableLayer(
            D, Y.shape[1], latent_dim, encoder=encoder, seed=seed, name="latent"
        )
        return LatentDeepGP(layers, likelihood, post, latent, num_data=N)
    return DeepGP(layers, likelihood, post, num_data=N)
