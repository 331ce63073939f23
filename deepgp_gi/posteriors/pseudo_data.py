"""Pseudo-data and the Bayesian linear regression behind every inducing posterior.

Global inducing, local inducing and the global-inducing layer of fac->gi all write the inducing
posterior of a layer as the posterior of a Bayesian linear regression (docs/algorithms.md,
"Global inducing points" and "Posterior families"):
pseudo-outputs ``V`` ``[M, P]`` observed with noise precisions ``Lambda`` at M rows whose
*features* are ``Phi`` ``[S, M, D]``, under the prior ``w_lambda ~ N(0, p^{-1} I_D)``:

    Prec_lambda = p I + Phi^T Lambda_lambda Phi,
    mean_lambda = Prec_lambda^{-1} Phi^T Lambda_lambda v_lambda.

* **Function space** (any kernel): the features are ``Phi = L_K = chol(K_uu)`` and ``p = 1``; the
  weights are the whitened inducing outputs ``a`` with ``U - m(U_prev) = L_K a``. ``Prec`` is then
  ``B = I + L_K^T Lambda L_K`` (eigenvalues >= 1).
* **Weight space** (a kernel with a finite feature map, e.g. a BNN layer): the features are the
  layer's ``Phi(U_prev)`` (bias column included) and ``p`` the weight prior's precision; the
  weights are the layer's weights.

One routine (:func:`pseudo_data_posterior`) builds ``(L, mean)`` for both; :func:`sample_weights`,
:func:`log_ratio`, :func:`analytic_kl` and :func:`marginal_variance` act on that pair,
:func:`draw_weights` bundles a draw with its log-ratio and KL, and :func:`regulariser` picks a
layer's term of the ELBO (:data:`KL_MODES`). The precision is never
inverted. In function space (prior precision 1) the factor comes with its inverse ``L^{-1}``
(:func:`~deepgp_gi.linalg.cholesky_with_inverse`: one triangular solve against ``I``), and the
solves by ``L`` are products with it: ``B = I + ...`` has eigenvalues >= 1, so ``|L^{-1}| <= 1``
and the products are as accurate as the solves, the analytic KL's trace is ``|L^{-1}|_F^2``, and
the gradient needs no solve. ``B`` needs no jitter, so its factorisation has no jitter ladder
(``max_tries=0``; a failure, from non-finite inputs, is still reported).
:func:`stacked_posterior` does the same for local inducing's layers as one stack.

Layouts: ``L`` is ``[S, D, D]`` when ``Lambda`` is shared by the P units (``"full"`` or
``"shared_diagonal"``) and ``[S, P, D, D]`` with one diagonal per unit (``"diagonal"``); ``mean``
and the weights are ``[S, D, P]`` (column lambda is unit lambda).

:class:`PseudoData` holds ``V`` and ``Lambda`` of one layer as ``gpflow.Parameter``s whose
transforms keep O&A's Adam re-scaling (App. H): the optimiser sees ``log Lambda / rho``.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
from check_shapes import check_shapes

from ..linalg import add_jitter, cholesky_with_inverse, safe_cholesky
from ..validation import check_choice, check_finite_array, check_positive_float

__all__ = [
    "PRECISIONS",
    "PseudoData",
    "rescaled_log_transform",
    "pseudo_data_posterior",
    "gram_posterior",
    "gram_statistics",
    "gram_draw",
    "PosteriorDraw",
    "sample_weights",
    "log_ratio",
    "analytic_kl",
    "WeightDraw",
    "draw_weights",
    "marginal_variance",
    "regulariser",
    "StackedPosterior",
    "stacked_factors",
    "stacked_posterior",
    "stacked_analytic_kl",
    "KL_MODES",
    "LAST_LAYER_MODES",
]

#: Parameterisations of ``Lambda``: a full ``R R^T`` shared by the units, one diagonal per unit,
#: or one diagonal shared by the units.
PRECISIONS = ("full", "diagonal", "shared_diagonal")

#: The regulariser of an inducing layer: ``"sampled"`` (``-`` :func:`log_ratio` of the drawn
#: weights) or ``"analytic"`` (:func:`analytic_kl`).
KL_MODES = ("sampled", "analytic")

#: A global-inducing last layer: ``"marginal"`` (its weights integrated out of the ELBO, with
#: :func:`marginal_variance` and :func:`analytic_kl`) or ``"sampled"`` (drawn per sample).
LAST_LAYER_MODES = ("marginal", "sampled")


def rescaled_log_transform(rho: float, dtype=None) -> tfp.bijectors.Bijector:
    """``x = exp(rho * y)``: a positive parameter whose unconstrained value is ``log(x) / rho``
    (``dtype``: GPflow's default float unless given)."""
    rho = tf.constant(rho, dtype=dtype or gpflow.default_float())
    return tfp.bijectors.Chain([tfp.bijectors.Exp(), tfp.bijectors.Scale(rho)])


def _rescaled_log_parameter(log_value: np.ndarray, rho: float, name: str) -> gpflow.Parameter:
    """A positive ``gpflow.Parameter`` ``exp(log_value)`` under :func:`rescaled_log_transform`,
    set through its unconstrained value ``log_value / rho`` (so ``exp`` may underflow)."""
    log_value = np.asarray(log_value, dtype=np.float64)
    param = gpflow.Parameter(
        np.ones(log_value.shape, dtype=gpflow.default_float()),
        transform=rescaled_log_transform(rho),
        name=name,
    )
    param.unconstrained_variable.assign(log_value / rho)
    return param


class PseudoData(gpflow.Module):
    """Pseudo-outputs ``V`` ``[M, P]`` and noise precisions ``Lambda`` of one layer.

    :param pseudo_outputs: initial ``V`` ``[M, P]``.
    :param precision: ``"full"`` (``Lambda = R R^T`` with ``R = sqrt(precision_scale)
        precision_shape / mean(diag precision_shape)``, shared by the units), ``"diagonal"``
        (``precision`` ``[P, M]``, one diagonal per unit) or ``"shared_diagonal"``
        (``precision`` ``[1, M]``).
    :param log_precision_init: ``log Lambda`` at initialisation: a number (``Lambda = e^x I``) or,
        for the diagonal kinds, an array of the ``precision`` shape.
    :param rho: the optimiser sees ``log Lambda / rho`` (``log(precision_scale) / (2 rho)`` for
        ``"full"``), O&A's re-scaling; 3 by default.
    """

    def __init__(
        self,
        pseudo_outputs,
        precision: str = "full",
        log_precision_init=0.0,
        rho: float = 3.0,
        name: Optional[str] = None,
    ):
        super().__init__(name=name)
        self.kind = check_choice(precision, "precision", PRECISIONS)
        self.rho = check_positive_float(rho, "rho")
        V = check_finite_array(pseudo_outputs, "pseudo_outputs", ndim=2)
        M, P = V.shape
        dtype = gpflow.default_float()
        self.pseudo_outputs = gpflow.Parameter(V.astype(dtype), name="pseudo_outputs")
        lp = np.asarray(log_precision_init, dtype=np.float64)
        if self.kind == "full":
            if lp.ndim != 0:
                raise ValueError("log_precision_init must be a number for precision='full'")
            self.precision_shape = gpflow.Parameter(np.eye(M, dtype=dtype), name="precision_shape")
            self.precision_scale = _rescaled_log_parameter(lp, 2.0 * self.rho, "precision_scale")
        else:
            Q = P if self.kind == "diagonal" else 1
            if lp.ndim == 0:
                lp = np.full((Q, M), float(lp))
            if lp.shape != (Q, M) or not np.all(np.isfinite(lp)):
                raise ValueError(
                    f"log_precision_init must be a finite number or have shape {(Q, M)}, got "
                    f"{lp.shape}"
                )
            self.precision = _rescaled_log_parameter(lp, self.rho, "precision")

    @property
    def num_inducing(self) -> int:
        return int(self.pseudo_outputs.shape[0])

    @property
    def num_units(self) -> int:
        return int(self.pseudo_outputs.shape[1])

    def factor(self) -> tf.Tensor:
        """``R`` ``[M, M]`` with ``Lambda = R R^T`` (``precision="full"`` only)."""
        if self.kind != "full":
            raise AttributeError(f"factor needs precision='full', this layer has {self.kind!r}")
        R = self.precision_shape
        return tf.sqrt(self.precision_scale) * R / tf.reduce_mean(tf.linalg.diag_part(R))

    def diagonal(self) -> tf.Tensor:
        """``[Q, M]`` diagonal precisions (``Q = P`` for "diagonal", 1 for "shared_diagonal")."""
        if self.kind == "full":
            raise AttributeError("diagonal is not defined for precision='full'; use factor")
        return tf.convert_to_tensor(self.precision)

    def matrix(self) -> tf.Tensor:
        """``Lambda`` as dense matrices: ``[M, M]`` (full) or ``[Q, M, M]`` (diagonal kinds)."""
        if self.kind == "full":
            R = self.factor()
            return tf.linalg.matmul(R, R, transpose_b=True)
        return tf.linalg.diag(self.diagonal())

    def set_log_precision(self, log_precision: float) -> None:
        """Assign ``Lambda = exp(log_precision) I`` (initialisation and tests; through the
        unconstrained value, so a log-precision far below the float range works too)."""
        if self.kind == "full":
            self.precision_shape.assign(np.eye(self.num_inducing))
            self.precision_scale.unconstrained_variable.assign(log_precision / (2.0 * self.rho))
        else:
            self.precision.unconstrained_variable.assign(
                np.full(self.precision.shape, log_precision / self.rho)
            )

    def posterior(
        self,
        features: tf.Tensor,
        prior_precision: Optional[tf.Tensor] = None,
        factor: Optional[tf.Tensor] = None,
    ):
        """:func:`pseudo_data_posterior` of this layer's pseudo-data on ``features`` ``[S, M, D]``;
        ``factor``: :meth:`factor`'s value where the caller has it (:func:`stacked_factors`)."""
        return gram_posterior(*self._statistics(features, factor), prior_precision)

    def draw(
        self,
        features: tf.Tensor,
        z: tf.Tensor,
        with_mean: bool = False,
        factor: Optional[tf.Tensor] = None,
    ) -> "PosteriorDraw":
        """:func:`gram_draw` of this layer's pseudo-data on ``features`` ``[S, M, D]`` (prior
        precision 1) with noise ``z`` ``[S, D, P]``; ``factor`` as in :meth:`posterior`."""
        return gram_draw(*self._statistics(features, factor), z, with_mean)

    def _statistics(
        self, features: tf.Tensor, factor: Optional[tf.Tensor]
    ) -> Tuple[tf.Tensor, tf.Tensor]:
        V = tf.convert_to_tensor(self.pseudo_outputs)
        if self.kind == "full":
            return gram_statistics(
                features, V, full_factor=self.factor() if factor is None else factor
            )
        return gram_statistics(features, V, diag_precision=self.diagonal())


# ====================================================================================== maths


def _solve(L: tf.Tensor, rhs: tf.Tensor, adjoint: bool) -> tf.Tensor:
    """Solve ``L x = rhs`` (or ``L^T x = rhs``) for ``rhs`` ``[S, D, P]``.

    ``L`` is ``[S, D, D]`` (shared by the P columns) or ``[S, P, D, D]`` (one per column); the
    branch is on the static rank, never on values.
    """
    if L.shape.rank == 3:
        return tf.linalg.triangular_solve(L, rhs, lower=True, adjoint=adjoint)
    rhs_t = tf.expand_dims(tf.linalg.matrix_transpose(rhs), -1)  # [S, P, D, 1]
    x = tf.linalg.triangular_solve(L, rhs_t, lower=True, adjoint=adjoint)
    return tf.linalg.matrix_transpose(tf.squeeze(x, -1))


def _apply(T: tf.Tensor, rhs: tf.Tensor, adjoint: bool) -> tf.Tensor:
    """``T rhs`` (or ``T^T rhs``) for ``rhs`` ``[S, D, P]``, with ``T`` ``[S, D, D]`` (shared by the
    P columns) or ``[S, P, D, D]`` (one per column): :func:`_solve`'s layouts, by products with the
    inverse factor ``T = L^{-1}``."""
    if T.shape.rank == 3:
        return tf.linalg.matmul(T, rhs, adjoint_a=adjoint)
    return tf.linalg.matrix_transpose(
        tf.linalg.matvec(T, tf.linalg.matrix_transpose(rhs), adjoint_a=adjoint)
    )


def _unit_precision_factor(G: tf.Tensor):
    """``(L, L^{-1})`` of ``I + G`` (prior precision 1: eigenvalues >= 1, so no jitter ladder)."""
    return cholesky_with_inverse(
        add_jitter(G, tf.ones([], G.dtype)), max_tries=0, name="pseudo-data posterior precision"
    )


def _units_logdet(L: tf.Tensor, num_units) -> tf.Tensor:
    """``sum_units log|L|`` ``[S]``: ``P log|L|`` if shared, else the sum over the units."""
    logdiag = tf.math.log(tf.abs(tf.linalg.diag_part(L)))
    if L.shape.rank == 3:
        return tf.cast(num_units, L.dtype) * tf.reduce_sum(logdiag, axis=-1)
    return tf.reduce_sum(logdiag, axis=[-2, -1])


@check_shapes(
    "features: [S, M, D]",
    "V: [M, P]",
    "prior_precision: [S, prior_shape...]",
    "full_factor: [M, M]",
    "diag_precision: [Q, M]",
    "return[1]: [S, D, P]",
)
def pseudo_data_posterior(
    features: tf.Tensor,
    V: tf.Tensor,
    prior_precision: Optional[tf.Tensor] = None,
    full_factor: Optional[tf.Tensor] = None,
    diag_precision: Optional[tf.Tensor] = None,
) -> Tuple[tf.Tensor, tf.Tensor]:
    """Bayesian linear regression of ``V`` on ``features`` with noise precisions ``Lambda``.

    ``Lambda`` is given either as ``full_factor`` R (``Lambda = R R^T``, shared by the units) or as
    ``diag_precision`` ``[Q, M]`` (``Q = 1``: shared by the units; ``Q = P``: one per unit).

    :param features: ``Phi`` ``[S, M, D]``: ``L_K`` in function space, ``Phi(U)`` in weight space.
    :param V: pseudo-outputs ``[M, P]``.
    :param prior_precision: ``p`` per sample ``[S]`` (``p I``) or a full precision ``[S, D, D]``;
        ``None`` means 1 (function space).
    :return: ``(L, mean)``: ``L = chol(p I + Phi^T Lambda Phi)``, ``[S, D, D]`` if ``Lambda`` is
        shared and ``[S, P, D, D]`` per unit, and ``mean = Prec^{-1} Phi^T Lambda V`` ``[S, D, P]``.
    """
    return gram_posterior(
        *gram_statistics(features, V, full_factor, diag_precision), prior_precision
    )


@check_shapes(
    "features: [S, M, D]",
    "V: [M, P]",
    "full_factor: [M, M]",
    "diag_precision: [Q, M]",
    "return[1]: [S, D, P]",
)
def gram_statistics(
    features: tf.Tensor,
    V: tf.Tensor,
    full_factor: Optional[tf.Tensor] = None,
    diag_precision: Optional[tf.Tensor] = None,
) -> Tuple[tf.Tensor, tf.Tensor]:
    """The sufficient statistics ``(G, rhs)`` of :func:`pseudo_data_posterior`: ``G = Phi^T
    Lambda Phi`` (``[S, D, D]``, or ``[S, P, D, D]`` per unit) and ``rhs = Phi^T Lambda V``
    ``[S, D, P]``; arguments as there."""
    if (full_factor is None) == (diag_precision is None):
        raise ValueError("give exactly one of full_factor and diag_precision")
    Phi = features
    S, M, D = tf.shape(Phi)[0], tf.shape(Phi)[1], tf.shape(Phi)[2]
    # The sample-free operands get a batch axis of 1: a product whose batch shapes differ reduces
    # its gradients over the broadcast axes (two more ops), one whose shapes agree (S = 1) does not.
    if full_factor is not None:
        C = tf.linalg.matmul(
            tf.expand_dims(full_factor, 0), Phi, transpose_a=True
        )  # R^T Phi  [S, M, D]
        G = tf.linalg.matmul(C, C, transpose_a=True)  # [S, D, D]
        RV = tf.expand_dims(tf.linalg.matmul(full_factor, V, transpose_a=True), 0)  # [1, M, P]
        rhs = tf.linalg.matmul(C, RV, transpose_a=True)
    elif diag_precision.shape[0] == 1:
        lam = tf.reshape(diag_precision, [-1, 1])  # [M, 1]
        C = tf.sqrt(lam) * Phi
        G = tf.linalg.matmul(C, C, transpose_a=True)  # [S, D, D]
        rhs = tf.linalg.matmul(Phi, tf.expand_dims(lam * V, 0), transpose_a=True)  # [S, D, P]
    else:
        # Per-unit Gram matrices as one GEMM over the flattened outer products phi_m phi_m^T
        # (one large product, forward and backward, in place of a per-unit batched product).
        outer = tf.reshape(
            tf.expand_dims(Phi, -1) * tf.expand_dims(Phi, -2), tf.stack([S, M, D * D])
        )
        lam = tf.broadcast_to(
            diag_precision, tf.concat([[S], tf.shape(diag_precision)], 0)
        )  # [S, P, M]
        G = tf.reshape(tf.linalg.matmul(lam, outer), tf.stack([S, -1, D, D]))  # [S, P, D, D]
        rhs = tf.linalg.matmul(
            Phi, tf.expand_dims(tf.linalg.matrix_transpose(diag_precision) * V, 0), transpose_a=True
        )
    return G, rhs


def _is_matrix(prior_precision: Optional[tf.Tensor]) -> bool:
    return prior_precision is not None and len(prior_precision.shape) == 3


def gram_posterior(
    G: tf.Tensor, rhs: tf.Tensor, prior_precision: Optional[tf.Tensor] = None
) -> Tuple[tf.Tensor, tf.Tensor]:
    """The regression posterior from its sufficient statistics: ``L = chol(prior + G)`` and
    ``mean = (prior + G)^{-1} rhs`` (prior precision 1: by products with ``L^{-1}``, see the
    module docs; else by two triangular solves).

    :param G: ``Phi^T Lambda Phi``, ``[S, D, D]`` (shared by the units) or ``[S, P, D, D]``.
    :param rhs: ``Phi^T Lambda V`` ``[S, D, P]``.
    :param prior_precision: ``None`` (1), ``[S]`` (``p I``) or a full ``[S, D, D]`` precision
        (e.g. the spatial inverse-Wishart prior of a convolution).
    """
    # diagonals are added (add_jitter), not set: the gradient of tf.linalg.set_diag on a run-time
    # batch shape runs three tf.conds (functional If ops) per call
    if prior_precision is None:
        L, T = _unit_precision_factor(G)
        return L, _apply(T, _apply(T, rhs, adjoint=False), adjoint=True)
    S = tf.shape(G)[0]
    if _is_matrix(prior_precision):
        P = prior_precision if G.shape.rank == 3 else tf.expand_dims(prior_precision, 1)
        prec = G + P
    else:
        p = tf.reshape(prior_precision, tf.concat([[S], tf.ones([G.shape.rank - 3], tf.int32)], 0))
        prec = add_jitter(G, p)  # p: [S] or [S, 1] against the batch shape [S] or [S, P]
    L = safe_cholesky(prec, name="pseudo-data posterior precision")
    mean = _solve(L, _solve(L, rhs, adjoint=False), adjoint=True)
    return L, mean


class PosteriorDraw(NamedTuple):
    """What :func:`gram_draw` returns.

    :ivar factor: ``L = chol(I + G)``, as :func:`gram_posterior`'s.
    :ivar mean: the posterior mean ``[S, D, P]`` if asked for, else None.
    :ivar weights: the draw ``mean + L^{-T} z`` ``[S, D, P]``.
    :ivar inverse: ``L^{-1}``, the layout of ``factor`` (for :func:`analytic_kl` and
        :func:`marginal_variance` without a solve).
    """

    factor: tf.Tensor
    mean: Optional[tf.Tensor]
    weights: tf.Tensor
    inverse: Optional[tf.Tensor] = None


def gram_draw(G: tf.Tensor, rhs: tf.Tensor, z: tf.Tensor, with_mean: bool = False) -> PosteriorDraw:
    """:func:`gram_posterior` (prior precision 1) and the draw of :func:`sample_weights`, the draw
    computed as ``L^{-T} (L^{-1} rhs + z)`` by products with ``L^{-1}`` (module docs): one
    triangular solve (the inverse) whatever is asked; ``with_mean`` (the analytic KL, a marginal
    last layer) adds the mean, with the same values as :func:`gram_posterior`'s."""
    L, T = _unit_precision_factor(G)
    whitened = _apply(T, rhs, adjoint=False)  # L^{-1} rhs
    mean = _apply(T, whitened, adjoint=True) if with_mean else None
    return PosteriorDraw(L, mean, _apply(T, whitened + z, adjoint=True), T)


def _log_prior_weights(w: tf.Tensor, prior_precision: tf.Tensor) -> tf.Tensor:
    """``sum_units log N(w_unit; 0, P^{-1})`` without the ``2 pi`` terms, ``[S]``; ``P`` is
    ``[S]`` (times ``I``) or ``[S, D, D]``."""
    P = tf.shape(w)[-1]
    if _is_matrix(prior_precision):
        L_P = safe_cholesky(prior_precision, name="weight prior precision")
        quad = tf.reduce_sum(tf.square(tf.linalg.matmul(L_P, w, transpose_a=True)), axis=[-2, -1])
        logdet = 2.0 * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(L_P)), axis=-1)
        return -0.5 * quad + 0.5 * tf.cast(P, w.dtype) * logdet
    w2 = tf.reduce_sum(tf.square(w), axis=[-2, -1])
    numel = tf.cast(tf.shape(w)[-2] * P, w.dtype)
    return -0.5 * prior_precision * w2 + 0.5 * numel * tf.math.log(prior_precision)


@check_shapes(
    "mean: [S, D, P]",
    "z: [S, D, P]",
    "return: [S, D, P]",
)
def sample_weights(L: tf.Tensor, mean: tf.Tensor, z: tf.Tensor) -> tf.Tensor:
    """``w = mean + L^{-T} z`` (``z ~ N(0, I)``), so ``w ~ N(mean, Prec^{-1})``."""
    return mean + _solve(L, z, adjoint=True)


@check_shapes(
    "w: [S, D, P]",
    "z: [S, D, P]",
    "prior_precision: [S, prior_shape...]",
    "return: [S]",
)
def log_ratio(
    L: tf.Tensor, w: tf.Tensor, z: tf.Tensor, prior_precision: Optional[tf.Tensor] = None
) -> tf.Tensor:
    """``log p(w) - log q(w)`` per sample for ``w`` drawn by :func:`sample_weights` from ``z``.

    ``1/2 |z|^2 - p/2 |w|^2 + DP/2 log p - sum_units log|L|`` (the ``2 pi`` terms cancel; in
    function space ``p = 1`` and the ``log|L_K|`` terms of P and Q cancel too). A full prior
    precision ``[S, D, D]`` gives ``-1/2 w^T P w + 1/2 log|P|`` per unit instead.
    """
    quad = 0.5 * tf.reduce_sum(tf.square(z), axis=[-2, -1])
    if prior_precision is None:
        log_p = -0.5 * tf.reduce_sum(tf.square(w), axis=[-2, -1])
    else:
        log_p = _log_prior_weights(w, prior_precision)
    return quad + log_p - _units_logdet(L, tf.shape(w)[-1])


@check_shapes(
    "mean: [S, D, P]",
    "prior_precision: [S, prior_shape...]",
    "return: [S]",
)
def analytic_kl(
    L: tf.Tensor,
    mean: tf.Tensor,
    prior_precision: Optional[tf.Tensor] = None,
    inverse: Optional[tf.Tensor] = None,
) -> tf.Tensor:
    """``KL(q(w) || N(0, p^{-1} I))`` summed over the units, per sample ``[S]``.

    Per unit: ``1/2 [p tr Prec^{-1} + p |mean|^2 - D - D log p + log|Prec|]`` with
    ``tr Prec^{-1} = |L^{-1}|_F^2`` (from ``inverse``, ``L^{-1}``, when given: no solve). It is the
    expectation of ``-`` :func:`log_ratio`.
    """
    dtype = mean.dtype
    D, P = tf.shape(mean)[-2], tf.shape(mean)[-1]
    if inverse is None:
        inverse = tf.linalg.triangular_solve(
            L, tf.eye(D, batch_shape=tf.shape(L)[:-2], dtype=dtype), lower=True
        )
    trace = tf.reduce_sum(tf.square(inverse), axis=[-2, -1])
    trace = tf.cast(P, dtype) * trace if L.shape.rank == 3 else tf.reduce_sum(trace, axis=-1)
    mahal = tf.reduce_sum(tf.square(mean), axis=[-2, -1])
    numel = tf.cast(D * P, dtype)
    if _is_matrix(prior_precision):
        # per unit: tr(P Prec^{-1}) = |L^{-1} L_P|_F^2, mean^T P mean = |L_P^T mean|^2, log|P|.
        L_P = safe_cholesky(prior_precision, name="weight prior precision")
        rhs = L_P if L.shape.rank == 3 else tf.expand_dims(L_P, 1)
        trace_p = tf.reduce_sum(
            tf.square(tf.linalg.triangular_solve(L, rhs, lower=True)), axis=[-2, -1]
        )
        trace_p = (
            tf.cast(P, dtype) * trace_p if L.shape.rank == 3 else tf.reduce_sum(trace_p, axis=-1)
        )
        mahal_p = tf.reduce_sum(
            tf.square(tf.linalg.matmul(L_P, mean, transpose_a=True)), axis=[-2, -1]
        )
        logdet_p = 2.0 * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(L_P)), axis=-1)
        quad = trace_p + mahal_p - numel - tf.cast(P, dtype) * logdet_p
        return 0.5 * quad + _units_logdet(L, P)
    if prior_precision is None:
        quad = trace + mahal - numel
    else:
        p = prior_precision
        quad = p * (trace + mahal) - numel - numel * tf.math.log(p)
    return 0.5 * quad + _units_logdet(L, P)


class WeightDraw(NamedTuple):
    """What :func:`draw_weights` returns.

    :ivar weights: ``w ~ q(w)`` ``[S, D, P]``.
    :ivar log_ratio: ``log p(w) - log q(w)`` ``[S]``.
    :ivar kl: the analytic ``KL(q || p)`` ``[S]`` if asked for, else None.
    """

    weights: tf.Tensor
    log_ratio: tf.Tensor
    kl: Optional[tf.Tensor]


def draw_weights(
    L: tf.Tensor,
    mean: tf.Tensor,
    z: tf.Tensor,
    prior_precision: Optional[tf.Tensor] = None,
    analytic: bool = False,
) -> WeightDraw:
    """A sampled layer of any inducing family: the weights drawn from ``z`` by
    :func:`sample_weights`, their :func:`log_ratio` and, if ``analytic``, the :func:`analytic_kl`
    (the pair :func:`regulariser` chooses from). ``prior_precision`` as in :func:`log_ratio`."""
    w = sample_weights(L, mean, z)
    kl = analytic_kl(L, mean, prior_precision) if analytic else None
    return WeightDraw(w, log_ratio(L, w, z, prior_precision), kl)


def regulariser(log_ratio_term: tf.Tensor, kl: Optional[tf.Tensor]) -> tf.Tensor:
    """The ELBO's regulariser of one layer ``[S]``: the analytic KL if there is one, else ``-``
    the sampled log-ratio (:func:`log_ratio`)."""
    return -log_ratio_term if kl is None else kl


@check_shapes(
    "A: [S, D, N]",
    "return: [S, N, P]",
)
def marginal_variance(
    L: tf.Tensor, A: tf.Tensor, num_units: int, inverse: Optional[tf.Tensor] = None
) -> tf.Tensor:
    """``diag(A^T Prec^{-1} A)`` per unit: the variance ``f = A^T w`` gets from ``q(w)``,
    ``[S, N, P]`` (``|L^{-1} A|^2``: a product with ``inverse``, ``L^{-1}``, when given, else a
    solve)."""
    if L.shape.rank == 3:
        X = (
            tf.linalg.triangular_solve(L, A, lower=True)
            if inverse is None
            else tf.linalg.matmul(inverse, A)
        )
        v = tf.reduce_sum(tf.square(X), axis=-2)  # [S, N]
        return tf.repeat(tf.expand_dims(v, -1), num_units, axis=-1)
    A = tf.expand_dims(A, 1)
    X = (
        tf.linalg.triangular_solve(L, A, lower=True)
        if inverse is None
        else tf.linalg.matmul(inverse, A)
    )  # [S, P, D, N]
    return tf.linalg.matrix_transpose(tf.reduce_sum(tf.square(X), axis=-2))


# ====================================================================== layers as one stack


class StackedPosterior(NamedTuple):
    """The function-space pseudo-data posteriors of L layers with equal ``M``, as one stack
    (:func:`stacked_posterior`).

    :ivar factors: ``L_B = chol(I + L_K^T Lambda L_K)`` ``[L, M, M]``.
    :ivar inverse_factors: ``L_B^{-1}`` ``[L, M, M]``.
    :ivar means: per layer, the whitened mean ``B^{-1} L_K^T Lambda V`` ``[M, P_l]``.
    :ivar num_units: per layer, ``P_l``.
    """

    factors: tf.Tensor
    inverse_factors: tf.Tensor
    means: List[tf.Tensor]
    num_units: Tuple[int, ...]


def stacked_factors(pseudo_data: Sequence[PseudoData]) -> tf.Tensor:
    """Every layer's :meth:`PseudoData.factor` ``R`` as one stack ``[L, M, M]`` (``"full"``
    precisions of equal ``M``): the normalisation by the mean diagonal runs once over the stack,
    as a scalar per layer (``sqrt(scale) / mean(diag R)``, then one product), not per layer."""
    shapes = tf.stack([tf.convert_to_tensor(pd.precision_shape) for pd in pseudo_data])  # [L, M, M]
    scales = tf.stack([tf.convert_to_tensor(pd.precision_scale) for pd in pseudo_data])  # [L]
    coefficient = tf.sqrt(scales) / tf.reduce_mean(tf.linalg.diag_part(shapes), axis=-1)
    return shapes * tf.expand_dims(tf.expand_dims(coefficient, -1), -1)


def stacked_posterior(pseudo_data: Sequence[PseudoData], features: tf.Tensor) -> StackedPosterior:
    """:func:`pseudo_data_posterior` of L function-space layers at once (prior precision 1).

    Every layer's pseudo-data has ``precision="full"`` and the same ``M``; ``features`` is the
    stack of their ``L_K`` ``[L, M, M]`` (fixed inducing inputs: no sample axis). The Gram
    matrices, their factorisation, the factors' inverses and the maps ``B^{-1} C^T R^T`` from the
    pseudo-outputs to the means are batched over the layers; only the products with each layer's
    ``V`` ``[M, P_l]`` (widths differ) are per layer.

    The inverse ``L_B^{-1}`` is one triangular solve against ``I`` (the analytic KL's trace needs
    it anyway; :func:`~deepgp_gi.linalg.cholesky_with_inverse`, whose gradient solves nothing); the
    means use it by products instead of two solves per layer. ``B = I + ...`` has eigenvalues >= 1,
    so ``|L_B^{-1}| <= 1``, the products are as accurate as the solves, and the factorisation needs
    no jitter ladder.
    """
    dtype = features.dtype
    num_layers = len(pseudo_data)
    R = stacked_factors(pseudo_data)  # [L, M, M]
    C = tf.linalg.matmul(R, features, transpose_a=True)  # R^T L_K
    prec = add_jitter(tf.linalg.matmul(C, C, transpose_a=True), tf.ones([], dtype))  # I + C^T C
    L, T = cholesky_with_inverse(
        prec, max_tries=0, name="pseudo-data posterior precision (stacked layers)"
    )
    # B^{-1} C^T R^T = T^T (T C^T) R^T, batched; each layer's mean is this map applied to its V
    maps = tf.linalg.matmul(
        tf.linalg.matmul(T, tf.linalg.matmul(T, C, transpose_b=True), transpose_a=True),
        R,
        transpose_b=True,
    )
    means = [
        tf.linalg.matmul(m, tf.convert_to_tensor(pd.pseudo_outputs))
        for m, pd in zip(tf.unstack(maps, num=num_layers), pseudo_data)
    ]
    return StackedPosterior(L, T, means, tuple(pd.num_units for pd in pseudo_data))


def stacked_analytic_kl(posterior: StackedPosterior) -> tf.Tensor:
    """The sum over the layers of :func:`analytic_kl` (scalar): the traces ``|L_B^{-1}|_F^2``
    and log-determinants as one reduction each over the stack, weighted by the layers' widths."""
    L, T = posterior.factors, posterior.inverse_factors
    dtype = L.dtype
    M = L.shape[-1]
    units = tf.constant(posterior.num_units, dtype)  # [L]
    trace = tf.reduce_sum(tf.square(T), axis=[-2, -1])  # [L]
    logdet = tf.reduce_sum(tf.math.log(tf.abs(tf.linalg.diag_part(L))), axis=-1)  # [L]
    mahal = tf.add_n([tf.reduce_sum(tf.square(m)) for m in posterior.means])
    numel = float(M * sum(posterior.num_units))
    return 0.5 * (tf.reduce_sum(units * trace) + mahal - numel) + tf.reduce_sum(units * logdet)
