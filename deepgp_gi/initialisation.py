"""What the builders share when they initialise a model from data: the targets in pseudo-target
form, the placement of inducing points, and the weight priors.

Each posterior family initialises itself in its ``from_data`` classmethod
(:meth:`~deepgp_gi.posteriors.DeepPosterior.from_data`); the pieces several families use live
here: :func:`pseudo_targets`, :func:`kmeans_inducing_inputs` (DSVI's inducing inputs),
:func:`global_inducing_rows`, :func:`local_inducing_images` and :func:`weight_prior_factory`.

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

from typing import Callable, Optional, Tuple, Union

import gpflow
import numpy as np
import scipy.cluster.vq

from .layers import Conv2DLayer, weighted_layers
from .priors import PRIORS, WeightPrior
from .validation import check_choice, check_positive_int

__all__ = [
    "pseudo_targets",
    "kmeans_inducing_inputs",
    "global_inducing_rows",
    "local_inducing_images",
    "weight_prior_factory",
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


def kmeans_inducing_inputs(X: np.ndarray, num_inducing: int, seed: Optional[int]) -> np.ndarray:
    """``num_inducing`` k-means centres of the rows of ``X`` ``[N, D]`` (k-means++ start, seeded);
    ``X`` itself when ``num_inducing == N``. Refuses ``num_inducing > N``, naming both."""
    N = X.shape[0]
    if num_inducing > N:
        raise ValueError(
            f"num_inducing={num_inducing} exceeds the number of data points N={N}; this posterior "
            f"initialises its inducing inputs by k-means on X"
        )
    rng = np.random.default_rng(seed)
    if num_inducing == N:
        return X.copy()
    Z, _ = scipy.cluster.vq.kmeans2(X, num_inducing, minit="++", seed=rng)
    return Z


def global_inducing_rows(
    X: np.ndarray, targets: np.ndarray, num_inducing: int, rng: np.random.Generator
) -> Tuple[np.ndarray, np.ndarray]:
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


def local_inducing_images(layers, rng: np.random.Generator) -> None:
    """Put ``N(0, 1)`` local inducing inputs on a convolutional network's weighted layers: a
    convolution gets ``ceil(D / (H' W'))`` images (the fewest whose patch rows can pin down its
    ``D`` weights), a dense layer ``D`` feature rows."""
    dtype = gpflow.default_float()
    for layer in weighted_layers(layers):
        if isinstance(layer, Conv2DLayer):
            H, W = layer.output_shape[:2]
            M = -(-layer.fan_in // (H * W))
            layer.inducing_images = gpflow.Parameter(
                rng.standard_normal((M,) + layer.input_shape).astype(dtype), name="inducing_images"
            )
        else:
            layer.inducing_features = gpflow.Parameter(
                rng.standard_normal((layer.fan_in, layer.fan_in)).astype(dtype),
                name="inducing_features",
            )
