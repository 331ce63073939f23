"""Fully-coupled and stripes-and-arrow (STAR) posteriors (Lindinger et al. 2020).

The specification is docs/algorithms.md, "Fully-coupled and STAR posteriors".

Both families keep the DSVI prior (kernels, mean functions, local inducing inputs on the layers)
and replace the per-unit ``q(u_{l,lambda})`` by one Gaussian over the inducing outputs of every
unit of every layer,

    q(f_M) = N(mu_M, R R^T),    f_M = [u_{1,1}; ...; u_{1,N_1}; u_{2,1}; ...; u_{L,N_L}],

ordered layer-major, then unit, then inducing index. The inducing outputs are marginalised
analytically; per data point the layer outputs ``f_n^1 .. f_n^L`` are jointly Gaussian given the
earlier layers (Theorem 1), and are sampled layer by layer with an incremental Cholesky factor
of their covariance, carried as its inverse (:func:`whiten_by_inverse`,
:func:`append_to_inverse`; the per-point factorisations are elementwise, so a step's operations
do not grow with the batch).

* :class:`FullyCoupledPosterior` stores ``R`` as a dense lower-triangular ``[TM, TM]`` matrix.
* :class:`~.stripes_arrow.StripesArrowPosterior` (module :mod:`.stripes_arrow`) stores only the
  non-zero ``M x M`` blocks of the STAR pattern and runs the same recursion per hidden position
  ``t`` (tiny ``[S, N, tau, l, l]`` factors).

This module holds their shared base (:class:`StructuredPosterior`) and the fully-coupled family;
the linear algebra is in :mod:`.structured_linalg`.

Shapes: ``S`` samples, ``N`` data points, ``N_l`` width of layer ``l`` (0-based here),
``M`` (or ``M_l``) inducing points, ``T = sum_l N_l`` units, ``tau`` the STAR hidden width.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import inherit_check_shapes

from ..initialisation import kmeans_inducing_inputs
from ..layers import GPLayer
from ..linalg import cholesky_with_inverse
from ..noise import NoiseSource
from ..validation import check_bool
from .base import DeepPosterior, Propagation
from .conditionals import (
    inducing_choleskies,
    inducing_cholesky,
    inducing_factors,
    require_local_inducing,
)
from .draws import InducingDraw, unit_rows_variance
from .structured_linalg import (
    append_to_cholesky,
    append_to_inverse,
    blockwise_kl_terms,
    gram_and_copy,
    half_squared_norm,
    layer_terms,
    project_rows_and_means,
    whiten_by_inverse,
    whiten_cross_covariance,
    with_diagonal,
)

__all__ = [
    "StructuredPosterior",
    "FullyCoupledPosterior",
    # the linear algebra, also importable from here
    "whiten_cross_covariance",
    "append_to_cholesky",
    "whiten_by_inverse",
    "append_to_inverse",
    "blockwise_kl_terms",
    "half_squared_norm",
]


# --------------------------------------------------------------------------- shared base
class StructuredPosterior(DeepPosterior):
    """Validation and initial values shared by the fully-coupled and STAR posteriors."""

    @classmethod
    def initial_inducing_inputs(cls, X, num_inducing, seed):
        """The DSVI prior's inducing inputs: ``num_inducing`` k-means centres of ``X``."""
        return kmeans_inducing_inputs(X, num_inducing, seed)

    def inducing_draw(self, num_samples: int, source: NoiseSource, dtype: tf.DType) -> InducingDraw:
        """``f_M = mu + R eps`` with ``R`` lower-triangular in layer-major order, so the last
        layer's outputs given the hidden ones are ``N(mu_L + R_{L,<L} eps_{<L}, R_LL R_LL^T)``: the
        hidden rows are drawn, the last layer's are integrated out."""
        S = num_samples
        chols = inducing_choleskies(self.layers)
        mu, R = self.dense_mean(), self.dense_sqrt()
        sizes = [layer.output_dim * layer.num_inducing for layer in self.layers]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
        hidden = int(offsets[-2])
        if hidden:
            eps = source.normal("u/coupled", [S, hidden], dtype)
            f = mu[None, :] + tf.linalg.matmul(eps, R[:, :hidden], transpose_b=True)  # [S, TM]
        else:
            f = tf.broadcast_to(mu[None, :], [S, int(offsets[-1])])

        def white(l, block):  # [..., M, W] -> L_K^{-1} block (identity if whitened)
            if self.whiten:
                return block
            Lk = chols[l]
            return tf.linalg.triangular_solve(
                tf.broadcast_to(Lk, tf.concat([tf.shape(block)[:-2], tf.shape(Lk)], 0)),
                block,
                lower=True,
            )

        weights = []
        for l, layer in enumerate(self.layers):
            M, P = layer.num_inducing, layer.output_dim
            u = tf.reshape(
                f[:, offsets[l] : offsets[l + 1]], [S, P, M]
            )  # unit-major, then inducing index
            weights.append(white(l, tf.linalg.matrix_transpose(u)))  # [S, M, P]
        L_, M_, P_ = self.depth - 1, self.layers[-1].num_inducing, self.layers[-1].output_dim
        R_last = tf.reshape(
            R[offsets[L_] :, offsets[L_] :], [P_, M_, P_ * M_]
        )  # rows of unit p: [M, P M]
        R_last = white(L_, R_last)
        kl = tf.fill([S], self.kl_divergence(chols))
        return InducingDraw(
            [layer.Z for layer in self.layers], chols, weights, unit_rows_variance(R_last), kl
        )

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
        if (
            len(chols) > 1
            and len({tuple(Lk.shape.as_list()) for Lk in chols}) == 1
            and chols[0].shape.is_fully_defined()
        ):
            log_dets = tf.reduce_sum(
                tf.math.log(tf.abs(tf.linalg.diag_part(tf.stack(list(chols))))), -1
            )  # [L]
            return tf.reduce_sum(tf.constant(units, self.dtype) * log_dets)
        return tf.add_n(
            [
                u * tf.reduce_sum(tf.math.log(tf.abs(tf.linalg.diag_part(Lk))))
                for u, Lk in zip(units, chols)
            ]
        )

    def _blockwise_kl(
        self, log_det_q: tf.Tensor, white: Sequence[tf.Tensor], prior_log_det: Optional[tf.Tensor]
    ) -> tf.Tensor:
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
class FullyCoupledPosterior(StructuredPosterior):
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
        (``False``, ``R`` itself) Adam's steps on the off-diagonal blocks are badly scaled, and a
        deep model trains to a lower ELBO than STAR, a sub-family of it, at the same step budget
        (docs/structured.md). The family is the same; only the optimiser's steps change.
        ``q_sqrt`` holds the stored blocks; :meth:`dense_sqrt` gives ``R``. Natural gradients
        need the plain storage.
    """

    options = ("whiten", "inner_scale", "precondition_offdiagonal")
    summary = "fully-coupled Gaussian over all layers (Lindinger et al. 2020)"
    eval_row_samples = 8192

    def __init__(
        self,
        layers: Sequence[GPLayer],
        whiten: bool = False,
        inner_scale: float = 1e-5,
        precondition_offdiagonal: bool = True,
        name: Optional[str] = None,
    ):
        super().__init__(layers, whiten, inner_scale, name)
        self.precondition_offdiagonal = check_bool(
            precondition_offdiagonal, "precondition_offdiagonal"
        )
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
        return [
            (
                _GaussianBlockView(self.q_mu, [self.num_latent, 1], None),
                _GaussianBlockView(
                    self.q_sqrt, [1, self.num_latent, self.num_latent], self.q_sqrt.transform
                ),
            )
        ]

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

        def pad(mask):
            return np.pad(mask, [(0, 0), (0, 0), (0, total - mask.shape[-1])])

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
            own, off = (
                units * tf.constant(own_mask, R.dtype),
                units * tf.constant(off_mask, R.dtype),
            )
        else:
            own, off = units, None
        prior_log_det = None
        if not self.whiten:
            if stack is None:
                stack = tf.stack(list(chols))
            layer_of_unit = [l for l, width in enumerate(self.widths) for _ in range(width)]
            Lk = tf.gather(stack, layer_of_unit)  # [T, M, M]
            solved = tf.linalg.triangular_solve(
                Lk, tf.concat([own, tf.expand_dims(unit_means, -1)], axis=-1), lower=True
            )
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
        """Theorem 1 layer by layer, with the inverse of a growing per-point Cholesky factor
        ``[S, N, T_<l, T_<l]``.

        For layer ``l`` with ``B^l = a^{l T} R_{rows(l)}`` ``[S, N, N_l, off_{l+1}]`` per point,
        ``S~^{l l'} = B^l B^{l' T} + delta_{l l'} c^l`` (B1), and the conditional (B2) on the
        sampled earlier layers is read off the incremental factor: ``G^T = chol^{-1} C^T`` is a
        batched product with the carried inverse, and each hidden layer's ``[S, N, N_l, N_l]``
        conditional covariance is factorised, with its inverse, by elementwise operations
        (:func:`~deepgp_gi.linalg.cholesky_with_inverse`, ``unrolled=True``): no Cholesky or
        triangular-solve kernel per data point.
        """
        S = num_samples
        source, F = self._start(X, S, seed)
        dtype = F.dtype
        jitter = gpflow.config.default_jitter()
        R = tf.convert_to_tensor(self.q_sqrt)
        mu = tf.convert_to_tensor(self.q_mu)
        samples: List[tf.Tensor] = []
        projected: List[tf.Tensor] = []  # B^l of the earlier layers
        inverse = (
            None  # [S, N, T_<l, T_<l], the inverse of the per-point factor of the earlier layers
        )
        eps_prev = None  # [S, N, T_<l]
        last = self.depth - 1
        # one batched factorisation per step, with the inverses for solve-free gradients
        factors, stack = inducing_factors(self.layers, stacked=True)
        prior_chols = [Lk for Lk, _ in factors]
        white_rows, white_means, white, prior_log_det = self._white_blocks(
            R, mu, prior_chols, stack
        )  # KL parts too
        for l, layer in enumerate(self.layers):
            terms = layer_terms(layer, F, *factors[l])
            rows, mu_l = white_rows[l], white_means[l]  # [N_l, M_l, off_{l+1}], [N_l, M_l]
            B, shift_mean = project_rows_and_means(
                terms.A, rows, mu_l
            )  # [S, N, N_l, off_{l+1}], [S, N, N_l]
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
                Gt, shift = whiten_by_inverse(inverse, cross_t, eps_prev)
                mean = mean + shift
            if l == last:
                var = tf.reduce_sum(tf.square(B), axis=-1) + tf.expand_dims(terms.prior_var, -1)
                if Gt is not None:
                    var = var - tf.reduce_sum(tf.square(Gt), axis=-2)
                var = tf.maximum(var, 0.0)
                break
            cov, B_later = gram_and_copy(B)  # later layers' cross-covariances take the copy
            if Gt is not None:
                cov = cov - tf.linalg.matmul(Gt, Gt, transpose_a=True)
            # + prior variance on the diagonal, clamped, + jitter; factor and inverse elementwise
            chol_new, inverse_new = cholesky_with_inverse(
                with_diagonal(cov, terms.prior_var, jitter),
                unrolled=True,
                name=f"conditional covariance of layer {l}",
            )
            eps = source.normal(f"f/{l}", tf.shape(mean), dtype)
            F = mean + tf.linalg.matvec(chol_new, eps)
            samples.append(F)
            projected.append(B_later)
            if inverse is None:
                inverse, eps_prev = inverse_new, eps
            else:
                inverse = append_to_inverse(inverse, Gt, inverse_new)
                eps_prev = tf.concat([eps_prev, eps], axis=-1)
        samples.append(self.sample_last_layer(mean, var, source))
        kl = self._blockwise_kl(self._log_det_sqrt(R), white, prior_log_det)
        return Propagation(samples=samples, mean=mean, var=var, kl=tf.fill([S], kl))
