"""``build_conv_bnn``: convolutional BNNs for images as deep GPs (O&A 2021 §2.2, App. N, O).

Two architectures:

* ``"lenet"``: LeNet-5 style, ``conv(k) - relu - avgpool2 - conv(k) - relu - avgpool2 - flatten
  - dense - relu - dense - relu - dense`` (``channels=(6, 16)``, ``hidden=(120, 84)``, ``k = 5``
  by default);
* ``"resnet"``: the paper's small ResNet (App. O), ``conv - relu - [block] - avgpool2 - [block] -
  avgpool2 - [block] - global avgpool - dense``, with ``block = x + relu(conv(relu(conv(x))))``,
  32 channels and ``3 x 3`` kernels; ``batch_norm=True`` puts an
  :class:`~deepgp_gi.layers.InducingBatchNorm` after every convolution (inducing families).

Every convolution is stride 1 with "same" padding. See :mod:`deepgp_gi.posteriors.convolutional`
for the posteriors and :mod:`deepgp_gi.layers.convolutional` for the layers.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import gpflow
import numpy as np

from .families import check_options
from .initialisation import pseudo_targets, weight_prior_factory
from .layers import (
    Activation,
    AveragePool2D,
    Conv2DLayer,
    DenseLayer,
    Flatten,
    GlobalAveragePool2D,
    InducingBatchNorm,
    ResidualBlock,
)
from .models import DeepGP
from .posteriors.registry import CONV_BNN_FAMILIES, family_class
from .priors import WeightPrior
from .validation import (
    as_data_array,
    check_bool,
    check_choice,
    check_data_pair,
    check_positive_int,
    check_seed,
)

__all__ = ["build_conv_bnn", "ARCHITECTURES", "CONV_POSTERIORS", "WEIGHT_FAMILIES"]

ARCHITECTURES = ("lenet", "resnet")
#: The weight-space families of :mod:`deepgp_gi.posteriors.inducing_weights` on a conv network
#: (their classes and options are the BNN family table's).
WEIGHT_FAMILIES = ("ffg_u", "ensemble_u", "ensemble_w")
#: Names accepted by ``build_conv_bnn(posterior=...)`` (the keys of the conv family table).
CONV_POSTERIORS = tuple(CONV_BNN_FAMILIES)


def _widths(value, name: str, length: Optional[int] = None) -> tuple:
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, (tuple, list)) or (length is not None and len(value) != length):
        raise ValueError(
            f"{name} must be a tuple of {length or 'some'} positive integers, got {value!r}"
        )
    return tuple(check_positive_int(v, f"{name} entry") for v in value)


def _pool(shape, name):
    if shape[0] % 2 or shape[1] % 2:
        raise ValueError(f"the {name} needs an even image size to pool by 2, got {shape[:2]}")
    return AveragePool2D(shape, 2, name=name)


def lenet_layers(
    input_shape, num_classes: int, prior, channels=(6, 16), hidden=(120, 84), kernel_size: int = 5
):
    """The LeNet-style stack (see the module docs); ``prior()`` makes each layer's prior."""
    layers, shape = [], tuple(input_shape)
    for i, c in enumerate(channels):
        conv = Conv2DLayer(shape, c, kernel_size, "same", prior=prior(), name=f"conv_{i}")
        layers += [conv, Activation(conv.output_shape, "relu", name=f"relu_{i}")]
        layers.append(_pool(conv.output_shape, f"pool_{i}"))
        shape = layers[-1].output_shape
    layers.append(Flatten(shape, name="flatten"))
    width = layers[-1].output_shape[0]
    for i, h in enumerate(tuple(hidden) + (num_classes,)):
        layers.append(
            DenseLayer(
                width,
                h,
                activation="identity" if i == 0 else "relu",
                prior=prior(),
                name=f"dense_{i}",
            )
        )
        width = h
    return layers


def resnet_layers(
    input_shape,
    num_classes: int,
    prior,
    channels: int = 32,
    kernel_size: int = 3,
    batch_norm: bool = False,
):
    """The paper's small ResNet (App. O; see the module docs)."""
    count = [0]

    def conv(shape):
        i = count[0]
        count[0] += 1
        c = Conv2DLayer(shape, channels, kernel_size, "same", prior=prior(), name=f"conv_{i}")
        out = [c]
        if batch_norm:
            out.append(InducingBatchNorm(c.output_shape, name=f"batch_norm_{i}"))
        return out + [Activation(c.output_shape, "relu", name=f"relu_{i}")]

    def block(shape, i):
        return ResidualBlock(conv(shape) + conv(shape[:2] + (channels,)), name=f"block_{i}")

    layers = conv(tuple(input_shape))
    shape = layers[-1].output_shape
    for i in range(3):
        layers.append(block(shape, i))
        if i < 2:
            layers.append(_pool(shape, f"pool_{i}"))
            shape = layers[-1].output_shape
    layers.append(GlobalAveragePool2D(shape, name="global_pool"))
    layers.append(
        DenseLayer(channels, num_classes, activation="identity", prior=prior(), name="dense")
    )
    return layers


def build_conv_bnn(
    X,
    Y,
    *,
    architecture: str = "lenet",
    posterior: str = "global",
    prior: Union[str, WeightPrior] = "neal",
    num_inducing: int = 100,
    likelihood: Optional[gpflow.likelihoods.Likelihood] = None,
    channels: Union[None, int, Sequence[int]] = None,
    hidden: Sequence[int] = (120, 84),
    kernel_size: Optional[int] = None,
    batch_norm: bool = False,
    seed: Optional[int] = None,
    **posterior_options,
) -> DeepGP:
    """A convolutional BNN for image classification as a :class:`~deepgp_gi.DeepGP`.

    :param X: training images ``[N, H, W, C]`` (for shapes and ``U_0``).
    :param Y: class labels ``[N, 1]`` (integers 0..C-1, as floats or ints).
    :param architecture: ``"lenet"`` or ``"resnet"`` (module docs).
    :param posterior: ``"factorised"``, ``"local"``, ``"global"`` or ``"factorised_global"``
        (:data:`~deepgp_gi.posteriors.convolutional.CONV_FAMILIES`), or the inducing-weight
        families ``"ffg_u"``, ``"ensemble_u"`` and ``"ensemble_w"`` (Ritter et al. 2021,
        :mod:`deepgp_gi.posteriors.inducing_weights`: every convolution and dense layer gets
        matrix-normal inducing weights; a filter is the ``[C_out, k k C_in + 1]`` matrix).
    :param prior: ``"standard"``, ``"neal"``, ``"scale"``, ``"spatial_iw"`` or a
        :class:`~deepgp_gi.priors.WeightPrior` template (each layer gets a deep copy).
    :param num_inducing: M, the number of global inducing images (global, factorised_global):
        the first M images of a seeded shuffle of X; the last layer's pseudo-outputs are their
        one-hot labels (O&A App. O); for M > N the policy of :mod:`deepgp_gi.initialisation`. For
        ffg_u and ensemble_u, the size of every layer's inducing weights
        (``min(M, C_out) x min(M, d_in)``).
    :param likelihood: default ``gpflow.likelihoods.Softmax(C)`` with ``C = max(Y) + 1``.
    :param channels: lenet: the two conv widths (``(6, 16)``); resnet: the width (32).
    :param hidden: lenet's dense hidden widths (``(120, 84)``).
    :param kernel_size: lenet 5, resnet 3.
    :param batch_norm: resnet only: :class:`~deepgp_gi.layers.InducingBatchNorm` after each
        convolution (global and factorised_global only).
    :param seed: seeds the shuffle choosing ``U_0`` and every random initial value.
    :param posterior_options: ``log_precision_init``, ``dense_precision``, ``kl``, ``rho`` of
        :class:`~deepgp_gi.posteriors.convolutional.ConvNetPosterior`; for the inducing-weight
        families the options of ``build_bnn``'s (``lambda_init``, ``lambda_max``, ``sd_init``,
        ``sd_max``, ``d_init``, ``jitter``, ``num_members``, ``member_spread``,
        ``prior_regulariser``, as each family accepts).
    """
    check_choice(architecture, "architecture", ARCHITECTURES)
    family = family_class(posterior, "conv_bnn")
    check_options(posterior, family, posterior_options)
    prior_factory = weight_prior_factory(prior)
    num_inducing = check_positive_int(num_inducing, "num_inducing")
    seed = check_seed(seed)
    batch_norm = check_bool(batch_norm, "batch_norm")
    dtype = gpflow.default_float()
    Xt = as_data_array(X, "X", dtype, ndim=4)
    Yt = as_data_array(Y, "Y", dtype, columns=1)
    check_data_pair(Xt, Yt, "X", "Y")
    Xn, labels = Xt.numpy(), Yt.numpy()[:, 0]
    if np.any(labels < 0) or np.any(labels != np.round(labels)):
        raise ValueError("Y must hold integer class labels 0..C-1")
    N = Xn.shape[0]
    if likelihood is None:
        likelihood = gpflow.likelihoods.Softmax(int(labels.max()) + 1)
    if not isinstance(likelihood, gpflow.likelihoods.Likelihood):
        raise TypeError(
            f"likelihood must be a gpflow.likelihoods.Likelihood, got {type(likelihood).__name__}"
        )
    num_classes = int(
        getattr(likelihood, "num_classes", getattr(likelihood, "latent_dim", None) or 1)
    )
    if batch_norm and architecture != "resnet":
        raise ValueError("batch_norm is an option of architecture='resnet'")
    if batch_norm and not family.propagates_inducing_rows:
        propagating = [
            name for name, cls in CONV_BNN_FAMILIES.items() if cls.propagates_inducing_rows
        ]
        raise ValueError(
            "batch_norm=True needs propagated inducing rows: posterior "
            + " or ".join(map(repr, propagating))
        )

    rng = np.random.default_rng(seed)
    if architecture == "lenet":
        layers = lenet_layers(
            Xn.shape[1:],
            num_classes,
            prior_factory,
            channels=_widths((6, 16) if channels is None else channels, "channels", 2),
            hidden=_widths(hidden, "hidden") if hidden else (),
            kernel_size=check_positive_int(
                5 if kernel_size is None else kernel_size, "kernel_size"
            ),
        )
    else:
        width = 32 if channels is None else check_positive_int(channels, "channels")
        layers = resnet_layers(
            Xn.shape[1:],
            num_classes,
            prior_factory,
            channels=width,
            kernel_size=check_positive_int(
                3 if kernel_size is None else kernel_size, "kernel_size"
            ),
            batch_norm=batch_norm,
        )

    post = family.from_data(
        layers,
        Xn,
        pseudo_targets(labels[:, None], likelihood, num_classes),
        num_inducing=num_inducing,
        seed=int(rng.integers(2**31 - 1)),
        **posterior_options,
    )
    return DeepGP(layers, likelihood, posterior=post, num_data=N)
