"""Inducing weights (Ritter et al. 2021; docs/algorithms.md, "Inducing weights"): FFG-U, Ensemble-U
and Ensemble-W.

Model (paper convention, one layer). ``W`` is ``[d_out, d_in]`` (``d_in`` includes the bias)
with ``p(vec W) = N(0, sigma^2 I)``, ``sigma = 1/sqrt(P)`` for the layer prior's precision ``P``
(NealPrior: ``sigma = sd/sqrt(d_in)``). Inducing weights ``U`` ``[M_out, M_in]`` are augmented
through ``Z_r`` ``[M_out, d_out]``, ``Z_c`` ``[M_in, d_in]`` and positive diagonals ``D_r``
``[M_out]``, ``D_c`` ``[M_in]``:

* ``p(U) = MN(0, Psi_r, Psi_c)``, ``Psi = Z Z^T + diag(D^2)``;
* ``p(W | U) = N(sigma T_r U T_c, sigma^2 (I - Z_c^T Psi_c^-1 Z_c  kron  Z_r^T Psi_r^-1 Z_r))`` with
  ``T_r = Z_r^T Psi_r^-1`` ``[d_out, M_out]`` and ``T_c = Psi_c^-1 Z_c`` ``[M_in, d_in]``;
* ``q(W | U)`` has that mean and ``lambda^2`` times that covariance; its KL to ``p(W | U)`` is
  ``d_in d_out (lambda^2/2 - log lambda - 1/2)``, independent of ``U``;
* ``q(U)`` is over the whitened ``U~`` (``U = L_r U~ L_c^T``, ``L = chol(Psi)``): a factorised
  Gaussian (FFG-U) or ``K`` point masses (Ensemble-U).

Weights are sampled by the extended Matheron rule (:func:`extended_matheron_sample`), which
never forms the ``d_out d_in x d_out d_in`` covariance; it acts on a ``[S, d_out, d_in]`` weight
matrix. The dense layers of the library use ``Phi @ W^T`` (weights ``[S, d_in, d_out]``, columns
are units).

Convolutional networks. The three posteriors also take a convolutional network
(:func:`~deepgp_gi.layers.check_network`; :func:`~deepgp_gi.conv_bnn.build_conv_bnn`): every
weighted layer ``j`` (convolutions and dense layers, in forward order) gets the maths above, a
``k x k`` convolution with its filter as the ``[C_out, k k C_in + 1]`` matrix (``d_out = C_out``,
``d_in`` its fan-in with the bias), applied as the transposed ``[S, k k C_in + 1, C_out]`` filter
(:func:`~deepgp_gi.layers.apply_weights`). Layer indices ``l`` below are weighted-layer
indices.

Relative jitter. ``jitter`` (default 1e-4, as the reference code) is folded into the diagonals:
``D_eff^2 = D^2 + jitter * mean(diag(Z Z^T + D^2))``; ``D_eff`` is then used *everywhere* (``Psi``,
``p(U)`` and the Matheron sampler), so the sampler stays exact for the model it represents.

Noise names (all standard normal; ``S`` samples):

* ``"w/{l}/e1"`` ``[S, d_out, d_in]``, ``"w/{l}/e2"`` ``[S, K_r, M_in]``, ``"w/{l}/e3"``
  ``[S, M_out, K_c]``, ``"w/{l}/e4"`` ``[S, M_out, M_in]`` -- the Matheron noise of layer ``l``
  (``K_r = min(M_out, d_out)``, ``K_c = min(M_in, d_in)``, see :func:`matheron_factors`);
* ``"u/{l}"`` ``[S, M_out, M_in]`` -- the whitened FFG-U draw of ``U~``;
* ``"member"`` ``[1]`` -- the ensemble offset (Ensemble-U/W, see :func:`ensemble_members`);
* ``"s/{l}"`` -- the random-scale prior's Gamma draw (:mod:`.prior_scales`).

Ensemble member cycling (the decision). The paper trains member ``i`` at step ``i mod K``. The
training loop is family-agnostic and gives a posterior only a seeded noise source per step, so
the posterior chooses members from that source: one named draw ``"member"`` gives a uniform
offset ``o`` in ``{0..K-1}`` and sample ``s`` uses member ``(o + s) mod K``. With one sample per
step (training) each step trains one uniformly chosen member, so every member gets ``1/K`` of
the steps in expectation, as with ``i mod K``; the choice is a pure function of ``(seed, step)``
(no state, so checkpoints resume exactly and the step compiles under XLA). With ``S`` samples
(prediction) the members are cycled, so the mixture averages the members exactly when ``S`` is
a multiple of ``K`` (and to within one draw per member otherwise).

Ensemble U-term (docs/algorithms.md, "Paper versus reference code", item 11).
``KL[q(U) || p(U)]`` is undefined for point masses; as the reference code, the objective drops it
(it is not an ELBO). ``prior_regulariser=True``
adds ``-log p(U_k)`` (``-log p(W_k)`` for Ensemble-W) of the member used by each sample instead.
"""

from __future__ import annotations

import math
from typing import List, NamedTuple, Optional, Sequence

import gpflow
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
from check_shapes import check_shapes, inherit_check_shapes

from ..layers import apply_weights, is_convolution, run_layers
from ..linalg import safe_cholesky
from ..noise import NoiseSource
from ..validation import (
    check_bool,
    check_nonnegative_float,
    check_positive_float,
    check_positive_int,
)
from .base import Propagation
from .weight_space import WeightSpacePosterior

__all__ = [
    "CappedSoftplus",
    "MatheronFactors",
    "effective_diagonal",
    "inducing_covariance",
    "matheron_factors",
    "conditional_projections",
    "matheron_noise_shapes",
    "extended_matheron_sample",
    "conditional_kl",
    "whitened_gaussian_kl",
    "whitened_log_prior",
    "ensemble_members",
    "InducingWeights",
    "FFGInducingPosterior",
    "EnsembleInducingPosterior",
    "EnsembleWeightPosterior",
]


# --------------------------------------------------------------------------- transforms
class CappedSoftplus(tfp.bijectors.Bijector):
    """``y = min(softplus(x), cap)`` (the reference code's bounded positive parameters).

    Not a bijection above ``cap`` (the gradient there is zero); the inverse is
    ``softplus^{-1}`` and is only used for initial values, which must lie in ``(0, cap]``.
    """

    def __init__(self, cap: float, name: str = "capped_softplus"):
        parameters = dict(locals())
        self.cap = float(cap)
        super().__init__(
            forward_min_event_ndims=0, validate_args=False, parameters=parameters, name=name
        )

    def _forward(self, x):
        return tf.minimum(tf.math.softplus(x), tf.cast(self.cap, x.dtype))

    def _inverse(self, y):
        return tfp.math.softplus_inverse(y)

    def _forward_log_det_jacobian(self, x):
        inside = tf.math.softplus(x) < tf.cast(self.cap, x.dtype)
        return tf.where(inside, tf.math.log_sigmoid(x), tf.cast(-np.inf, x.dtype))


# --------------------------------------------------------------------------- pure functions
@check_shapes("Z: [M, d]", "D: [M]", "return: [M]")
def effective_diagonal(Z: tf.Tensor, D: tf.Tensor, jitter: float = 0.0) -> tf.Tensor:
    """``D_eff = sqrt(D^2 + jitter * mean(diag(Z Z^T + D^2)))`` ``[M]`` (``D`` itself when
    ``jitter == 0``)."""
    if jitter == 0:
        return D
    mean_diag = tf.reduce_mean(tf.reduce_sum(tf.square(Z), axis=-1) + tf.square(D))
    return tf.sqrt(tf.square(D) + tf.constant(jitter, D.dtype) * mean_diag)


@check_shapes("Z: [M, d]", "D: [M]", "return: [M, M]")
def inducing_covariance(Z: tf.Tensor, D: tf.Tensor) -> tf.Tensor:
    """``Psi = Z Z^T + diag(D^2)`` ``[M, M]``: the row (or column) covariance of ``p(U)``."""
    return tf.linalg.matmul(Z, Z, transpose_b=True) + tf.linalg.diag(tf.square(D))


class MatheronFactors(NamedTuple):
    """Per-step cache of one layer's factorisations (no sample axis).

    :ivar chol_r: ``L_r = chol(Psi_r)`` ``[M_out, M_out]``.
    :ivar chol_c: ``L_c = chol(Psi_c)`` ``[M_in, M_in]``.
    :ivar proj_r: ``B_r = L_r^{-1} Z_r`` ``[M_out, d_out]`` (so ``T_r = B_r^T L_r^{-1}``).
    :ivar proj_c: ``B_c = L_c^{-1} Z_c`` ``[M_in, d_in]`` (so ``T_c = L_c^{-T} B_c``).
    :ivar root_r: ``R_r`` ``[M_out, K_r]`` with ``R_r R_r^T = Z_r Z_r^T``: ``Z_r`` itself when
        ``d_out <= M_out``, else ``chol(Z_r Z_r^T)`` (``K_r = min(M_out, d_out)``).
    :ivar root_c: ``R_c`` ``[M_in, K_c]`` likewise for ``Z_c``.
    :ivar z_r: ``Z_r`` ``[M_out, d_out]``.
    :ivar z_c: ``Z_c`` ``[M_in, d_in]``.
    :ivar d_r: ``D_r`` ``[M_out]`` (effective, jitter included).
    :ivar d_c: ``D_c`` ``[M_in]``.
    """

    chol_r: tf.Tensor
    chol_c: tf.Tensor
    proj_r: tf.Tensor
    proj_c: tf.Tensor
    root_r: tf.Tensor
    root_c: tf.Tensor
    z_r: tf.Tensor
    z_c: tf.Tensor
    d_r: tf.Tensor
    d_c: tf.Tensor


def _gram_root(Z: tf.Tensor, name: str) -> tf.Tensor:
    """A square root ``R`` of ``Z Z^T`` with at most ``min(M, d)`` columns (``Z`` ``[M, d]``)."""
    M, d = Z.shape
    if d <= M:
        return Z
    return safe_cholesky(tf.linalg.matmul(Z, Z, transpose_b=True), name=name)


def _psi_cholesky(Z: tf.Tensor, D: tf.Tensor, jitter: float, name: str):
    """``(D_eff [M], chol(Psi) [M, M])`` of one side, ``Psi = Z Z^T + diag(D_eff^2)`` with the
    jitter folded into ``D`` (:func:`effective_diagonal`)."""
    D = effective_diagonal(Z, D, jitter)
    return D, safe_cholesky(inducing_covariance(Z, D), name=name)


@check_shapes(
    "Z_r: [M_out, d_out]",
    "Z_c: [M_in, d_in]",
    "D_r: [M_out]",
    "D_c: [M_in]",
)
def matheron_factors(Z_r, Z_c, D_r, D_c, jitter: float = 0.0) -> MatheronFactors:
    """Choleskies of ``Psi_r``, ``Psi_c``, the projections ``B = L^{-1} Z`` (triangular solves)
    and the roots of ``Z Z^T``; computed once per step and shared by every sample."""
    D_r, L_r = _psi_cholesky(Z_r, D_r, jitter, "Psi_r")
    D_c, L_c = _psi_cholesky(Z_c, D_c, jitter, "Psi_c")
    B_r = tf.linalg.triangular_solve(L_r, Z_r, lower=True)
    B_c = tf.linalg.triangular_solve(L_c, Z_c, lower=True)
    return MatheronFactors(
        L_r,
        L_c,
        B_r,
        B_c,
        _gram_root(Z_r, "Z_r Z_r^T"),
        _gram_root(Z_c, "Z_c Z_c^T"),
        Z_r,
        Z_c,
        D_r,
        D_c,
    )


@check_shapes(
    "Z_r: [M_out, d_out]",
    "Z_c: [M_in, d_in]",
    "D_r: [M_out]",
    "D_c: [M_in]",
    "return[0]: [d_out, M_out]",
    "return[1]: [M_in, d_in]",
)
def conditional_projections(Z_r, Z_c, D_r, D_c, jitter: float = 0.0):
    """``T_r = Z_r^T Psi_r^{-1}`` and ``T_c = Psi_c^{-1} Z_c`` by Cholesky solves (no inverse):
    ``E[W | U] = sigma T_r U T_c``."""
    _, L_r = _psi_cholesky(Z_r, D_r, jitter, "Psi_r")
    _, L_c = _psi_cholesky(Z_c, D_c, jitter, "Psi_c")
    T_r = tf.linalg.matrix_transpose(tf.linalg.cholesky_solve(L_r, Z_r))
    T_c = tf.linalg.cholesky_solve(L_c, Z_c)
    return T_r, T_c


def matheron_noise_shapes(d_out: int, d_in: int, M_out: int, M_in: int):
    """Shapes (without the sample axis) of ``E1..E4``: ``[d_out, d_in]``, ``[K_r, M_in]``,
    ``[M_out, K_c]``, ``[M_out, M_in]`` with ``K_r = min(M_out, d_out)``,
    ``K_c = min(M_in, d_in)``."""
    K_r, K_c = min(M_out, d_out), min(M_in, d_in)
    return (d_out, d_in), (K_r, M_in), (M_out, K_c), (M_out, M_in)


@check_shapes(
    "U: [S, M_out, M_in]",
    "lam: []",
    "sigma: [S]",
    "e1: [S, d_out, d_in]",
    "e2: [S, K_r, M_in]",
    "e3: [S, M_out, K_c]",
    "e4: [S, M_out, M_in]",
    "return: [S, d_out, d_in]",
)
def extended_matheron_sample(
    U, factors: MatheronFactors, lam, sigma, e1, e2, e3, e4, whitened: bool = True
):
    """Weights ``W ~ q(W | U)`` ``[S, d_out, d_in]`` by the extended Matheron rule (App. F).

    ``U_bar = Z_r E1 Z_c^T + R_r E2 D_c + D_r E3 R_c^T + D_r E4 D_c`` has, jointly with ``E1``,
    the prior of ``(W/sigma, U)``, so ``E1 - T_r U_bar T_c ~ N(0, Cov p(W|U)/sigma^2)`` and

        ``W = sigma [T_r U T_c + lam (E1 - T_r U_bar T_c)]``.

    With the cached factors, ``T_r X T_c = B_r^T (L_r^{-1} X L_c^{-T}) B_c``, i.e. two triangular
    solves of ``[M_out, M_in]`` matrices and two products; cost ``O(d_out d_in (M_out + M_in))``
    per sample.

    :param U: inducing weights, whitened (``U~``, ``U = L_r U~ L_c^T``) if ``whitened``.
    :param factors: :func:`matheron_factors` of the layer.
    :param lam: ``lambda``, the scale of the conditional's standard deviation.
    :param sigma: the prior standard deviation of a weight, per sample.
    :param e1: standard-normal noise of its shape in :func:`matheron_noise_shapes`.
    :param e2: likewise.
    :param e3: likewise.
    :param e4: likewise.
    """
    f = factors
    dtype = U.dtype
    S = tf.shape(U)[0]
    Z_r = tf.broadcast_to(f.z_r, tf.concat([[S], tf.shape(f.z_r)], 0))
    u_bar = tf.linalg.matmul(tf.linalg.matmul(Z_r, e1), f.z_c, transpose_b=True)  # [S, M_out, M_in]
    u_bar += tf.linalg.matmul(f.root_r, e2) * f.d_c[None, None, :]
    u_bar += f.d_r[None, :, None] * tf.linalg.matmul(e3, f.root_c, transpose_b=True)
    u_bar += f.d_r[None, :, None] * e4 * f.d_c[None, None, :]
    L_r = tf.broadcast_to(f.chol_r, tf.concat([[S], tf.shape(f.chol_r)], 0))
    L_c = tf.broadcast_to(f.chol_c, tf.concat([[S], tf.shape(f.chol_c)], 0))

    def whiten(A):  # L_r^{-1} A L_c^{-T}
        A = tf.linalg.triangular_solve(L_r, A, lower=True)
        return tf.linalg.matrix_transpose(
            tf.linalg.triangular_solve(L_c, tf.linalg.matrix_transpose(A), lower=True)
        )

    lam = tf.cast(lam, dtype)
    U_w = U if whitened else whiten(U)
    inner = U_w - lam * whiten(u_bar)  # [S, M_out, M_in]
    proj = tf.linalg.matmul(
        tf.linalg.matmul(f.proj_r, inner, transpose_a=True), f.proj_c
    )  # [S, d_out, d_in]
    return sigma[:, None, None] * (proj + lam * e1)


def conditional_kl(lam, d_out: int, d_in: int) -> tf.Tensor:
    """``KL[q(W|U) || p(W|U)] = d_in d_out (lam^2/2 - log lam - 1/2)`` (a scalar, for any ``U``)."""
    n = tf.cast(d_out * d_in, lam.dtype)
    return n * (0.5 * tf.square(lam) - tf.math.log(lam) - 0.5)


@check_shapes("mean: [M_out, M_in]", "sd: [M_out, M_in]", "return: []")
def whitened_gaussian_kl(mean, sd) -> tf.Tensor:
    """``KL[prod N(mean, sd^2) || N(0, I)]`` over the whitened inducing weights:
    ``0.5 sum(sd^2 + mean^2 - 1 - log sd^2)``; equals ``KL[q(U) || p(U)]``."""
    return 0.5 * tf.reduce_sum(tf.square(sd) + tf.square(mean) - 1.0 - 2.0 * tf.math.log(sd))


@check_shapes(
    "U_w: [S, M_out, M_in]", "chol_r: [M_out, M_out]", "chol_c: [M_in, M_in]", "return: [S]"
)
def whitened_log_prior(U_w, chol_r, chol_c) -> tf.Tensor:
    """``log p(U)`` of ``U = L_r U~ L_c^T`` under ``MN(0, Psi_r, Psi_c)``, from the whitened ``U~``:
    ``log N(U~; 0, I) - M_in sum log|diag L_r| - M_out sum log|diag L_c|``."""
    dtype = U_w.dtype
    M_out, M_in = chol_r.shape[0], chol_c.shape[0]
    log_det = M_in * tf.reduce_sum(
        tf.math.log(tf.abs(tf.linalg.diag_part(chol_r)))
    ) + M_out * tf.reduce_sum(tf.math.log(tf.abs(tf.linalg.diag_part(chol_c))))
    quad = tf.reduce_sum(tf.square(U_w), axis=[-2, -1])
    return -0.5 * quad - 0.5 * M_out * M_in * tf.constant(math.log(2 * math.pi), dtype) - log_det


def ensemble_members(
    num_members: int, num_samples: int, noise_source: NoiseSource, dtype
) -> tf.Tensor:
    """Member index of each sample ``[S]`` (int32): ``(o + s) mod K`` with a uniform offset ``o``
    from the standard-normal draw ``"member"`` ``[1]`` (``o = floor(K Phi(z))``); see the module
    docs for why members are chosen this way."""
    z = noise_source.normal("member", [1], dtype)
    u = tfp.distributions.Normal(tf.constant(0.0, dtype), tf.constant(1.0, dtype)).cdf(z)
    offset = tf.minimum(tf.cast(tf.floor(u * num_members), tf.int32), num_members - 1)
    return (offset[0] + tf.range(num_samples, dtype=tf.int32)) % num_members


def _select(stacked, members, num_members: int) -> tf.Tensor:
    """``stacked[members]`` ``[S, ...]`` as a one-hot product, so that the gradient with respect
    to the ``[K, ...]`` members is a dense tensor (a gather would give IndexedSlices)."""
    stacked = tf.convert_to_tensor(stacked)
    one_hot = tf.one_hot(members, num_members, dtype=stacked.dtype)  # [S, K]
    return tf.tensordot(one_hot, stacked, axes=1)


# --------------------------------------------------------------------------- per-layer parameters
def _inducing_size(M: int, d: int) -> int:
    return min(int(M), int(d))


class InducingWeights(gpflow.Module):
    """One layer's augmentation: ``Z_r``, ``Z_c``, ``D_r``, ``D_c`` and ``lambda``.

    ``M_out = min(M, d_out)`` and ``M_in = min(M, d_in)`` (more inducing rows than weight rows
    cannot help; this gives the ``10 x 128`` last layer of Ritter's CIFAR nets).

    :param d_out: the weight matrix's number of rows.
    :param d_in: the weight matrix's number of columns (with the bias column).
    :param num_inducing: ``M``.
    :param rng: draws ``Z ~ N(0, 1/M)`` (App. J).
    :param lambda_init: initial ``lambda`` (1e-3), in ``(0, lambda_max]``.
    :param lambda_max: ``lambda = min(softplus(.), lambda_max)``.
    :param d_init: initial ``D_r``, ``D_c`` (1e-3), ``D = softplus(.)``.
    :param jitter: relative jitter folded into ``D`` (see the module docs).
    """

    def __init__(
        self,
        d_out: int,
        d_in: int,
        num_inducing: int,
        rng: np.random.Generator,
        lambda_init: float = 1e-3,
        lambda_max: float = 1.0,
        d_init: float = 1e-3,
        jitter: float = 1e-4,
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        self.d_out, self.d_in = int(d_out), int(d_in)
        self.M_out, self.M_in = (
            _inducing_size(num_inducing, d_out),
            _inducing_size(num_inducing, d_in),
        )
        self.jitter = jitter
        M = int(num_inducing)
        self.z_rows = gpflow.Parameter(
            rng.standard_normal((self.M_out, self.d_out)) / np.sqrt(M), name="z_rows"
        )
        self.z_cols = gpflow.Parameter(
            rng.standard_normal((self.M_in, self.d_in)) / np.sqrt(M), name="z_cols"
        )
        self.d_rows = gpflow.Parameter(
            np.full(self.M_out, d_init), transform=tfp.bijectors.Softplus(), name="d_rows"
        )
        self.d_cols = gpflow.Parameter(
            np.full(self.M_in, d_init), transform=tfp.bijectors.Softplus(), name="d_cols"
        )
        self.lam = gpflow.Parameter(
            lambda_init, transform=CappedSoftplus(lambda_max), name="lambda"
        )

    def factors(self) -> MatheronFactors:
        return matheron_factors(self.z_rows, self.z_cols, self.d_rows, self.d_cols, self.jitter)

    def noise(self, l: int, S: int, source: NoiseSource, dtype) -> List[tf.Tensor]:
        shapes = matheron_noise_shapes(self.d_out, self.d_in, self.M_out, self.M_in)
        return [
            source.normal(f"w/{l}/e{i + 1}", [S, *shape], dtype) for i, shape in enumerate(shapes)
        ]

    def conditional_kl(self) -> tf.Tensor:
        return conditional_kl(tf.convert_to_tensor(self.lam), self.d_out, self.d_in)


def _check_options(num_inducing, lambda_init, lambda_max, d_init, jitter):
    num_inducing = check_positive_int(num_inducing, "num_inducing")
    lambda_max = check_positive_float(lambda_max, "lambda_max")
    lambda_init = check_positive_float(lambda_init, "lambda_init")
    if lambda_init > lambda_max:
        raise ValueError(f"lambda_init ({lambda_init}) must not exceed lambda_max ({lambda_max})")
    return (
        num_inducing,
        lambda_init,
        lambda_max,
        check_positive_float(d_init, "d_init"),
        check_nonnegative_float(jitter, "jitter"),
    )


class _SampledWeightPosterior(WeightSpacePosterior):
    """The forward pass shared by the inducing-weight families and Ensemble-W, on a
    fully-connected or a convolutional network (:func:`~deepgp_gi.layers.run_layers`).

    Weighted layer ``j`` (a DenseLayer or a Conv2DLayer) gets one weight sample per Monte Carlo
    sample from :meth:`_layer_weights`; a convolution's filter is the ``[C_out, k k C_in + 1]``
    matrix (``d_out = C_out``, ``d_in`` = its fan-in with the bias), so the maths is the dense
    layers'. Weights are point masses per sample: ``var = 0``.
    """

    _CONV_NETWORKS = True

    def __init__(self, layers, name=None, seed=None):
        super().__init__(layers, name=name, seed=seed)
        for j, layer in enumerate(self.weighted):
            if is_convolution(layer) and getattr(layer.prior, "is_spatial", False):
                raise ValueError(
                    f"prior {type(layer.prior).__name__} of weighted layer {j} ({layer.name}) "
                    f"gives a convolution correlated weights; the {self.family_name!r} family "
                    "needs an isotropic prior N(0, sigma^2 I) (prior 'standard', 'neal' or "
                    "'scale')"
                )

    def _members(self, S, source, dtype):
        """The ensemble member of each sample ``[S]`` (None for FFG-U)."""
        return None

    def _layer_weights(self, j, S, source, dtype, members, precision):
        """Weighted layer ``j``'s weights and regulariser ``[S]``: ``(W, transpose, reg)``, ``W``
        ``[S, d_out, d_in]`` if ``transpose`` (paper layout) else ``[S, d_in, d_out]``."""
        raise NotImplementedError

    @inherit_check_shapes
    def propagate(self, X, num_samples: int = 1, seed=None) -> Propagation:
        S = int(num_samples)
        source, F = self._start(X, S, seed)
        dtype = F.dtype
        members = self._members(S, source, dtype)
        kl = [tf.zeros([S], dtype)]
        samples = []

        def step(layer, H):
            j = len(samples)
            Phi = layer.features(H)
            p, scale_log_ratio = self.prior_precision(j, S, source, dtype)
            W, transpose, reg = self._layer_weights(j, S, source, dtype, members, p)
            H = apply_weights(layer, Phi, W, transpose=transpose)
            kl[0] = kl[0] + reg - scale_log_ratio
            samples.append(H)
            return H

        F = run_layers(self.layers, F, step)
        return Propagation(samples=samples, mean=F, var=tf.zeros_like(F), kl=kl[0])


class _InducingWeightPosterior(_SampledWeightPosterior):
    """Shared set-up and weights of FFG-U and Ensemble-U (subclasses give ``q(U~)``)."""

    @classmethod
    def from_data(cls, layers, X, Y, *, num_inducing, seed, **options):
        """``num_inducing`` is the size M of each layer's inducing weight matrix; the posterior
        draws their initial values from ``seed``. ``X`` and ``Y`` are not used."""
        return cls(layers, num_inducing=num_inducing, seed=seed, **options)

    def __init__(self, layers, num_inducing, lambda_init, lambda_max, d_init, jitter, seed, name):
        super().__init__(layers, name=name, seed=seed)
        M, lambda_init, lambda_max, d_init, jitter = _check_options(
            num_inducing, lambda_init, lambda_max, d_init, jitter
        )
        self.num_inducing = M
        self.lambda_max = lambda_max
        self._rng = np.random.default_rng(seed)
        self.inducing_weights = [
            InducingWeights(
                layer.output_dim,
                layer.fan_in,
                M,
                self._rng,
                lambda_init,
                lambda_max,
                d_init,
                jitter,
                name=f"inducing_weights_{l}",
            )
            for l, layer in enumerate(self.weighted)
        ]

    def _whitened_u(self, l, S, source, dtype, members, factors):
        """``U~`` ``[S, M_out, M_in]`` and the U-term of the regulariser ``[S]``."""
        raise NotImplementedError

    def _layer_weights(self, j, S, source, dtype, members, precision):
        iw = self.inducing_weights[j]
        factors = iw.factors()
        U_w, u_term = self._whitened_u(j, S, source, dtype, members, factors)
        W = extended_matheron_sample(
            U_w, factors, iw.lam, tf.math.rsqrt(precision), *iw.noise(j, S, source, dtype)
        )
        return W, True, iw.conditional_kl() + u_term


class FFGInducingPosterior(_InducingWeightPosterior):
    """FFG-U: a factorised Gaussian over the whitened inducing weights of every layer.

    ``q(U~_l) = prod N(m, s^2)``, ``s = min(softplus(.), sd_max)``; the regulariser per sample is
    ``sum_l KL[q(U~_l) || N(0, I)] + d_in d_out (lambda_l^2/2 - log lambda_l - 1/2)`` (plus the
    random-scale prior's log-ratio). Weights are sampled per Monte Carlo sample (``var = 0``).

    :param layers: DenseLayers, or a convolutional network (module docs).
    :param num_inducing: ``M`` (the inducing weights are ``min(M, d_out) x min(M, d_in)``).
    :param lambda_init: initial ``lambda`` (1e-3).
    :param lambda_max: the cap of ``lambda`` (1).
    :param sd_init: initial whitened sd (1e-3).
    :param sd_max: the cap of the whitened sd (1, the prior's).
    :param d_init: initial ``D`` (1e-3).
    :param jitter: relative jitter of ``Psi`` (1e-4), folded into ``D``.
    :param means: per-layer initial whitened means ``[M_out, M_in]``; default ``N(0, 1)``.
    :param seed: seeds ``Z`` and the default means.
    """

    options = ("lambda_init", "lambda_max", "sd_init", "sd_max", "d_init", "jitter")
    summary = "inducing weights, factorised Gaussian q(U) (FFG-U, Ritter et al. 2021)"

    family_name = "ffg_u"

    def __init__(
        self,
        layers,
        num_inducing: int = 64,
        lambda_init: float = 1e-3,
        lambda_max: float = 1.0,
        sd_init: float = 1e-3,
        sd_max: float = 1.0,
        d_init: float = 1e-3,
        jitter: float = 1e-4,
        means: Optional[Sequence] = None,
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        super().__init__(layers, num_inducing, lambda_init, lambda_max, d_init, jitter, seed, name)
        sd_max = check_positive_float(sd_max, "sd_max")
        sd_init = check_positive_float(sd_init, "sd_init")
        if sd_init > sd_max:
            raise ValueError(f"sd_init ({sd_init}) must not exceed sd_max ({sd_max})")
        if means is not None and len(means) != self.depth:
            raise ValueError(
                f"means must have one entry per layer ({self.depth}), got {len(means)}"
            )
        self.sd_max = sd_max
        self.u_means, self.u_sds = [], []
        for l, iw in enumerate(self.inducing_weights):
            shape = (iw.M_out, iw.M_in)
            m = (
                self._rng.standard_normal(shape)
                if means is None or means[l] is None
                else np.asarray(means[l], float)
            )
            if m.shape != shape:
                raise ValueError(f"means[{l}] must have shape {shape}, got {m.shape}")
            self.u_means.append(gpflow.Parameter(m, name=f"u_mean_{l}"))
            self.u_sds.append(
                gpflow.Parameter(
                    np.full(shape, sd_init), transform=CappedSoftplus(sd_max), name=f"u_sd_{l}"
                )
            )

    def _whitened_u(self, l, S, source, dtype, members, factors):
        mean, sd = self.u_means[l], self.u_sds[l]
        eps = source.normal(f"u/{l}", [S, *mean.shape], dtype)
        kl = whitened_gaussian_kl(tf.convert_to_tensor(mean), tf.convert_to_tensor(sd))
        return mean[None] + sd[None] * eps, tf.fill([S], kl)


class EnsembleInducingPosterior(_InducingWeightPosterior):
    """Ensemble-U: ``K`` point masses over the whitened inducing weights, ``q(W|U)`` as FFG-U.

    Members are chosen per sample by :func:`ensemble_members` (module docs). The U-term of the
    KL is undefined and dropped (docs/algorithms.md, "Paper versus reference code", item 11);
    ``prior_regulariser=True`` adds
    ``-log p(U_k)`` of each sample's member.

    :param num_members: ``K`` (5; the toy uses 8).
    :param member_spread: initial members are one shared ``N(0, 1)`` draw plus
        ``N(0, member_spread^2)`` each (0.1).
    :param prior_regulariser: add ``-log p(U_k)`` (False).

    Other parameters as :class:`FFGInducingPosterior`.
    """

    options = (
        "num_members",
        "lambda_init",
        "lambda_max",
        "d_init",
        "jitter",
        "member_spread",
        "prior_regulariser",
    )
    summary = "inducing weights, ensemble of point masses q(U) (Ensemble-U)"

    family_name = "ensemble_u"

    def __init__(
        self,
        layers,
        num_inducing: int = 64,
        num_members: int = 5,
        lambda_init: float = 1e-3,
        lambda_max: float = 1.0,
        d_init: float = 1e-3,
        jitter: float = 1e-4,
        member_spread: float = 0.1,
        prior_regulariser: bool = False,
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        super().__init__(layers, num_inducing, lambda_init, lambda_max, d_init, jitter, seed, name)
        self.num_members = check_positive_int(num_members, "num_members")
        member_spread = check_nonnegative_float(member_spread, "member_spread")
        self.prior_regulariser = check_bool(prior_regulariser, "prior_regulariser")
        self.u_members = []
        for l, iw in enumerate(self.inducing_weights):
            shared = self._rng.standard_normal((iw.M_out, iw.M_in))
            spread = member_spread * self._rng.standard_normal(
                (self.num_members, iw.M_out, iw.M_in)
            )
            self.u_members.append(gpflow.Parameter(shared[None] + spread, name=f"u_members_{l}"))

    def _members(self, S, source, dtype):
        return ensemble_members(self.num_members, S, source, dtype)

    def _whitened_u(self, l, S, source, dtype, members, factors):
        U_w = _select(self.u_members[l], members, self.num_members)
        if self.prior_regulariser:
            return U_w, -whitened_log_prior(U_w, factors.chol_r, factors.chol_c)
        return U_w, tf.zeros([S], dtype)


class EnsembleWeightPosterior(_SampledWeightPosterior):
    """Ensemble-W: ``K`` point masses over the weights of every layer (a deep ensemble).

    Weights ``[K, d_in, d_out]`` (library layout) are stored times ``sqrt(d_in)`` (O&A App. H
    re-scaling) and initialised from the prior. Members are chosen per sample by
    :func:`ensemble_members`. The KL is undefined and dropped; ``prior_regulariser=True`` adds
    ``-log p(W_k)`` (MAP ensemble members). Noise: ``"member"`` (and ``"s/{l}"``) only.

    :param layers: DenseLayers, or a convolutional network (module docs; a convolution's members
        are ``[K, k k C_in + 1, C_out]`` filters).
    :param num_members: ``K`` (5).
    :param prior_regulariser: add ``-log p(W_k)`` (False).
    :param seed: seeds the initial members.
    """

    options = ("num_members", "prior_regulariser")
    summary = "ensemble of point-mass weights (Ensemble-W)"

    @classmethod
    def from_data(cls, layers, X, Y, *, num_inducing, seed, **options):
        """Point-mass members: the posterior draws its members from the prior from ``seed``; ``X``,
        ``Y`` and ``num_inducing`` are not used."""
        return cls(layers, seed=seed, **options)

    family_name = "ensemble_w"

    def __init__(
        self,
        layers,
        num_members: int = 5,
        prior_regulariser: bool = False,
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        super().__init__(layers, name=name, seed=seed)
        self.num_members = check_positive_int(num_members, "num_members")
        self.prior_regulariser = check_bool(prior_regulariser, "prior_regulariser")
        rng = np.random.default_rng(seed)
        self.weight_members = []
        for l, layer in enumerate(self.weighted):
            D, P = layer.fan_in, layer.output_dim
            sd = np.sqrt(layer.prior.weight_variance(D))
            W = sd * rng.standard_normal((self.num_members, D, P))
            self.weight_members.append(gpflow.Parameter(W * np.sqrt(D), name=f"weight_members_{l}"))

    def _members(self, S, source, dtype):
        return ensemble_members(self.num_members, S, source, dtype)

    def _layer_weights(self, j, S, source, dtype, members, precision):
        layer = self.weighted[j]
        D = tf.constant(float(layer.fan_in), dtype)
        W = _select(self.weight_members[j], members, self.num_members) / tf.sqrt(D)  # [S, D, P]
        if not self.prior_regulariser:
            return W, False, tf.zeros([S], dtype)
        p = precision
        n = tf.cast(tf.size(W[0]), dtype)
        log_p = 0.5 * n * tf.math.log(p / (2 * math.pi)) - 0.5 * p * tf.reduce_sum(
            tf.square(W), axis=[-2, -1]
        )
        return W, False, -log_p
