"""The stripes-and-arrow (STAR) posterior (Lindinger et al. 2020).

STAR keeps the fully-coupled family's Gaussian over every layer's inducing outputs
(:mod:`.structured`) but only the non-zero blocks of its square root: the diagonal blocks, the
stripes between hidden units at the same position ``t`` in different layers, and the arrow from
every hidden unit to the last layer. The specification is docs/algorithms.md, "STAR sparsity and
storage".

Shapes: ``S`` samples, ``N`` data points, ``M`` inducing points, ``tau`` the hidden width,
``T = tau (L - 1) + 1`` units.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp
from check_shapes import inherit_check_shapes

from ..layers import GPLayer
from ..validation import check_bool, check_positive_float
from .base import Propagation
from .conditionals import inducing_choleskies, inducing_factors
from .structured import StructuredPosterior
from .structured_linalg import (
    append_to_inverse,
    block_dots,
    layer_terms,
    project_rows,
    squared_norms,
    whiten_by_inverse,
)

__all__ = ["StripesArrowPosterior", "star_unit_index", "star_stripe_index", "star_arrow_index"]


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


class StripesArrowPosterior(StructuredPosterior):
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

    Initialisation as :class:`~.structured.FullyCoupledPosterior` (stripes and arrow start at zero).

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
        that a block row's jitter adds grow with the row's ``M`` columns, so the preconditioned
        storage takes steps shrunk by ``sqrt(M)`` (docs/structured.md, "The first steps"). A
        value other than 1 gives each unconstrained variable a leading axis of length 1, so a
        checkpoint written with steps of 1 fails to restore into a model built with another
        value (a shape error, not blocks of the wrong size); build with
        ``offdiagonal_step=1.0`` to restore one.
    """

    options = (
        "whiten",
        "inner_scale",
        "stripes",
        "arrow",
        "precondition_offdiagonal",
        "offdiagonal_step",
    )
    summary = "stripes-and-arrow coupled Gaussian (Lindinger et al. 2020)"

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
        self.precondition_offdiagonal = check_bool(
            precondition_offdiagonal, "precondition_offdiagonal"
        )
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
        self.arrow = self._offdiagonal_parameter(tau * (L - 1), "arrow") if self.use_arrow else None

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
            np.zeros(shape),
            transform=tfp.bijectors.Chain([step, layout]),
            dtype=self.dtype,
            name=name,
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
                stripes = tf.stack(
                    [
                        chols[l] @ stripes[i] / self._offdiagonal_count(l) ** 0.5
                        for i, l in enumerate(row_layer)
                    ]
                )
            if arrow is not None:
                arrow = (
                    tf.einsum("mk,bkj->bmj", chols[L - 1], arrow)
                    / self._offdiagonal_count(L - 1) ** 0.5
                )
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
        white_diag, white_mu, prior_log_det = self._white_units(
            chols, None, diag, tf.convert_to_tensor(self.q_mu)
        )
        stripes, arrow = self._white_offdiagonals(chols)
        white = [white_mu, white_diag] + [t for t in stripes + [arrow] if t is not None]
        return self._blockwise_kl(self._log_det_sqrt(diag), white, prior_log_det)

    @inherit_check_shapes
    def propagate(self, X, num_samples=1, seed=None) -> Propagation:
        """The STAR recursion: per hidden position ``t`` an incremental Cholesky of size ``l``,
        carried as its inverse (its new diagonal entries are the standard deviations ``sd``, so
        the inverse grows by ``1 / sd`` and two products: :func:`append_to_inverse`), so that the
        conditioning is a product (:func:`whiten_by_inverse`), not a triangular solve per point.

        With ``b^l_{k,t} = a^{l T} R_{(l,t),(k,t)}`` ``[S, N, M]`` per point, the covariances of
        Theorem 1 are ``s~_t^{l l'} = sum_{k <= l'} b^l_{k,t} . b^{l'}_{k,t}`` (+ ``c^l`` on the
        diagonal); the output's are ``s~_t^{L l'} = sum_{k <= l'} b^L_{k,t} . b^{l'}_{k,t}`` from
        the arrow blocks and ``s~^{LL} = |b^L_L|^2 + sum_{k,t} |b^L_{k,t}|^2 + c^L``.

        Each block column ``k`` of a layer's rows is one matrix product for all ``tau`` positions
        (:func:`project_rows`), and the products ``b^l_k`` are kept per ``k``, so the sums over
        ``k <= l'`` take whole tensors, never slices of a larger one (a slice's gradient writes a
        zero-padded copy of the whole tensor).
        """
        S = num_samples
        source, F = self._start(X, S, seed)
        dtype = F.dtype
        jitter = gpflow.config.default_jitter()
        L = self.depth
        diag = tf.convert_to_tensor(self.diag)
        track = self.use_stripes or self.use_arrow  # whether later layers condition on this one
        samples: List[tf.Tensor] = []
        # per hidden layer, b^l_k [S, N, tau, M] for k = first .. l
        projected: List[List[tf.Tensor]] = []
        inverse = None  # [S, N, tau, l, l], the inverse of the per-position factor
        eps_prev = None  # [S, N, tau, l]
        # one batched factorisation per step, with the inverses for solve-free gradients
        factors, stack = inducing_factors(self.layers, stacked=True)
        prior_chols = [Lk for Lk, _ in factors]
        white_diag, white_mu, prior_log_det = self._white_units(
            prior_chols, stack, diag, tf.convert_to_tensor(self.q_mu)
        )
        stripes, arrow = self._white_offdiagonals(prior_chols)
        # per layer: own blocks [N_l, M, M] and means [N_l, M], given a leading axis of 1 where
        # they multiply A [S, M, N], so that their products' gradients need no sum over samples
        own_blocks = tf.split(white_diag, self._unit_sizes()) if L > 1 else [white_diag]
        unit_means = tf.split(white_mu, self._unit_sizes()) if L > 1 else [white_mu]
        for l in range(L - 1):
            terms = layer_terms(self.layers[l], F, *factors[l])
            own = tf.expand_dims(own_blocks[l], 0)  # [1, tau, M, M]
            rows = (
                own if stripes[l] is None else tf.concat([stripes[l], own], axis=0)
            )  # [K, tau, M, M]
            b = project_rows(terms.A, rows)  # K x [S, N, tau, M]
            mean = terms.mean + tf.linalg.matmul(
                terms.A, tf.expand_dims(unit_means[l], 0), transpose_a=True, transpose_b=True
            )
            var = tf.add_n([squared_norms(b_k) for b_k in b]) + tf.expand_dims(terms.prior_var, -1)
            Gt = None
            if self.use_stripes and l > 0:
                cross = tf.stack(
                    [block_dots(b, projected[lp]) for lp in range(l)], axis=-1
                )  # [S, N, tau, l]
                Gt, shift = whiten_by_inverse(
                    inverse, tf.expand_dims(cross, -1), eps_prev
                )  # [..., l, 1]
                mean = mean + tf.squeeze(shift, -1)
                var = var - tf.reduce_sum(tf.square(Gt), axis=[-2, -1])
            sd = tf.sqrt(tf.maximum(var, 0.0) + jitter)
            eps = source.normal(f"f/{l}", tf.shape(mean), dtype)
            F = mean + sd * eps
            samples.append(F)
            projected.append(b)
            if not track:
                continue
            inverse_sd = tf.expand_dims(
                tf.expand_dims(tf.math.reciprocal(sd), -1), -1
            )  # [S, N, tau, 1, 1]
            if inverse is None:
                inverse, eps_prev = inverse_sd, tf.expand_dims(eps, -1)
            else:
                # Gt None (no stripes): independent of the earlier hidden layers
                inverse = append_to_inverse(inverse, Gt, inverse_sd)
                eps_prev = tf.concat([eps_prev, tf.expand_dims(eps, -1)], axis=-1)

        terms = layer_terms(self.layers[L - 1], F, *factors[L - 1])
        mean = terms.mean + tf.linalg.matmul(
            terms.A, tf.expand_dims(unit_means[-1], 0), transpose_a=True, transpose_b=True
        )  # [S, N, 1]
        b_own = tf.linalg.matmul(terms.A, own_blocks[-1], transpose_a=True)  # [S, N, M]
        var = tf.reduce_sum(tf.square(b_own), axis=-1) + terms.prior_var  # [S, N]
        if self.use_arrow:
            b_out = project_rows(terms.A, arrow)  # L-1 x [S, N, tau, M]
            var = var + tf.reduce_sum(tf.add_n([squared_norms(b_k) for b_k in b_out]), axis=-1)
            cross = tf.stack(
                [
                    block_dots(b_out[self._first_block_layer(lp) : lp + 1], projected[lp])
                    for lp in range(L - 1)
                ],
                axis=-1,
            )  # [S, N, tau, L-1]
            Gt, shift = whiten_by_inverse(
                inverse, tf.expand_dims(cross, -1), eps_prev
            )  # [..., L-1, 1]
            mean = mean + tf.reduce_sum(tf.squeeze(shift, -1), axis=-1, keepdims=True)
            var = var - tf.reduce_sum(tf.square(Gt), axis=[-3, -2, -1])
        var = tf.expand_dims(tf.maximum(var, 0.0), -1)
        samples.append(self.sample_last_layer(mean, var, source))
        white = [white_mu, white_diag] + [t for t in stripes + [arrow] if t is not None]
        kl = self._blockwise_kl(self._log_det_sqrt(diag), white, prior_log_det)
        return Propagation(samples=samples, mean=mean, var=var, kl=tf.fill([S], kl))
