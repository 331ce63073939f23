"""Fully-coupled and stripes-and-arrow (STAR) posteriors (Lindinger et al. 2020).

The specification is docs/algorithms.md, "Fully-coupled and STAR posteriors".

Both families keep the DSVI prior (kernels, mean functions, local inducing inputs on the layers)
and replace the per-unit ``q(u_{l,lambda})`` by one Gaussian over the inducing outputs of every
unit of every layer,

    q(f_M) = N(mu_M, R R^T),    f_M = [u_{1,1}; ...; u_{1,N_1}; u_{2,1}; ...; u_{L,N_L}],

ordered layer-major, then unit, then inducing index. The inducing outputs are marginalised
analytically; per data point the layer outputs ``f_n^1 .. f_n^L`` are jointly Gaussian given the
earlier layers (Theorem 1), and are sampled layer by layer with an incremental Cholesky factor
of their covariance (:func:`whiten_cross_covariance`, :func:`append_to_cholesky`).

* :class:`FullyCoupledPosterior` stores ``R`` as a dense lower-triangular ``[TM, TM]`` matrix.
* :class:`StripesArrowPosterior` stores only the non-zero ``M x M`` blocks of the STAR pattern
  and runs the same recursion per hidden position ``t`` (tiny ``[S, N, tau, l, l]`` factors).

Shapes: ``S`` samples, ``N`` data points, ``N_l`` width of layer ``l`` (0-based here),
``M`` (or ``M_l``) inducing points, ``T = sum_l N_l`` units, ``tau`` the STAR hidden width.
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
from check_shapes import check_shapes, inherit_check_shapes

from ..layers import GPLayer
from ..linalg import safe_cholesky
from ..validation import check_bool, check_positive_float
from .base import DeepPosterior, Propagation
from .conditionals import (
    inducing_cholesky,
    inducing_choleskies,
    require_local_inducing,
    residual_variance,
    whitened_projection,
)

__all__ = [
    "FullyCoupledPosterior",
    "StripesArrowPosterior",
    "whiten_cross_covariance",
    "append_to_cholesky",
    "blockwise_kl_terms",
    "half_squared_norm",
    "star_unit_index",
    "star_stripe_index",
    "star_arrow_index",
]


# --------------------------------------------------------------------------- pure linear algebra
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
    Gt, shift = _whiten_transposed_cross(chol, tf.linalg.matrix_transpose(cross), eps)
    return tf.linalg.matrix_transpose(Gt), shift


def _whiten_transposed_cross(chol: tf.Tensor, cross_t: tf.Tensor, eps: tf.Tensor):
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
    zeros = tf.zeros_like(tf.linalg.matrix_transpose(G))  # [..., K, P]
    top = tf.concat([chol, zeros], axis=-1)
    bottom = tf.concat([G, chol_new], axis=-1)
    return tf.concat([top, bottom], axis=-2)


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
class _LayerTerms(NamedTuple):
    prior_chol: tf.Tensor  # [M, M]  L_K = chol(K_uu + jitter)
    A: tf.Tensor  # [S, M, N]  L_K^{-1} k(Z, x) per point
    prior_var: tf.Tensor  # [S, N]  c^l = k(x, x) - |L_K^{-1} k(Z, x)|^2
    mean: tf.Tensor  # [S, N, N_l]  m_l(F)


def _layer_terms(layer: GPLayer, F: tf.Tensor, Lk: Optional[tf.Tensor] = None) -> _LayerTerms:
    """The per-point quantities of Theorem 1 for one layer with inputs ``F`` ``[S, N, D]``.

    Only the whitened projection ``A = L_K^{-1} K_uf`` is formed (one data-sized solve). The
    non-whitened parameterisation uses ``a = K^{-1} k = L_K^{-T} A`` through
    ``a^T R_block = A^T (L_K^{-1} R_block)``: the second solve is moved onto the ``M x M`` blocks
    of ``R`` and ``mu`` (:meth:`_StructuredPosterior._white`), which has no data-sized factor.
    ``Lk`` passes the layer's ``chol(K_uu)`` when the caller has it (:func:`inducing_choleskies`).
    """
    if Lk is None:
        Lk = inducing_cholesky(layer, layer.Z)
    A = whitened_projection(Lk, layer.K(layer.Z, F))
    return _LayerTerms(Lk, A, residual_variance(layer, F, A), layer.mean(F))


def _with_diagonal(cov: tf.Tensor, prior_var: tf.Tensor, jitter: float) -> tf.Tensor:
    """``cov + diag(c)`` with its diagonal clamped at zero (roundoff guard) and ``jitter`` added:
    ``cov`` ``[..., P, P]``, ``c`` ``[...]`` added to every diagonal entry.

    One addition of a diagonal matrix, ``diag(max(d + c, 0) + jitter - d)`` with ``d`` the
    diagonal of ``cov``, not ``tf.linalg.set_diag``: the gradient of ``set_diag`` on a run-time
    batch shape runs three ``tf.cond``s (functional ``If`` ops, each a function call per step)."""
    d = tf.linalg.diag_part(cov)
    clamped = tf.maximum(d + tf.expand_dims(prior_var, -1), 0.0) + jitter
    return cov + tf.linalg.diag(clamped - d)


def _project_rows(A: tf.Tensor, rows: tf.Tensor) -> List[tf.Tensor]:
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
    return [tf.reshape(tf.linalg.matmul(A, W_k, transpose_a=True), out_shape) for W_k in tf.unstack(W)]


@tf.custom_gradient
def _squared_norms(x: tf.Tensor):
    """``sum_m x_m^2`` over the last axis of ``x`` ``[..., M]``, with the gradient written as one
    broadcasting product ``2 g x`` (the automatic one tiles ``g`` to ``x``'s shape first and
    multiplies twice; ``x`` is a per-point ``[S, N, tau, M]`` projection here)."""

    def grad(g):
        return tf.expand_dims(g + g, -1) * x

    return tf.reduce_sum(tf.square(x), axis=-1), grad


@tf.custom_gradient
def _dots(x: tf.Tensor, y: tf.Tensor):
    """``sum_m x_m y_m`` over the last axis (``x``, ``y`` of one shape ``[..., M]``), with the
    gradient ``(g y, g x)`` as two broadcasting products (no tiled copy of ``g``)."""

    def grad(g):
        g = tf.expand_dims(g, -1)
        return g * y, g * x

    return tf.reduce_sum(x * y, axis=-1), grad


def _block_dots(b: Sequence[tf.Tensor], b_prev: Sequence[tf.Tensor]) -> tf.Tensor:
    """``sum_k b[k] . b_prev[k]`` over the last axis, ``[S, N, tau]``: the covariance
    ``s~_t^{l l'}`` between a layer's outputs and an earlier layer's at each position, from their
    per-column products, paired in order (the shorter list ends the sum)."""
    return tf.add_n([_dots(x, y) for x, y in zip(b, b_prev)])


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
def _gram_and_copy(B: tf.Tensor):
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
def _draw_and_copy(chol: tf.Tensor, eps: tf.Tensor):
    """``(chol @ eps, chol)`` for factors ``chol`` ``[..., P, P]`` and noise ``eps`` ``[..., P]``:
    the correlated draw ``[..., P]`` and a copy of ``chol`` for the later uses of the factor.

    As :func:`_gram_and_copy`: ``chol`` gets one consumer, and its gradient ``g eps^T + g_copy`` is
    written as a difference, so that grappler keeps the copy's terms in an addition of their own."""
    draw = tf.linalg.matvec(chol, eps)

    def grad(g_draw, g_copy):
        neg_outer = tf.linalg.matmul(tf.expand_dims(-g_draw, -1), tf.expand_dims(eps, -1), transpose_b=True)
        d_chol = -neg_outer if g_copy is None else g_copy - neg_outer
        return d_chol, tf.linalg.matvec(chol, g_draw, adjoint_a=True)

    return (draw, tf.identity(chol)), grad


@tf.custom_gradient
def _project_rows_and_means(A: tf.Tensor, rows: tf.Tensor, mu: tf.Tensor):
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
        if g_m is not None:  # d_A - (-g_m)^T mu: a difference, as in _gram_and_copy
            neg = tf.einsum("snu,um->smn", -g_m, mu)
            d_A = -neg if d_A is None else d_A - neg
        d_rows = None if g_B is None else tf.einsum("smn,snuj->umj", A, g_B)
        d_mu = None if g_m is None else tf.einsum("smn,snu->um", A, g_m)
        return d_A, d_rows, d_mu

    return (B, m), grad


# --------------------------------------------------------------------------- shared base
class _StructuredPosterior(DeepPosterior):
    """Validation and initial values shared by the fully-coupled and STAR posteriors."""

    def __init__(
        self, layers: Sequence[GPLayer], whiten: bool, inner_scale: float, name: Optional[str]
    ):
        super().__init__(layers, name=name)
        require_local_inducing(self)
        inner_scale = float(inner_scale)
        if not (np.isfinite(inner_scale) and inner_scale > 0):
            raise ValueError(f"inner_scale must be a positive finite number, got {inner_scale}")
        self.whiten = bool(whiten)
        self.inner_scale = inner_scale
        self.widths = tuple(int(layer.output_dim) for layer in self.layers)
        self.inducing_counts = tuple(int(layer.num_inducing) for layer in self.layers)

    @property
    def dtype(self) -> tf.DType:
        return self.layers[0].Z.dtype

    def _initial_block(self, l: int) -> np.ndarray:
        """The initial diagonal block of a unit of layer ``l`` (0-based), ``[M_l, M_l]``."""
        scale = 1.0 if l == self.depth - 1 else self.inner_scale
        if self.whiten:
            chol = np.eye(self.inducing_counts[l])
        else:
            chol = inducing_cholesky(self.layers[l], self.layers[l].Z).numpy()
        return scale * chol

    def _white(self, Lk: tf.Tensor, blocks: tf.Tensor) -> tf.Tensor:
        """``L_K^{-1} blocks`` for row blocks ``[..., M, W]`` of ``R`` (identity if whitened)."""
        if self.whiten:
            return blocks
        Lk_b = tf.broadcast_to(Lk, tf.concat([tf.shape(blocks)[:-2], tf.shape(Lk)], 0))
        return tf.linalg.triangular_solve(Lk_b, blocks, lower=True)

    def kl_divergence(self, prior_choleskies: Optional[Sequence[tf.Tensor]] = None) -> tf.Tensor:
        """``KL(q(f_M) || p(f_M))`` (scalar), blockwise; optional precomputed ``chol(K_uu^l)``."""
        if self.whiten:
            chols = [None] * self.depth
        elif prior_choleskies is None:
            chols = inducing_choleskies(self.layers)
        else:
            chols = list(prior_choleskies)
        return self._kl(chols)

    def _kl(self, chols) -> tf.Tensor:  # pragma: no cover - abstract
        """The KL from per-layer ``chol(K_uu^l)`` (None entries when whitened)."""
        raise NotImplementedError

    @staticmethod
    def _log_det_sqrt(blocks: tf.Tensor) -> tf.Tensor:
        """``sum log|diag|`` of the stored lower-triangular factor(s) ``blocks`` (``R`` or its
        diagonal blocks), already converted from the parameter by the caller."""
        return tf.reduce_sum(tf.math.log(tf.abs(tf.linalg.diag_part(blocks))))

    def _prior_log_det(self, chols) -> Optional[tf.Tensor]:
        """``sum_l N_l log|diag L_K^l|`` (None when whitened); the factors of equal size have their
        log-determinants taken as one stack. (Where a step has ``L_K`` gathered per unit, the
        same sum is that gather's ``sum log|diag|``, one consumer fewer of the factor.)"""
        if self.whiten:
            return None
        units = [float(w) for w in self.widths]
        if len(chols) > 1 and len({tuple(Lk.shape.as_list()) for Lk in chols}) == 1 and chols[0].shape.is_fully_defined():
            log_dets = tf.reduce_sum(tf.math.log(tf.abs(tf.linalg.diag_part(tf.stack(list(chols))))), -1)  # [L]
            return tf.reduce_sum(tf.constant(units, self.dtype) * log_dets)
        return tf.add_n([u * tf.reduce_sum(tf.math.log(tf.abs(tf.linalg.diag_part(Lk))))
                         for u, Lk in zip(units, chols)])

    def _blockwise_kl(self, log_det_q: tf.Tensor, white: Sequence[tf.Tensor],
                      prior_log_det: Optional[tf.Tensor]) -> tf.Tensor:
        """Blockwise KL ``-TM/2 - log|diag R| + sum_l N_l log|L_K^l| + |white|_F^2 / 2``, where
        ``white`` holds the whitened unit means and every non-zero block of ``R`` whitened by its
        row unit's ``L_K`` (any split into tensors: the squared norms are summed over all of them
        in one product, :func:`half_squared_norm`) and ``prior_log_det`` is
        :meth:`_prior_log_det`. :meth:`propagate` passes the whitened blocks it already solved for
        the marginals, so the KL adds no triangular solve to a step."""
        num_latent = sum(w * m for w, m in zip(self.widths, self.inducing_counts))
        terms = [half_squared_norm(*white) - log_det_q]
        if prior_log_det is not None:
            terms.append(prior_log_det)
        return tf.add_n(terms) - 0.5 * tf.cast(num_latent, self.dtype)


class _GaussianBlockView:
    """A reshaped view of a ``gpflow.Parameter`` with the parts GPflow's natural-gradient update
    uses: tensor conversion, ``shape``, ``unconstrained_variable``, ``assign``. ``transform`` is
    None: :meth:`natgrad_gradient` maps the unconstrained gradient to the constrained layout
    (for ``triangular()``, a linear fill, so the map is the transform itself)."""

    def __init__(self, parameter: gpflow.Parameter, shape, fill):
        self.parameter, self._shape, self._fill = parameter, list(shape), fill
        self.transform = None
        self.unconstrained_variable = parameter.unconstrained_variable

    @property
    def shape(self):
        return tf.TensorShape(self._shape)

    @property
    def dtype(self):
        return self.parameter.dtype

    def __tf_tensor__(self, dtype=None, name=None):
        return tf.reshape(tf.convert_to_tensor(self.parameter), self._shape)

    def natgrad_gradient(self, grad: tf.Tensor) -> tf.Tensor:
        """The gradient of the unconstrained variable as a gradient of the constrained view."""
        grad = grad if self._fill is None else self._fill.forward(grad)
        return tf.reshape(grad, self._shape)

    def assign(self, value):
        return self.parameter.assign(tf.reshape(value, self.parameter.shape))


# --------------------------------------------------------------------------- fully coupled
class FullyCoupledPosterior(_StructuredPosterior):
    """One full-covariance Gaussian over the inducing outputs of all units of all layers.

    Parameters (``TM = sum_l N_l M_l``; units ordered layer-major, then unit, then inducing
    index, so unit ``(l, lambda)`` occupies rows ``off_l + lambda M_l .. + M_l`` with
    ``off_l = sum_{l' < l} N_{l'} M_{l'}``):

    * ``q_mu`` ``[TM]``, the mean ``mu_M``;
    * ``q_sqrt`` ``[TM, TM]`` lower-triangular ``R`` (GPflow ``triangular()``), ``S_M = R R^T``.

    Layers may have different numbers of inducing points ``M_l``.

    Initialisation (docs/algorithms.md, "Initial values and reference settings"): ``mu_M = 0``;
    ``R`` block-diagonal with
    ``inner_scale * chol(K_uu^l + jitter)`` for the units of inner layers and ``chol(K_uu^L +
    jitter)`` for the last layer (whitened: ``inner_scale * I`` and ``I``).

    :param layers: GP layers, each with ``inducing_inputs``.
    :param whiten: if True, ``u = L_K u'`` per unit and ``q`` is over ``u'`` with prior
        ``N(0, I)``.
    :param inner_scale: multiplier of the initial diagonal blocks of the inner layers.
    :param precondition_offdiagonal: store each off-diagonal block ``R_{i,j}`` (unit ``i``'s rows,
        an earlier unit ``j``'s columns) as ``B_{i,j} = sqrt(n_i) L_K^{(i)-1} R_{i,j}``, where
        ``n_i`` is the number of units before ``i`` (its off-diagonal blocks), as
        :class:`StripesArrowPosterior` does for its stripes and arrow (see there for why). The
        diagonal blocks are stored as they are. Default True: with Lindinger et al.'s storage
        (``False``, ``R`` itself) Adam's steps on the off-diagonal blocks are badly scaled and a
        depth-3 model ends 0.5 to 6.5 nats per point below STAR, a sub-family of it, at the same
        step budget; with this storage it ends within 0.03 to 0.20 of STAR (docs/structured.md).
        The family is the same; only the optimiser's steps change. ``q_sqrt`` holds the stored
        blocks; :meth:`dense_sqrt` gives ``R``. Natural gradients need the plain storage.
    """

    def __init__(
        self,
        layers: Sequence[GPLayer],
        whiten: bool = False,
        inner_scale: float = 1e-5,
        precondition_offdiagonal: bool = True,
        name: Optional[str] = None,
    ):
        super().__init__(layers, whiten, inner_scale, name)
        self.precondition_offdiagonal = check_bool(precondition_offdiagonal, "precondition_offdiagonal")
        offsets = [0]
        for width, m in zip(self.widths, self.inducing_counts):
            offsets.append(offsets[-1] + width * m)
        self.offsets = tuple(offsets)  # layer l occupies rows offsets[l] .. offsets[l + 1]
        self._row_masks = tuple(self._own_and_offdiagonal_masks(l) for l in range(self.depth))
        total = offsets[-1]
        R = np.zeros((total, total))
        for l, (width, m) in enumerate(zip(self.widths, self.inducing_counts)):
            block = self._initial_block(l)
            for lam in range(width):
                start = offsets[l] + lam * m
                R[start : start + m, start : start + m] = block
        self.q_mu = gpflow.Parameter(np.zeros(total), dtype=self.dtype, name="q_mu")
        self.q_sqrt = gpflow.Parameter(
            R, transform=gpflow.utilities.triangular(), dtype=self.dtype, name="q_sqrt"
        )

    def natural_gradient_blocks(self):
        """One Gaussian block, ``q(f_M)``, presented in GPflow's layout (``q_mu`` as ``[TM, 1]``,
        ``q_sqrt`` as ``[1, TM, TM]``) through views on the stored parameters."""
        if self.precondition_offdiagonal:
            raise ValueError(
                "natural gradients need FullyCoupledPosterior(precondition_offdiagonal=False): the "
                "preconditioned q_sqrt is not the Cholesky factor of q's covariance"
            )
        return [(_GaussianBlockView(self.q_mu, [self.num_latent, 1], None),
                 _GaussianBlockView(self.q_sqrt, [1, self.num_latent, self.num_latent], self.q_sqrt.transform))]

    @property
    def num_latent(self) -> int:
        """``TM``, the number of inducing outputs in ``f_M``."""
        return self.offsets[-1]

    def dense_mean(self) -> tf.Tensor:
        """``mu_M`` ``[TM]``."""
        return tf.convert_to_tensor(self.q_mu)

    def dense_sqrt(self) -> tf.Tensor:
        """``R`` ``[TM, TM]`` (with preconditioned storage, the off-diagonal blocks mapped back)."""
        P = tf.convert_to_tensor(self.q_sqrt)
        if not self.precondition_offdiagonal:
            return P
        total, rows = self.num_latent, []
        chols = None if self.whiten else inducing_choleskies(self.layers)
        for l in range(self.depth):
            own, off = self._split_rows(self._rows(P, l), l)
            if chols is not None:
                off = tf.einsum("mk,ukj->umj", chols[l], off)
            block = tf.reshape(own + off, [self.widths[l] * self.inducing_counts[l], -1])
            rows.append(tf.pad(block, [[0, 0], [0, total - self.offsets[l + 1]]]))
        return tf.concat(rows, axis=0)

    def _rows(self, R: tf.Tensor, l: int) -> tf.Tensor:
        """The non-zero part of layer ``l``'s rows of ``R`` as ``[N_l, M_l, off_{l+1}]``."""
        start, end = self.offsets[l], self.offsets[l + 1]
        return tf.reshape(R[start:end, :end], [self.widths[l], self.inducing_counts[l], end])

    def _layer_rows(self, R: tf.Tensor) -> List[tf.Tensor]:
        """:meth:`_rows` of every layer from one split of ``R`` by layer (one op, and one
        consumer of ``R`` in the gradient instead of a slice per layer); the last layer's rows
        need no column slice."""
        pieces = tf.split(R, np.diff(self.offsets).tolist()) if self.depth > 1 else [R]
        rows = []
        for l, piece in enumerate(pieces):
            end = self.offsets[l + 1]
            if end < self.num_latent:
                piece = piece[:, :end]
            rows.append(tf.reshape(piece, [self.widths[l], self.inducing_counts[l], end]))
        return rows

    def _layer_means(self, mu: tf.Tensor) -> List[tf.Tensor]:
        """Every layer's unit means ``[N_l, M_l]`` from one split of ``mu_M``."""
        pieces = tf.split(mu, np.diff(self.offsets).tolist()) if self.depth > 1 else [mu]
        return [tf.reshape(p, [w, m]) for p, w, m in zip(pieces, self.widths, self.inducing_counts)]

    def _own_and_offdiagonal_masks(self, l: int) -> Tuple[np.ndarray, np.ndarray]:
        """Two ``[N_l, 1, off_{l+1}]`` masks over layer ``l``'s rows: 1 on each unit's own diagonal
        block, and ``1 / sqrt(n_i)`` on its off-diagonal blocks (``n_i`` the units before it)."""
        width, m, end = self.widths[l], self.inducing_counts[l], self.offsets[l + 1]
        own = np.zeros((width, 1, end))
        for lam in range(width):
            start = self.offsets[l] + lam * m
            own[lam, 0, start : start + m] = 1.0
        earlier = sum(self.widths[:l]) + np.arange(width)
        scale = np.where(earlier > 0, 1.0 / np.sqrt(np.maximum(earlier, 1)), 0.0)[:, None, None]
        return own, scale * (1.0 - own)

    def _unit_masks(self) -> Tuple[np.ndarray, np.ndarray]:
        """The masks of :meth:`_own_and_offdiagonal_masks` over every unit's full row,
        ``[T, 1, TM]`` each (zero beyond a layer's columns, where ``R`` is zero anyway)."""
        total = self.num_latent
        pad = lambda mask: np.pad(mask, [(0, 0), (0, 0), (0, total - mask.shape[-1])])
        return tuple(np.concatenate([pad(masks[i]) for masks in self._row_masks]) for i in (0, 1))

    def _white_blocks(self, R: tf.Tensor, mu: tf.Tensor, chols, stack: Optional[tf.Tensor] = None):
        """Every layer's whitened rows ``[N_l, M_l, off_{l+1}]`` and unit means ``[N_l, M_l]``
        (:meth:`_white_layer`), tensors whose squared norms sum to theirs, and the prior's
        ``sum_l N_l log|diag L_K^l|`` (None when whitened): the KL's parts.

        With equal ``M_l`` (``stack``: the batched ``[L, M, M]`` prior factor, stacked from
        ``chols`` when None) all units are whitened by one triangular solve of their full rows
        ``[T, M, TM]`` with the means appended as a column, against ``L_K`` gathered per unit:
        one solve, mask and split for the whole of ``R`` instead of one per layer; otherwise one
        solve per layer."""
        if len(set(self.inducing_counts)) > 1:
            rows, means = [], []
            for l, (Lk, r, m) in enumerate(zip(chols, self._layer_rows(R), self._layer_means(mu))):
                r, m = self._white_layer(Lk, r, m, l)
                rows.append(r)
                means.append(m)
            return rows, means, rows + means, self._prior_log_det(chols)
        T, M, total = sum(self.widths), self.inducing_counts[0], self.num_latent
        units = tf.reshape(R, [T, M, total])
        unit_means = tf.reshape(mu, [T, M])
        if self.precondition_offdiagonal:
            own_mask, off_mask = self._unit_masks()
            own, off = units * tf.constant(own_mask, R.dtype), units * tf.constant(off_mask, R.dtype)
        else:
            own, off = units, None
        prior_log_det = None
        if not self.whiten:
            if stack is None:
                stack = tf.stack(list(chols))
            layer_of_unit = [l for l, width in enumerate(self.widths) for _ in range(width)]
            Lk = tf.gather(stack, layer_of_unit)  # [T, M, M]
            solved = tf.linalg.triangular_solve(Lk, tf.concat([own, tf.expand_dims(unit_means, -1)], axis=-1), lower=True)
            own, unit_means = tf.split(solved, [total, 1], axis=-1)
            unit_means = tf.squeeze(unit_means, -1)
            prior_log_det = self._log_det_sqrt(Lk)  # sum over units = sum_l N_l log|diag L_K^l|
        white = own if off is None else own + off  # [T, M, TM]
        pieces = tf.split(white, list(self.widths)) if self.depth > 1 else [white]
        rows = [p if end == total else p[..., :end] for p, end in zip(pieces, self.offsets[1:])]
        means = tf.split(unit_means, list(self.widths)) if self.depth > 1 else [unit_means]
        return rows, means, [white, unit_means], prior_log_det

    def _split_rows(self, rows: tf.Tensor, l: int) -> Tuple[tf.Tensor, tf.Tensor]:
        """Layer ``l``'s stored rows ``[N_l, M_l, off_{l+1}]`` as ``(own, off)``: each unit's own
        diagonal block (zeros elsewhere) and its off-diagonal blocks divided by ``sqrt(n_i)``."""
        own, off = self._row_masks[l]
        return rows * tf.constant(own, rows.dtype), rows * tf.constant(off, rows.dtype)

    def _white_layer(self, Lk: Optional[tf.Tensor], rows: tf.Tensor, mu: tf.Tensor, l: int):
        """``L_K^{-1}`` times layer ``l``'s stored rows ``[N_l, M_l, off_{l+1}]`` and unit means
        ``[N_l, M_l]``: ``(rows, means)`` whitened (preconditioned storage: the off-diagonal blocks
        are already whitened and only rescaled). The means ride along as one more column of the
        rows' triangular solve, so a layer takes one solve (and ``L_K`` one consumer)."""
        if self.precondition_offdiagonal:
            own, off = self._split_rows(rows, l)
        else:
            own, off = rows, None
        if not self.whiten:
            width = own.shape[-1]
            solved = self._white(Lk, tf.concat([own, tf.expand_dims(mu, -1)], axis=-1))
            own, mu = tf.split(solved, [width, 1], axis=-1)
            mu = tf.squeeze(mu, -1)
        return (own if off is None else own + off), mu

    def _kl(self, chols):
        R = tf.convert_to_tensor(self.q_sqrt)
        _, _, white, prior_log_det = self._white_blocks(R, tf.convert_to_tensor(self.q_mu), chols)
        return self._blockwise_kl(self._log_det_sqrt(R), white, prior_log_det)

    @inherit_check_shapes
    def propagate(self, X, num_samples=1, seed=None) -> Propagation:
        """Theorem 1 layer by layer, with a growing per-point Cholesky ``[S, N, T_<l, T_<l]``.

        For layer ``l`` with ``B^l = a^{l T} R_{rows(l)}`` ``[S, N, N_l, off_{l+1}]`` per point,
        ``S~^{l l'} = B^l B^{l' T} + delta_{l l'} c^l`` (B1), and the conditional (B2) on the
        sampled earlier layers is read off the incremental factor.
        """
        S = num_samples
        source, F = self._start(X, S, seed)
        dtype = F.dtype
        jitter = gpflow.config.default_jitter()
        R = tf.convert_to_tensor(self.q_sqrt)
        mu = tf.convert_to_tensor(self.q_mu)
        samples: List[tf.Tensor] = []
        projected: List[tf.Tensor] = []  # B^l of the earlier layers
        chol = None  # [S, N, T_<l, T_<l]
        eps_prev = None  # [S, N, T_<l]
        last = self.depth - 1
        prior_chols, stack = inducing_choleskies(self.layers, stacked=True)  # one batched factorisation per step
        white_rows, white_means, white, prior_log_det = self._white_blocks(R, mu, prior_chols, stack)  # KL parts too
        for l, layer in enumerate(self.layers):
            terms = _layer_terms(layer, F, prior_chols[l])
            rows, mu_l = white_rows[l], white_means[l]  # [N_l, M_l, off_{l+1}], [N_l, M_l]
            B, shift_mean = _project_rows_and_means(terms.A, rows, mu_l)  # [S, N, N_l, off_{l+1}], [S, N, N_l]
            mean = terms.mean + shift_mean
            Gt = None  # G^T [S, N, T_<l, N_l]
            if l > 0:
                # S~^{k l} = B^k B^{l T} (the transposed cross-covariance, which the solve takes);
                # B^k is zero beyond column off_{k+1}
                blocks = [
                    tf.linalg.matmul(projected[k], B[..., : self.offsets[k + 1]], transpose_b=True)
                    for k in range(l)
                ]
                cross_t = tf.concat(blocks, axis=-2)  # [S, N, T_<l, N_l]
                Gt, shift = _whiten_transposed_cross(chol, cross_t, eps_prev)
                mean = mean + shift
            if l == last:
                var = tf.reduce_sum(tf.square(B), axis=-1) + tf.expand_dims(terms.prior_var, -1)
                if Gt is not None:
                    var = var - tf.reduce_sum(tf.square(Gt), axis=-2)
                var = tf.maximum(var, 0.0)
                break
            cov, B_later = _gram_and_copy(B)  # later layers' cross-covariances take the copy
            if Gt is not None:
                cov = cov - tf.linalg.matmul(Gt, Gt, transpose_a=True)
            # + prior variance on the diagonal, clamped, + jitter
            chol_new = safe_cholesky(
                _with_diagonal(cov, terms.prior_var, jitter), name=f"conditional covariance of layer {l}"
            )
            eps = source.normal(f"f/{l}", tf.shape(mean), dtype)
            draw, chol_new = _draw_and_copy(chol_new, eps)  # the later solves and appends take the copy
            F = mean + draw
            samples.append(F)
            projected.append(B_later)
            if chol is None:
                chol, eps_prev = chol_new, eps
            else:
                chol = append_to_cholesky(chol, tf.linalg.matrix_transpose(Gt), chol_new)
                eps_prev = tf.concat([eps_prev, eps], axis=-1)
        samples.append(self.sample_last_layer(mean, var, source))
        kl = self._blockwise_kl(self._log_det_sqrt(R), white, prior_log_det)
        return Propagation(samples=samples, mean=mean, var=var, kl=tf.fill([S], kl))


# --------------------------------------------------------------------------- STAR
def star_unit_index(l: int, t: int, tau: int) -> int:
    """Index in ``diag`` of hidden unit ``(l, t)`` (0-based layer and position)."""
    return tau * l + t


def star_stripe_index(l: int, lp: int, t: int, tau: int) -> int:
    """Index in ``stripes`` of block ``R_{(l,t),(lp,t)}``, ``0 <= lp < l <= L-2`` (0-based).

    This is ``tau[(l-1)(l-2)/2 + (l'-1)] + (t-1)`` with 1-based ``l, l', t`` (docs/algorithms.md,
    "STAR sparsity and storage").
    """
    if not 0 <= lp < l:
        raise ValueError(f"a stripe block needs 0 <= lp < l, got l={l}, lp={lp}")
    return tau * (l * (l - 1) // 2 + lp) + t


def star_arrow_index(lp: int, t: int, tau: int) -> int:
    """Index in ``arrow`` of block ``R_{L,(lp,t)}`` (0-based hidden layer ``lp``)."""
    return tau * lp + t


class StripesArrowPosterior(_StructuredPosterior):
    """The stripes-and-arrow (STAR) sparsity of ``R``, stored as its non-zero blocks only.

    Supported shapes: every hidden layer has the same width ``tau``, the last layer has one GP,
    and all layers have the same number ``M`` of inducing points. With ``L`` layers there are
    ``T = tau (L-1) + 1`` units; hidden unit ``(l, t)`` (0-based) is unit ``tau l + t`` and the
    output is unit ``T - 1``. Parameters:

    * ``q_mu`` ``[T, M]``: row ``i`` is the mean of unit ``i`` (:meth:`dense_mean` gives the
      ``[TM]`` vector in fully-coupled order);
    * ``diag`` ``[T, M, M]`` lower-triangular diagonal blocks ``R_{i,i}``;
    * ``stripes`` ``[tau (L-1)(L-2)/2, M, M]`` dense blocks ``R_{(l,t),(l',t)}``, ``l' < l``,
      indexed by :func:`star_stripe_index`; ``None`` when ``stripes=False`` or ``L < 3``;
    * ``arrow`` ``[tau (L-1), M, M]`` dense blocks ``R_{L,(l',t)}``, indexed by
      :func:`star_arrow_index`; ``None`` when ``arrow=False`` or ``L < 2``.

    Every other block of ``R`` is zero, so hidden units at different positions are independent
    and the recursion of Theorem 1 splits into ``tau`` independent recursions of size ``<= L-1``
    (batched as ``[S, N, tau, l, l]`` factors), plus a sum over positions for the output.

    Initialisation as :class:`FullyCoupledPosterior` (stripes and arrow start at zero).

    :param layers: GP layers, each with ``inducing_inputs``.
    :param whiten: whitened (``N(0, I)`` prior per unit) or not.
    :param inner_scale: multiplier of the initial diagonal blocks of the hidden units.
    :param stripes: include the stripe blocks (same position, earlier hidden layer).
    :param arrow: include the arrow blocks (output row against every hidden unit).
    :param precondition_offdiagonal: store each stripe and arrow block ``R_{i,j}`` of row unit
        ``i`` as ``B_{i,j} = sqrt(n_i) L_K^{(i)-1} R_{i,j}`` (``L_K^{(i)} = I`` when whitened),
        where ``n_i`` is the number of off-diagonal blocks in that row (``l`` stripes for hidden
        layer ``l``, ``tau (L-1)`` arrow blocks for the output). Default True; False stores
        ``R_{i,j}`` itself (Lindinger et al.'s parameterisation). The family is the same; only
        Adam's steps change. The off-diagonal blocks start at zero, where their gradient is
        Monte Carlo noise, and Adam moves every entry by about the learning rate whatever the
        gradient's size, so each entry keeps a jitter of that order. Stored plainly, a jittering
        ``R_{i,j}`` adds ``|k^T K^{-1} R_{i,j}|^2`` to the unit's predictive variance and
        ``|L_K^{-1} R_{i,j}|_F^2 / 2`` to the KL, unbounded as ``K_uu`` becomes ill-conditioned,
        and the output row has ``tau (L-1)`` such blocks against one diagonal block. Whitened
        and divided by ``sqrt(n_i)``, the jitter of a whole row costs what that of one diagonal
        block costs. See ``docs/structured.md`` ("Training STAR with Adam").
    :param offdiagonal_step: how far one Adam step moves an entry of the stored stripe and
        arrow blocks, relative to the learning rate: the optimiser updates ``B / offdiagonal_step``
        (a ``Scale`` transform of the two parameters). ``B``, the storage above and the ELBO at
        given ``R`` do not depend on it. Default ``None``: ``1 / sqrt(M)`` with the preconditioned
        storage, 1 (Lindinger et al.'s steps) with the plain one. Near zero the blocks' gradient
        is Monte Carlo noise and Adam moves every entry by about its step; the variance and KL
        that a block row's jitter adds grow with the row's ``M`` columns, and with steps of 1 the
        preconditioned STAR fell well below mean-field in its first few hundred steps on
        concrete (docs/structured.md, "The first steps"). A value other than 1 gives each
        unconstrained variable a leading axis of length 1, so a checkpoint written with steps of
        1 (every STAR checkpoint before this option) fails to restore with a shape error instead
        of restoring blocks of the wrong size; build with ``offdiagonal_step=1.0`` to restore one.
    """

    def __init__(
        self,
        layers: Sequence[GPLayer],
        whiten: bool = False,
        inner_scale: float = 1e-5,
        stripes: bool = True,
        arrow: bool = True,
        precondition_offdiagonal: bool = True,
        offdiagonal_step: Optional[float] = None,
        name: Optional[str] = None,
    ):
        super().__init__(layers, whiten, inner_scale, name)
        self.precondition_offdiagonal = check_bool(precondition_offdiagonal, "precondition_offdiagonal")
        widths = self.widths
        if widths[-1] != 1:
            raise ValueError(
                f"layers: StripesArrowPosterior supports one output GP, but the last layer has "
                f"output_dim {widths[-1]} (layer widths {widths})"
            )
        if len(set(widths[:-1])) > 1:
            raise ValueError(
                "layers: StripesArrowPosterior needs equal hidden widths, got layer widths "
                f"{widths}"
            )
        if len(set(self.inducing_counts)) > 1:
            raise ValueError(
                "layers: StripesArrowPosterior needs the same number of inducing points on every "
                f"layer, got {self.inducing_counts}"
            )
        L = self.depth
        self.tau = widths[0] if L > 1 else 0
        self.num_inducing = self.inducing_counts[0]
        self.num_units = self.tau * (L - 1) + 1
        self.use_stripes = bool(stripes) and L >= 3
        self.use_arrow = bool(arrow) and L >= 2
        M, T, tau = self.num_inducing, self.num_units, self.tau
        blocks = [self._initial_block(l) for l in range(L - 1) for _ in range(tau)]
        diag = np.stack(blocks + [self._initial_block(L - 1)])
        self.q_mu = gpflow.Parameter(np.zeros((T, M)), dtype=self.dtype, name="q_mu")
        self.diag = gpflow.Parameter(
            diag, transform=gpflow.utilities.triangular(), dtype=self.dtype, name="diag"
        )
        if offdiagonal_step is None:
            offdiagonal_step = 1.0 / np.sqrt(M) if self.precondition_offdiagonal else 1.0
        self.offdiagonal_step = check_positive_float(offdiagonal_step, "offdiagonal_step")
        self.stripes = (
            self._offdiagonal_parameter(tau * (L - 1) * (L - 2) // 2, "stripes")
            if self.use_stripes
            else None
        )
        self.arrow = (
            self._offdiagonal_parameter(tau * (L - 1), "arrow") if self.use_arrow else None
        )

    def _offdiagonal_parameter(self, count: int, name: str) -> gpflow.Parameter:
        """``count`` stored off-diagonal blocks ``[count, M, M]``, zero, with Adam's steps scaled by
        ``offdiagonal_step`` (the unconstrained variable is ``[1, count, M, M]`` then)."""
        M = self.num_inducing
        shape = [count, M, M]
        if self.offdiagonal_step == 1.0:
            return gpflow.Parameter(np.zeros(shape), dtype=self.dtype, name=name)
        step = tfp.bijectors.Scale(tf.constant(self.offdiagonal_step, self.dtype))
        layout = tfp.bijectors.Reshape(event_shape_out=shape, event_shape_in=[1] + shape)
        return gpflow.Parameter(
            np.zeros(shape), transform=tfp.bijectors.Chain([step, layout]), dtype=self.dtype, name=name
        )

    # ---------------------------------------------------------------- dense views (tests, tools)
    def dense_mean(self) -> tf.Tensor:
        """``mu_M`` ``[T M]`` in fully-coupled order."""
        return tf.reshape(self.q_mu, [-1])

    def dense_sqrt(self) -> tf.Tensor:
        """The full ``R`` ``[T M, T M]`` with the zero blocks filled in (for tests and tools)."""
        T, M, tau, L = self.num_units, self.num_inducing, self.tau, self.depth
        diag = tf.convert_to_tensor(self.diag)
        zero = tf.zeros([M, M], dtype=diag.dtype)
        stripes = None if self.stripes is None else tf.convert_to_tensor(self.stripes)
        arrow = None if self.arrow is None else tf.convert_to_tensor(self.arrow)
        if self.precondition_offdiagonal:  # R_{i,j} = L_K^{(i)} B_{i,j} / sqrt(n_i)
            if self.whiten:
                chols = [tf.eye(M, dtype=diag.dtype)] * L
            else:
                chols = inducing_choleskies(self.layers)
            if stripes is not None:
                row_layer = [l for l in range(L - 1) for _ in range(l) for _ in range(tau)]
                stripes = tf.stack([
                    chols[l] @ stripes[i] / self._offdiagonal_count(l) ** 0.5
                    for i, l in enumerate(row_layer)
                ])
            if arrow is not None:
                arrow = tf.einsum("mk,bkj->bmj", chols[L - 1], arrow) / self._offdiagonal_count(L - 1) ** 0.5
        blocks = [[zero] * T for _ in range(T)]
        for i in range(T):
            blocks[i][i] = diag[i]
        for t in range(tau):
            for l in range(L - 1):
                if self.use_stripes:
                    for lp in range(l):
                        i, j = star_unit_index(l, t, tau), star_unit_index(lp, t, tau)
                        blocks[i][j] = stripes[star_stripe_index(l, lp, t, tau)]
                if self.use_arrow:
                    blocks[T - 1][star_unit_index(l, t, tau)] = arrow[star_arrow_index(l, t, tau)]
        return tf.concat([tf.concat(row, axis=-1) for row in blocks], axis=-2)

    # ---------------------------------------------------------------- blocks
    def _offdiagonal_count(self, l: int) -> int:
        """``n``: the number of stored off-diagonal blocks in a row of layer ``l`` (0-based)."""
        if l == self.depth - 1:
            return self.tau * (self.depth - 1) if self.use_arrow else 0
        return l if self.use_stripes else 0

    def _white_offdiagonal(self, Lk: tf.Tensor, blocks: tf.Tensor, l: int) -> tf.Tensor:
        """``L_K^{-1} R_{i,j}`` for the stored stripe or arrow blocks ``[..., M, M]`` of rows in
        layer ``l`` (``Lk`` that layer's prior Cholesky factor)."""
        if self.precondition_offdiagonal:
            return blocks / tf.cast(self._offdiagonal_count(l), blocks.dtype) ** 0.5
        return self._white(Lk, blocks)

    def _unit_sizes(self) -> List[int]:
        """Units per layer, ``[tau, ..., tau, 1]`` (the split of the unit axis into layers)."""
        return [self.tau] * (self.depth - 1) + [1]

    def _white_units(self, chols, stack: Optional[tf.Tensor], diag: tf.Tensor, mu: tf.Tensor):
        """``L_K^{-1}`` times every unit's diagonal block and mean, ``([T, M, M], [T, M])``
        (unchanged when whitened), with ``L_K`` the unit's layer's factor, and the prior's
        ``sum_l N_l log|diag L_K^l|`` (None when whitened) from the same per-unit factors.

        One triangular solve for all units: each block with its mean appended as a column,
        against the factors gathered per unit from ``stack`` (the batched ``[L, M, M]`` of
        :func:`inducing_choleskies`; stacked here from ``chols`` when None)."""
        if self.whiten:
            return diag, mu, None
        M, L = self.num_inducing, self.depth
        if L == 1:
            Lk = tf.expand_dims(chols[0], 0)  # [1, M, M]
        else:
            if stack is None:
                stack = tf.stack(list(chols))
            layer_of_unit = [l for l, n in enumerate(self._unit_sizes()) for _ in range(n)]
            Lk = tf.gather(stack, layer_of_unit)  # [T, M, M]
        rhs = tf.concat([diag, tf.expand_dims(mu, -1)], axis=-1)  # [T, M, M + 1]
        solved = tf.linalg.triangular_solve(Lk, rhs, lower=True)
        white_diag, white_mu = tf.split(solved, [M, 1], axis=-1)
        return white_diag, tf.squeeze(white_mu, -1), self._log_det_sqrt(Lk)

    def _white_offdiagonals(self, chols) -> Tuple[List[Optional[tf.Tensor]], Optional[tf.Tensor]]:
        """``L_K^{-1}`` times the stored off-diagonal blocks: per hidden layer ``l`` its stripes
        ``[l, tau, M, M]`` (None for layer 0 or without stripes), and the arrow
        ``[L-1, tau, M, M]`` (None without). ``chols``: the layers' ``L_K`` (None if whitened)."""
        tau, M, L = self.tau, self.num_inducing, self.depth
        stripes: List[Optional[tf.Tensor]] = [None] * max(L - 1, 0)
        if self.use_stripes:
            sizes = [tau * l for l in range(1, L - 1)]
            stored = tf.convert_to_tensor(self.stripes)
            pieces = tf.split(stored, sizes) if len(sizes) > 1 else [stored]
            for l, piece in zip(range(1, L - 1), pieces):
                stripes[l] = self._white_offdiagonal(chols[l], tf.reshape(piece, [l, tau, M, M]), l)
        arrow = None
        if self.use_arrow:
            arrow = tf.reshape(tf.convert_to_tensor(self.arrow), [L - 1, tau, M, M])
            arrow = self._white_offdiagonal(chols[L - 1], arrow, L - 1)
        return stripes, arrow

    def _first_block_layer(self, l: int) -> int:
        """The first hidden layer ``k`` with a non-zero block ``R_{(l,t),(k,t)}``."""
        return 0 if self.use_stripes else l

    def _kl(self, chols):
        diag = tf.convert_to_tensor(self.diag)
        white_diag, white_mu, prior_log_det = self._white_units(chols, None, diag, tf.convert_to_tensor(self.q_mu))
        stripes, arrow = self._white_offdiagonals(chols)
        white = [white_mu, white_diag] + [t for t in stripes + [arrow] if t is not None]
        return self._blockwise_kl(self._log_det_sqrt(diag), white, prior_log_det)

    @inherit_check_shapes
    def propagate(self, X, num_samples=1, seed=None) -> Propagation:
        """The STAR recursion: per hidden position ``t`` an incremental Cholesky of size ``l``.

        With ``b^l_{k,t} = a^{l T} R_{(l,t),(k,t)}`` ``[S, N, M]`` per point, the covariances of
        Theorem 1 are ``s~_t^{l l'} = sum_{k <= l'} b^l_{k,t} . b^{l'}_{k,t}`` (+ ``c^l`` on the
        diagonal); the output's are ``s~_t^{L l'} = sum_{k <= l'} b^L_{k,t} . b^{l'}_{k,t}`` from
        the arrow blocks and ``s~^{LL} = |b^L_L|^2 + sum_{k,t} |b^L_{k,t}|^2 + c^L``.

        Each block column ``k`` of a layer's rows is one matrix product for all ``tau`` positions
        (:func:`_project_rows`), and the products ``b^l_k`` are kept per ``k``, so the sums over
        ``k <= l'`` take whole tensors, never slices of a larger one (a slice's gradient writes a
        zero-padded copy of the whole tensor).
        """
        S = num_samples
        source, F = self._start(X, S, seed)
        dtype = F.dtype
        jitter = gpflow.config.default_jitter()
        tau, L = self.tau, self.depth
        diag = tf.convert_to_tensor(self.diag)
        track = self.use_stripes or self.use_arrow  # whether later layers condition on this one
        samples: List[tf.Tensor] = []
        projected: List[List[tf.Tensor]] = []  # per hidden layer, b^l_k [S, N, tau, M] for k = first .. l
        chol = None  # [S, N, tau, l, l]
        eps_prev = None  # [S, N, tau, l]
        prior_chols, stack = inducing_choleskies(self.layers, stacked=True)  # one batched factorisation per step
        white_diag, white_mu, prior_log_det = self._white_units(prior_chols, stack, diag, tf.convert_to_tensor(self.q_mu))
        stripes, arrow = self._white_offdiagonals(prior_chols)
        # per layer: own blocks [N_l, M, M] and means [N_l, M], given a leading axis of 1 where
        # they multiply A [S, M, N], so that their products' gradients need no sum over samples
        own_blocks = tf.split(white_diag, self._unit_sizes()) if L > 1 else [white_diag]
        unit_means = tf.split(white_mu, self._unit_sizes()) if L > 1 else [white_mu]
        for l in range(L - 1):
            terms = _layer_terms(self.layers[l], F, prior_chols[l])
            own = tf.expand_dims(own_blocks[l], 0)  # [1, tau, M, M]
            rows = own if stripes[l] is None else tf.concat([stripes[l], own], axis=0)  # [K, tau, M, M]
            b = _project_rows(terms.A, rows)  # K x [S, N, tau, M]
            mean = terms.mean + tf.linalg.matmul(
                terms.A, tf.expand_dims(unit_means[l], 0), transpose_a=True, transpose_b=True)
            var = tf.add_n([_squared_norms(b_k) for b_k in b]) + tf.expand_dims(terms.prior_var, -1)
            G = None
            if self.use_stripes and l > 0:
                cross = tf.stack([_block_dots(b, projected[lp]) for lp in range(l)], axis=-1)  # [S, N, tau, l]
                Gt, shift = _whiten_transposed_cross(chol, tf.expand_dims(cross, -1), eps_prev)  # [..., l, 1]
                G = tf.expand_dims(tf.squeeze(Gt, -1), -2)  # [S, N, tau, 1, l]: a reshape, not a transpose
                mean = mean + tf.squeeze(shift, -1)
                var = var - tf.reduce_sum(tf.square(Gt), axis=[-2, -1])
            sd = tf.sqrt(tf.maximum(var, 0.0) + jitter)
            eps = source.normal(f"f/{l}", tf.shape(mean), dtype)
            F = mean + sd * eps
            samples.append(F)
            projected.append(b)
            if not track:
                continue
            if chol is None:
                chol, eps_prev = tf.expand_dims(tf.expand_dims(sd, -1), -1), tf.expand_dims(eps, -1)
            else:
                if G is None:  # no stripes: independent of the earlier hidden layers
                    G = tf.zeros(tf.concat([tf.shape(eps_prev)[:-1], [1, l]], 0), dtype=dtype)
                chol = append_to_cholesky(chol, G, tf.expand_dims(tf.expand_dims(sd, -1), -1))
                eps_prev = tf.concat([eps_prev, tf.expand_dims(eps, -1)], axis=-1)

        terms = _layer_terms(self.layers[L - 1], F, prior_chols[L - 1])
        mean = terms.mean + tf.linalg.matmul(
            terms.A, tf.expand_dims(unit_means[-1], 0), transpose_a=True, transpose_b=True)  # [S, N, 1]
        b_own = tf.linalg.matmul(terms.A, own_blocks[-1], transpose_a=True)  # [S, N, M]
        var = tf.reduce_sum(tf.square(b_own), axis=-1) + terms.prior_var  # [S, N]
        if self.use_arrow:
            b_out = _project_rows(terms.A, arrow)  # L-1 x [S, N, tau, M]
            var = var + tf.reduce_sum(tf.add_n([_squared_norms(b_k) for b_k in b_out]), axis=-1)
            cross = tf.stack([
                _block_dots(b_out[self._first_block_layer(lp) : lp + 1], projected[lp])
                for lp in range(L - 1)
            ], axis=-1)  # [S, N, tau, L-1]
            Gt, shift = _whiten_transposed_cross(chol, tf.expand_dims(cross, -1), eps_prev)  # [..., L-1, 1]
            mean = mean + tf.reduce_sum(tf.squeeze(shift, -1), axis=-1, keepdims=True)
            var = var - tf.reduce_sum(tf.square(Gt), axis=[-3, -2, -1])
        var = tf.expand_dims(tf.maximum(var, 0.0), -1)
        samples.append(self.sample_last_layer(mean, var, source))
        white = [white_mu, white_diag] + [t for t in stripes + [arrow] if t is not None]
        kl = self._blockwise_kl(self._log_det_sqrt(diag), white, prior_log_det)
        return Propagation(samples=samples, mean=mean, var=var, kl=tf.fill([S], kl))
