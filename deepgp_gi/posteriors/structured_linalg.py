"""The linear algebra of the fully-coupled and STAR posteriors (Lindinger et al. 2020).

Pure functions of tensors, shared by :mod:`.structured` (the shared base and the fully-coupled
family) and :mod:`.stripes_arrow` (STAR): the incremental Cholesky factor of the layer outputs'
covariance per data point (:func:`whiten_cross_covariance`, :func:`append_to_cholesky`) and its
inverse (:func:`whiten_by_inverse`, :func:`append_to_inverse`), the block-wise KL terms, the
per-layer kernel quantities of Theorem 1 (:func:`layer_terms`), and the custom-gradient products
the two families' steps use.

The two families' steps carry the per-point factor's *inverse*, not the factor: conditioning on
the earlier layers is then a batched product, and the per-point factorisations are elementwise
(:func:`~deepgp_gi.linalg.cholesky_with_inverse` with ``unrolled=True``), so that no Cholesky or
triangular-solve kernel runs per data point and a step's operations do not grow with the batch
on any device.

Shapes: ``S`` samples, ``N`` data points, ``M`` inducing points, ``K`` the size of a factor.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence

import tensorflow as tf
from check_shapes import check_shapes

from ..layers import GPLayer
from .conditionals import inducing_cholesky, residual_variance, whitened_projection

__all__ = [
    "whiten_cross_covariance",
    "whiten_transposed_cross",
    "append_to_cholesky",
    "whiten_by_inverse",
    "append_to_inverse",
    "blockwise_kl_terms",
    "LayerTerms",
    "layer_terms",
    "with_diagonal",
    "project_rows",
    "squared_norms",
    "dots",
    "block_dots",
    "half_squared_norm",
    "gram_and_copy",
    "draw_and_copy",
    "project_rows_and_means",
]


@check_shapes(
    "chol: [batch..., K, K]",
    "cross: [batch..., P, K]",
    "eps: [batch..., K]",
    "return[0]: [batch..., P, K]",
    "return[1]: [batch..., P]",
)
def whiten_cross_covariance(chol: tf.Tensor, cross: tf.Tensor, eps: tf.Tensor):
    """The conditioning step of Theorem 1 (B2) given a Cholesky factor of the earlier block.

    With ``chol = chol(S_prev)`` of the earlier outputs' covariance, ``cross`` the covariance
    ``C`` between the new outputs and the earlier ones, and the earlier outputs written as
    ``f_prev = mu_prev + chol @ eps``, returns

    * ``G = C chol^{-T}`` ``[batch..., P, K]`` (so that ``C S_prev^{-1} C^T = G G^T``), and
    * ``G @ eps`` ``[batch..., P]``, which equals ``C S_prev^{-1} (f_prev - mu_prev)``, the shift
      of the conditional mean.

    The conditional covariance of the new outputs is ``S_new - G G^T``. One triangular solve,
    no inverse.
    """
    Gt, shift = whiten_transposed_cross(chol, tf.linalg.matrix_transpose(cross), eps)
    return tf.linalg.matrix_transpose(Gt), shift


def whiten_transposed_cross(chol: tf.Tensor, cross_t: tf.Tensor, eps: tf.Tensor):
    """:func:`whiten_cross_covariance` from the transposed cross-covariance ``C^T``
    ``[batch..., K, P]``: returns ``G^T = chol^{-1} C^T`` ``[batch..., K, P]`` and the shift
    ``G eps`` ``[batch..., P]``. The posteriors form ``C^T`` directly and use ``G^T`` through
    transposed products, which saves the two transposes (and their gradients)."""
    Gt = tf.linalg.triangular_solve(chol, cross_t, lower=True)
    return Gt, tf.linalg.matvec(Gt, eps, adjoint_a=True)


@check_shapes(
    "chol: [batch..., K, K]",
    "G: [batch..., P, K]",
    "chol_new: [batch..., P, P]",
    "return: [batch..., KP, KP]",
)
def append_to_cholesky(chol: tf.Tensor, G: tf.Tensor, chol_new: tf.Tensor) -> tf.Tensor:
    """``[[chol, 0], [G, chol_new]]``: the Cholesky factor grown by ``P`` rows (``KP = K + P``).

    If ``chol = chol(A)``, ``G = C chol^{-T}`` and ``chol_new = chol(B - G G^T)``, the result is
    the Cholesky factor of ``[[A, C^T], [C, B]]``; nothing is refactorised.
    """
    return _block_lower_triangular(chol, G, chol_new)


def _block_lower_triangular(
    top_left: tf.Tensor, lower_left: tf.Tensor, lower_right: tf.Tensor
) -> tf.Tensor:
    """``[[top_left, 0], [lower_left, lower_right]]`` ``[batch..., K + P, K + P]`` from
    ``[batch..., K, K]``, ``[batch..., P, K]`` and ``[batch..., P, P]`` blocks."""
    zeros = tf.zeros_like(tf.linalg.matrix_transpose(lower_left))  # [..., K, P]
    top = tf.concat([top_left, zeros], axis=-1)
    bottom = tf.concat([lower_left, lower_right], axis=-1)
    return tf.concat([top, bottom], axis=-2)


@check_shapes(
    "inverse: [batch..., K, K]",
    "cross_t: [batch..., K, P]",
    "eps: [batch..., K]",
    "return[0]: [batch..., K, P]",
    "return[1]: [batch..., P]",
)
def whiten_by_inverse(inverse: tf.Tensor, cross_t: tf.Tensor, eps: tf.Tensor):
    """:func:`whiten_transposed_cross` given the factor's inverse ``chol^{-1}``
    (:func:`append_to_inverse`): ``G^T = chol^{-1} C^T`` ``[batch..., K, P]`` by a batched product
    instead of a triangular solve, and the shift ``G eps`` ``[batch..., P]``."""
    Gt = tf.linalg.matmul(inverse, cross_t)
    return Gt, tf.linalg.matvec(Gt, eps, adjoint_a=True)


@check_shapes(
    "inverse: [batch..., K, K]",
    "Gt: [batch..., K, P]",
    "inverse_new: [batch..., P, P]",
    "return: [batch..., KP, KP]",
)
def append_to_inverse(
    inverse: tf.Tensor, Gt: Optional[tf.Tensor], inverse_new: tf.Tensor
) -> tf.Tensor:
    """The inverse of :func:`append_to_cholesky`'s grown factor ``[[chol, 0], [G, chol_new]]``
    from ``inverse = chol^{-1}``, ``G^T`` (``Gt``, as :func:`whiten_by_inverse` returns it; None
    for ``G = 0``) and ``inverse_new = chol_new^{-1}``:
    ``[[chol^{-1}, 0], [-chol_new^{-1} G chol^{-1}, chol_new^{-1}]]`` (``KP = K + P``); two
    products, nothing inverted."""
    if Gt is None:
        lower_left = tf.zeros(
            tf.concat([tf.shape(inverse_new)[:-1], tf.shape(inverse)[-1:]], 0), inverse.dtype
        )
    else:
        lower_left = -tf.linalg.matmul(inverse_new, tf.linalg.matmul(Gt, inverse, transpose_a=True))
    return _block_lower_triangular(inverse, lower_left, inverse_new)


@check_shapes(
    "prior_chol: [M, M]",
    "mu: [U, M]",
    "rows: [B, M, W]",
    "return: []",
)
def blockwise_kl_terms(
    prior_chol: Optional[tf.Tensor], mu: tf.Tensor, rows: tf.Tensor
) -> tf.Tensor:
    """The prior-dependent KL terms of ``U`` units that share the prior ``N(0, L_K L_K^T)``.

    Returns ``U * sum log diag L_K + 1/2 ||L_K^{-1} rows||_F^2 + 1/2 sum_u ||L_K^{-1} mu_u||^2``,
    where ``rows`` holds the (non-zero) ``M x W`` blocks of those units' rows of ``R`` — any
    split of the rows into blocks gives the same Frobenius norm. ``prior_chol=None`` means the
    whitened prior ``N(0, I)`` (``L_K = I``). Adding ``-TM/2 - sum log|diag R|`` over all units
    gives ``KL(N(mu_M, R R^T) || prod_l N(0, I ⊗ K_uu^l))`` (docs/algorithms.md,
    "KL, block by block").
    """
    mu_t = tf.linalg.matrix_transpose(mu)  # [M, U]
    rows_m = tf.reshape(tf.transpose(rows, [1, 0, 2]), [tf.shape(rows)[1], -1])  # [M, B*W]
    if prior_chol is None:
        return 0.5 * tf.reduce_sum(tf.square(rows_m)) + 0.5 * tf.reduce_sum(tf.square(mu_t))
    num_units = tf.cast(tf.shape(mu)[0], mu.dtype)
    rhs = tf.concat([mu_t, rows_m], axis=-1)
    solved = tf.linalg.triangular_solve(prior_chol, rhs, lower=True)
    log_det = tf.reduce_sum(tf.math.log(tf.abs(tf.linalg.diag_part(prior_chol))))
    return num_units * log_det + 0.5 * tf.reduce_sum(tf.square(solved))


# --------------------------------------------------------------------------- per-layer kernel terms
class LayerTerms(NamedTuple):
    prior_chol: tf.Tensor  # [M, M]  L_K = chol(K_uu + jitter)
    A: tf.Tensor  # [S, M, N]  L_K^{-1} k(Z, x) per point
    prior_var: tf.Tensor  # [S, N]  c^l = k(x, x) - |L_K^{-1} k(Z, x)|^2
    mean: tf.Tensor  # [S, N, N_l]  m_l(F)


def layer_terms(
    layer: GPLayer,
    F: tf.Tensor,
    Lk: Optional[tf.Tensor] = None,
    inverse: Optional[tf.Tensor] = None,
) -> LayerTerms:
    """The per-point quantities of Theorem 1 for one layer with inputs ``F`` ``[S, N, D]``.

    Only the whitened projection ``A = L_K^{-1} K_uf`` is formed (one data-sized solve). The
    non-whitened parameterisation uses ``a = K^{-1} k = L_K^{-T} A`` through
    ``a^T R_block = A^T (L_K^{-1} R_block)``: the second solve is moved onto the ``M x M`` blocks
    of ``R`` and ``mu`` (``StructuredPosterior._white``), which has no data-sized factor.
    ``Lk`` passes the layer's ``chol(K_uu)`` when the caller has it (:func:`inducing_choleskies`),
    ``inverse`` its inverse (:func:`inducing_factors`: the projection's gradient solves nothing).
    """
    if Lk is None:
        Lk = inducing_cholesky(layer, layer.Z)
    A = whitened_projection(Lk, layer.K(layer.Z, F), inverse=inverse)
    return LayerTerms(Lk, A, residual_variance(layer, F, A), layer.mean(F))


def with_diagonal(cov: tf.Tensor, prior_var: tf.Tensor, jitter: float) -> tf.Tensor:
    """``cov + diag(c)`` with its diagonal clamped at zero (roundoff guard) and ``jitter`` added:
    ``cov`` ``[..., P, P]``, ``c`` ``[...]`` added to every diagonal entry.

    One addition of a diagonal matrix, ``diag(max(d + c, 0) + jitter - d)`` with ``d`` the
    diagonal of ``cov``, not ``tf.linalg.set_diag``: the gradient of ``set_diag`` on a run-time
    batch shape runs three ``tf.cond``s (functional ``If`` ops, each a function call per step)."""
    d = tf.linalg.diag_part(cov)
    clamped = tf.maximum(d + tf.expand_dims(prior_var, -1), 0.0) + jitter
    return cov + tf.linalg.diag(clamped - d)


def project_rows(A: tf.Tensor, rows: tf.Tensor) -> List[tf.Tensor]:
    """``b_k = A^T rows_k`` per block column ``k``: ``A`` ``[S, M, N]`` (whitened projections of
    the points), ``rows`` ``[K, tau, M, M]`` (whitened row blocks, ``tau`` positions each); returns
    ``K`` tensors ``[S, N, tau, M]``, ``b_k[s, n, t] = rows_k[t]^T A[s, :, n]``. One matrix product
    ``[N, M] x [M, tau M]`` per ``k``; the blocks are laid out for it by a transpose of the
    parameters, not of the data-sized result."""
    K, tau, M = rows.shape[0], tf.shape(rows)[1], tf.shape(rows)[2]
    # [K, 1, M (row m), tau M (t, col j)]; the axis of 1 matches A's sample axis, so that the
    # products' gradients in W need no sum over a broadcast axis when S = 1
    W = tf.reshape(tf.transpose(rows, [0, 2, 1, 3]), [K, 1, M, tau * M])
    out_shape = tf.concat([tf.shape(A)[:1], tf.shape(A)[2:], [tau, M]], axis=0)
    return [
        tf.reshape(tf.linalg.matmul(A, W_k, transpose_a=True), out_shape) for W_k in tf.unstack(W)
    ]


@tf.custom_gradient
def squared_norms(x: tf.Tensor):
    """``sum_m x_m^2`` over the last axis of ``x`` ``[..., M]``, with the gradient written as one
    broadcasting product ``2 g x`` (the automatic one tiles ``g`` to ``x``'s shape first and
    multiplies twice; ``x`` is a per-point ``[S, N, tau, M]`` projection here)."""

    def grad(g):
        return tf.expand_dims(g + g, -1) * x

    return tf.reduce_sum(tf.square(x), axis=-1), grad


@tf.custom_gradient
def dots(x: tf.Tensor, y: tf.Tensor):
    """``sum_m x_m y_m`` over the last axis (``x``, ``y`` of one shape ``[..., M]``), with the
    gradient ``(g y, g x)`` as two broadcasting products (no tiled copy of ``g``)."""

    def grad(g):
        g = tf.expand_dims(g, -1)
        return g * y, g * x

    return tf.reduce_sum(x * y, axis=-1), grad


def block_dots(b: Sequence[tf.Tensor], b_prev: Sequence[tf.Tensor]) -> tf.Tensor:
    """``sum_k b[k] . b_prev[k]`` over the last axis, ``[S, N, tau]``: the covariance
    ``s~_t^{l l'}`` between a layer's outputs and an earlier layer's at each position, from their
    per-column products, paired in order (the shorter list ends the sum)."""
    return tf.add_n([dots(x, y) for x, y in zip(b, b_prev)])


@tf.custom_gradient
def half_squared_norm(*tensors: tf.Tensor):
    """``sum_i |t_i|_F^2 / 2`` (scalar) over tensors of any shapes and one dtype.

    The tensors are flattened into one row and the sum is that row's product with itself (a
    concatenation and one matrix product), and the gradient ``g t_i`` is written out: one product
    per tensor, where the automatic gradient of ``sum(square(t_i))`` tiles, multiplies twice and
    adds per tensor. Used for the blockwise KL's squared norms (parameter-sized tensors)."""
    flat = tf.concat([tf.reshape(t, [1, -1]) for t in tensors], axis=1)  # [1, K]
    value = 0.5 * tf.reshape(tf.linalg.matmul(flat, flat, transpose_b=True), [])

    def grad(upstream):
        return [upstream * t for t in tensors]

    return value, grad


@tf.custom_gradient
def gram_and_copy(B: tf.Tensor):
    """``(B B^T, B)`` for ``B`` ``[..., P, W]``: the Gram matrix ``[..., P, P]`` and ``B`` itself,
    for later products to take instead of ``B``.

    Both operands of ``B B^T`` and every later use of ``B`` add a term to ``B``'s gradient, and an
    addition of three or more data-sized terms is what grappler's memory optimizer rewrites into a
    temporary variable with one assignment per term. Here ``B`` has one consumer, the copy takes
    the later uses, and the gradient is written out: ``(g + g^T) B + g_copy``."""
    gram = tf.linalg.matmul(B, B, transpose_b=True)

    def grad(g_gram, g_copy):
        # g_copy - (-(g + g^T)) B: a difference, which grappler does not merge with g_copy's own
        # addition of terms into one larger AddN (it would for a sum)
        neg_sym = -(g_gram + tf.linalg.matrix_transpose(g_gram))
        if g_copy is None:
            return -tf.linalg.matmul(neg_sym, B)
        return g_copy - tf.linalg.matmul(neg_sym, B)

    return (gram, tf.identity(B)), grad


@tf.custom_gradient
def draw_and_copy(chol: tf.Tensor, eps: tf.Tensor):
    """``(chol @ eps, chol)`` for factors ``chol`` ``[..., P, P]`` and noise ``eps`` ``[..., P]``:
    the correlated draw ``[..., P]`` and a copy of ``chol`` for the later uses of the factor.

    As :func:`gram_and_copy`: ``chol`` gets one consumer, and its gradient ``g eps^T + g_copy`` is
    written as a difference, so that grappler keeps the copy's terms in an addition of their own."""
    draw = tf.linalg.matvec(chol, eps)

    def grad(g_draw, g_copy):
        neg_outer = tf.linalg.matmul(
            tf.expand_dims(-g_draw, -1), tf.expand_dims(eps, -1), transpose_b=True
        )
        d_chol = -neg_outer if g_copy is None else g_copy - neg_outer
        return d_chol, tf.linalg.matvec(chol, g_draw, adjoint_a=True)

    return (draw, tf.identity(chol)), grad


@tf.custom_gradient
def project_rows_and_means(A: tf.Tensor, rows: tf.Tensor, mu: tf.Tensor):
    """``(B, m)`` with ``B = A^T rows_u`` ``[S, N, U, W]`` and ``m = A^T mu_u`` ``[S, N, U]`` for
    ``A`` ``[S, M, N]``, rows ``[U, M, W]`` and means ``[U, M]`` (the same products as the two
    einsums ``smn,umj->snuj`` and ``smn,um->snu``).

    ``A`` has a third consumer (the residual variance), and grappler's memory optimizer rewrites
    a gradient addition of three data-sized terms into a temporary variable with one assignment
    per term; here ``A`` has one consumer for both products and their two terms are a
    difference."""
    B = tf.einsum("smn,umj->snuj", A, rows)
    m = tf.einsum("smn,um->snu", A, mu)

    def grad(g_B, g_m):
        d_A = None if g_B is None else tf.einsum("snuj,umj->smn", g_B, rows)
        if g_m is not None:  # d_A - (-g_m)^T mu: a difference, as in gram_and_copy
            neg = tf.einsum("snu,um->smn", -g_m, mu)
            d_A = -neg if d_A is None else d_A - neg
        d_rows = None if g_B is None else tf.einsum("smn,snuj->umj", A, g_B)
        d_mu = None if g_m is None else tf.einsum("smn,snu->um", A, g_m)
        return d_A, d_rows, d_mu

    return (B, m), grad
