"""Global-inducing and local-inducing deep GP posteriors (Ober & Aitchison 2021), ALGORITHMS.md §2.3.

Both families use the pseudo-data form of the inducing posterior of layer ``l``:

    Q(U_l | inputs) = prod_lambda N(u_lambda | Sigma_l Lambda_l v_lambda, Sigma_l),
    Sigma_l = (K^{-1} + Lambda_l)^{-1},

the GP posterior after observing pseudo-outputs ``V_l`` ``[M, N_l]`` with noise precision
``Lambda_l`` at the layer's inducing inputs. In the **global** family the inducing inputs of
layer 1 are learned (``U_0`` ``[M, D]``) and those of every later layer are the sampled inducing
outputs of the layer below, propagated together with the data rows (``H_l = [U_l; F_l]``,
``[S, M + N, N_l]``); every Monte Carlo sample draws its own chain ``U_1 .. U_L``. In the
**local** family each layer has its own learned inducing inputs ``Z_{l-1}`` (the layer's
``inducing_variable``) and nothing but the data rows is propagated.

Everything is computed in the whitened square-root form of ALGORITHMS.md §2.3 (never a
``K^{-1}``): with ``L_K = chol(K_uu)`` and ``B = I + L_K^T Lambda L_K = L_B L_B^T``,

* ``a = L_B^{-T} (L_B^{-1} L_K^T Lambda V + eps)`` (``eps ~ N(0, I)``), ``U = m + L_K a``;
* ``log P(U) - log Q(U) = 1/2 ||eps||^2 - 1/2 ||a||^2 - sum_units log|L_B|``;
* ``KL(Q || P) = 1/2 [tr B^{-1} + ||E a||^2 - M + log|B|]`` per unit (the analytic option).

Precision parameterisations (``precision=``), all with the log-scale stored divided by ``rho``
(O&A App. H "Adam re-scaling"; ``rho = 3``):

* ``"full"``: ``Lambda = R R^T`` shared by the units, ``R = exp(rho * s_raw) R~ / mean(diag R~)``
  with ``R~`` an unconstrained ``[M, M]`` matrix (initialised to ``I``) and ``s_raw`` a scalar
  (initialised to ``log_precision_init / (2 rho)``);
* ``"diagonal"``: per-unit diagonal ``Lambda_lambda = diag(exp(rho * raw[lambda]))``, raw
  ``[N_l, M]``;
* ``"shared_diagonal"``: one diagonal shared by the units, raw ``[1, M]``.

Random draws (see :mod:`deepgp_gi.noise`): ``"u/{l}"`` ``[S, M, N_l]`` for the inducing rows of
layer ``l`` (0-based) and ``"f/{l}"`` ``[S, N, N_l]`` for the data rows (the last layer's
``"f/{L-1}"`` is the sample returned in ``Propagation.samples[-1]``).
"""
from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Union

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

from ..layers import GPLayer
from ..linalg import add_jitter, safe_cholesky
from ..noise import NoiseLike, as_noise_source
from .base import DeepPosterior, Propagation

__all__ = [
    "GlobalInducingPosterior",
    "LocalInducingPosterior",
    "GlobalInducingPropagation",
    "global_inducing_from_data",
    "local_inducing_from_data",
    "PRECISIONS",
    "KL_MODES",
    "whitened_pseudo_posterior",
    "sample_whitened",
    "whitened_log_ratio",
    "whitened_conditional_kl",
    "whitened_marginal_variance",
]

PRECISIONS = ("full", "diagonal", "shared_diagonal")
KL_MODES = ("sampled", "analytic")
DEFAULT_NUM_INDUCING = 100  # O&A App. O, UCI deep GPs


# ====================================================================================== maths
# The pure functions below carry a leading sample axis S on everything that depends on the
# (sample-specific) inducing inputs. A precision shared by the units gives ``L_B`` of shape
# ``[S, M, M]``; per-unit diagonal precisions give ``[S, P, M, M]``.


def _lb_solve(L_B: tf.Tensor, rhs: tf.Tensor, adjoint: bool) -> tf.Tensor:
    """Solve ``L_B x = rhs`` (or ``L_B^T x = rhs``) for ``rhs`` ``[S, M, P]``.

    ``L_B`` is ``[S, M, M]`` (shared by the P columns) or ``[S, P, M, M]`` (one per column).
    The branch is on the static rank, never on values.
    """
    if L_B.shape.rank == 3:
        return tf.linalg.triangular_solve(L_B, rhs, lower=True, adjoint=adjoint)
    rhs_t = tf.linalg.matrix_transpose(rhs)[..., None]  # [S, P, M, 1]
    x = tf.linalg.triangular_solve(L_B, rhs_t, lower=True, adjoint=adjoint)
    return tf.linalg.matrix_transpose(x[..., 0])  # [S, M, P]


def _units_logdet(L_B: tf.Tensor, num_units) -> tf.Tensor:
    """``sum_units log|L_B|`` ``[S]``: ``P * log|L_B|`` if shared, else the sum over units."""
    logdiag = tf.math.log(tf.abs(tf.linalg.diag_part(L_B)))
    if L_B.shape.rank == 3:
        return tf.cast(num_units, L_B.dtype) * tf.reduce_sum(logdiag, axis=-1)
    return tf.reduce_sum(logdiag, axis=[-2, -1])


@check_shapes(
    "L_K: [S, M, M]",
    "V: [M, P]",
    "full_factor: [M, M]",
    "diag_precision: [Q, M]",
    "return[1]: [S, M, P]",
)
def whitened_pseudo_posterior(
    L_K: tf.Tensor,
    V: tf.Tensor,
    full_factor: Optional[tf.Tensor] = None,
    diag_precision: Optional[tf.Tensor] = None,
):
    """The whitened pseudo-data posterior: ``(L_B, a_mean)``.

    With ``Lambda`` given either as ``full_factor`` R (``Lambda = R R^T``, shared by the units)
    or as ``diag_precision`` ``[Q, M]`` (``Q = 1``: one diagonal shared by the units; ``Q = P``:
    one per unit), returns

    * ``L_B = chol(I + L_K^T Lambda L_K)``: ``[S, M, M]`` if shared, ``[S, P, M, M]`` per unit;
    * ``a_mean = B^{-1} L_K^T Lambda V`` ``[S, M, P]``, so that ``L_K a_mean = Sigma Lambda V``.

    ``B`` has eigenvalues >= 1, so its Cholesky never needs jitter. Exactly one of
    ``full_factor`` / ``diag_precision`` must be given.
    """
    if (full_factor is None) == (diag_precision is None):
        raise ValueError("give exactly one of full_factor and diag_precision")
    if full_factor is not None:
        C = tf.linalg.matmul(L_K, full_factor, transpose_a=True)  # L_K^T R  [S, M, M]
        B = tf.linalg.matmul(C, C, transpose_b=True)
        RtV = tf.linalg.matmul(full_factor, V, transpose_a=True)  # [M, P]
        b = tf.linalg.matmul(C, tf.broadcast_to(RtV, tf.concat([tf.shape(C)[:-2], tf.shape(RtV)], 0)))
    else:
        Q = diag_precision.shape[0]
        sqrt_lam = tf.sqrt(diag_precision)  # [Q, M]
        if Q == 1:
            C = sqrt_lam[0][:, None] * L_K  # diag(sqrt lam) L_K  [S, M, M]
        else:
            C = sqrt_lam[None, :, :, None] * L_K[:, None]  # [S, P, M, M]
        B = tf.linalg.matmul(C, C, transpose_a=True)
        LamV = tf.linalg.matrix_transpose(diag_precision) * V  # [M, P]
        b = tf.linalg.matmul(L_K, tf.broadcast_to(LamV, tf.concat([tf.shape(L_K)[:-2], tf.shape(LamV)], 0)),
                             transpose_a=True)
    B = tf.linalg.set_diag(B, tf.linalg.diag_part(B) + tf.ones([], B.dtype))  # I + ...
    L_B = tf.linalg.cholesky(B)
    a_mean = _lb_solve(L_B, _lb_solve(L_B, b, adjoint=False), adjoint=True)
    return L_B, a_mean


@check_shapes(
    "a_mean: [S, M, P]",
    "eps: [S, M, P]",
    "return: [S, M, P]",
)
def sample_whitened(L_B: tf.Tensor, a_mean: tf.Tensor, eps: tf.Tensor) -> tf.Tensor:
    """``a = a_mean + L_B^{-T} eps`` (whitened inducing outputs; ``U - m = L_K a``).

    ``L_B`` is ``[S, M, M]`` or ``[S, P, M, M]`` (see :func:`whitened_pseudo_posterior`).
    ``a ~ N(a_mean, B^{-1})``, so ``L_K a ~ N(Sigma Lambda V, Sigma)``.
    """
    return a_mean + _lb_solve(L_B, eps, adjoint=True)


@check_shapes(
    "a: [S, M, P]",
    "eps: [S, M, P]",
    "return: [S]",
)
def whitened_log_ratio(L_B: tf.Tensor, a: tf.Tensor, eps: tf.Tensor) -> tf.Tensor:
    """``log P(U) - log Q(U)`` summed over units, per sample ``[S]``.

    ``= 1/2 ||eps||^2 - 1/2 ||a||^2 - sum_units sum_m log |L_B[m, m]|`` for ``a`` drawn by
    :func:`sample_whitened` from ``eps``. The ``log|L_K|`` terms of P and Q cancel.
    """
    P = tf.shape(a)[-1]
    quad = 0.5 * tf.reduce_sum(tf.square(eps), axis=[-2, -1]) - 0.5 * tf.reduce_sum(tf.square(a), axis=[-2, -1])
    return quad - _units_logdet(L_B, P)


@check_shapes(
    "a_mean: [S, M, P]",
    "return: [S]",
)
def whitened_conditional_kl(L_B: tf.Tensor, a_mean: tf.Tensor) -> tf.Tensor:
    """Analytic ``KL(Q(U) || P(U))`` summed over units, per sample ``[S]``.

    Per unit: ``1/2 [tr B^{-1} + ||a_mean||^2 - M + log|B|]`` (``tr B^{-1} = ||L_B^{-1}||_F^2``).
    This is the conditional KL given the inducing inputs; it equals the expectation of
    ``-`` :func:`whitened_log_ratio`.
    """
    M = tf.shape(a_mean)[-2]
    P = tf.shape(a_mean)[-1]
    dtype = a_mean.dtype
    eye = tf.eye(M, batch_shape=tf.shape(L_B)[:-2], dtype=dtype)
    inv_LB = tf.linalg.triangular_solve(L_B, eye, lower=True)
    trace = tf.reduce_sum(tf.square(inv_LB), axis=[-2, -1])
    if L_B.shape.rank == 3:
        trace = tf.cast(P, dtype) * trace
    else:
        trace = tf.reduce_sum(trace, axis=-1)
    mahal = tf.reduce_sum(tf.square(a_mean), axis=[-2, -1])
    const = tf.cast(M * P, dtype)
    return 0.5 * (trace + mahal - const) + _units_logdet(L_B, P)


@check_shapes(
    "A: [S, M, N]",
    "return: [S, N, P]",
)
def whitened_marginal_variance(L_B: tf.Tensor, A: tf.Tensor, num_units: int) -> tf.Tensor:
    """``|| L_B^{-1} A ||^2`` per column: the extra variance from the inducing posterior.

    For ``f = A^T a`` with ``a ~ N(., B^{-1})`` this is ``diag(A^T B^{-1} A)``, ``[S, N, P]``
    (one column per unit; the columns are equal when ``L_B`` is shared).
    """
    if L_B.shape.rank == 3:
        X = tf.linalg.triangular_solve(L_B, A, lower=True)  # [S, M, N]
        v = tf.reduce_sum(tf.square(X), axis=-2)  # [S, N]
        return tf.repeat(v[..., None], num_units, axis=-1)
    X = tf.linalg.triangular_solve(L_B, A[:, None], lower=True)  # [S, P, M, N]
    return tf.linalg.matrix_transpose(tf.reduce_sum(tf.square(X), axis=-2))


# ============================================================================ parameter store


def _check_choice(value, name, choices):
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"unknown {name} {value!r}; choose one of {', '.join(map(repr, choices))}")
    return value


def _check_int(value, name, minimum=1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return int(value)


def _check_float(value, name, positive=False):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def _check_array(value, name, shape):
    """A finite real array of exactly ``shape`` (a tuple of ints)."""
    if isinstance(value, (tf.Tensor, tf.Variable)):
        value = value.numpy()
    try:
        arr = np.asarray(value)
    except Exception as err:  # pragma: no cover
        raise TypeError(f"{name} cannot be converted to an array: {err}") from err
    if arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    if arr.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(arr.shape)}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains NaN or inf")
    return arr.astype(np.float64)


def _per_layer(value, name, L, default):
    """A per-layer list of floats from None (-> default), a number, or a sequence of L numbers."""
    if value is None:
        value = default
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        value = [value] * L
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, np.ndarray)):
        raise TypeError(f"{name} must be a number or a sequence of {L} numbers, got {type(value).__name__}")
    value = list(value)
    if len(value) != L:
        raise ValueError(f"{name} needs {L} entries (one per layer), got {len(value)}")
    return [_check_float(v, f"{name}[{i}]") for i, v in enumerate(value)]


class _PseudoDataParameters:
    """Shared parameter handling: ``V_l`` and ``Lambda_l`` for every layer.

    Creates ``self.pseudo_outputs`` (list of ``[M_l, N_l]`` Parameters) and, by ``precision``,
    ``self.precision_shape`` (list of ``[M_l, M_l]`` R~) plus ``self.precision_log_scale``
    (list of scalars ``s / rho``), or ``self.log_precision`` (list of ``[Q, M_l]``
    ``log Lambda / rho``).
    """

    def _init_pseudo_data(self, Ms, widths, V_init, log_prec_init, precision, rho):
        self.precision = _check_choice(precision, "precision", PRECISIONS)
        self.rho = _check_float(rho, "rho", positive=True)
        dtype = gpflow.default_float()
        self.pseudo_outputs = [
            gpflow.Parameter(np.asarray(V, dtype=dtype), name=f"pseudo_outputs_{l}") for l, V in enumerate(V_init)
        ]
        if precision == "full":
            self.precision_shape = [
                gpflow.Parameter(np.eye(M, dtype=dtype), name=f"precision_shape_{l}") for l, M in enumerate(Ms)
            ]
            self.precision_log_scale = [
                gpflow.Parameter(np.asarray(0.5 * lp / self.rho, dtype=dtype), name=f"precision_log_scale_{l}")
                for l, lp in enumerate(log_prec_init)
            ]
        else:
            self.log_precision = []
            for l, (M, P, lp) in enumerate(zip(Ms, widths, log_prec_init)):
                Q = P if precision == "diagonal" else 1
                self.log_precision.append(
                    gpflow.Parameter(np.full((Q, M), lp / self.rho, dtype=dtype), name=f"log_precision_{l}")
                )

    def full_factor(self, l: int) -> tf.Tensor:
        """``R_l`` ``[M, M]`` with ``Lambda_l = R_l R_l^T`` (``precision="full"`` only)."""
        if self.precision != "full":
            raise AttributeError(f"full_factor needs precision='full', this posterior has {self.precision!r}")
        R = self.precision_shape[l]
        scale = tf.exp(self.rho * self.precision_log_scale[l])
        return scale * R / tf.reduce_mean(tf.linalg.diag_part(R))

    def diag_precision(self, l: int) -> tf.Tensor:
        """``[Q, M]`` diagonal precisions (``Q = N_l`` for "diagonal", 1 for "shared_diagonal")."""
        if self.precision == "full":
            raise AttributeError("diag_precision is not defined for precision='full'; use full_factor")
        return tf.exp(self.rho * self.log_precision[l])

    def precision_matrix(self, l: int) -> tf.Tensor:
        """``Lambda_l`` as dense matrices: ``[M, M]`` (full) or ``[Q, M, M]`` (diagonal kinds)."""
        if self.precision == "full":
            R = self.full_factor(l)
            return tf.linalg.matmul(R, R, transpose_b=True)
        return tf.linalg.diag(self.diag_precision(l))

    def set_precision(self, l: int, log_precision) -> None:
        """Assign a uniform ``Lambda_l = exp(log_precision) I`` (for tests and initialisation)."""
        lp = _check_float(log_precision, "log_precision")
        if self.precision == "full":
            M = self.precision_shape[l].shape[0]
            self.precision_shape[l].assign(np.eye(M))
            self.precision_log_scale[l].assign(0.5 * lp / self.rho)
        else:
            self.log_precision[l].assign(np.full(self.log_precision[l].shape, lp / self.rho))

    def _whitened(self, l: int, L_K: tf.Tensor):
        V = self.pseudo_outputs[l]
        if self.precision == "full":
            return whitened_pseudo_posterior(L_K, V, full_factor=self.full_factor(l))
        return whitened_pseudo_posterior(L_K, V, diag_precision=self.diag_precision(l))


def _layer_mean(layer: GPLayer, H: tf.Tensor, residual_mean: bool) -> tf.Tensor:
    if residual_mean:
        return layer.mean(H)
    shape = tf.concat([tf.shape(H)[:-1], [layer.output_dim]], axis=0)
    return tf.zeros(shape, dtype=H.dtype)


# ============================================================================ global inducing


class GlobalInducingPropagation(NamedTuple):
    """A :class:`Propagation` plus the global-inducing internals (for tests and diagnostics).

    :ivar samples: ``[S, N, N_l]`` data-row samples per layer (last: sampled from mean/var).
    :ivar mean: ``[S, N, P]`` last-layer conditional mean of the data rows.
    :ivar var: ``[S, N, P]`` last-layer conditional variance (clamped at 0).
    :ivar kl: ``[S]`` ``log q - log p`` summed over layers (sampled), or the sum of the analytic
        conditional KLs.
    :ivar inducing: ``[S, M, N_l]`` sampled inducing rows ``U_1 .. U_L`` (``inducing[l]`` is
        the output of layer ``l``).
    :ivar log_ratio: ``[L, S]`` per-layer ``log P(U_l|U_{l-1}) - log Q(U_l|U_{l-1})``.
    :ivar conditional_kl: ``[L, S]`` per-layer analytic conditional KL (computed only with
        ``kl="analytic"``; else None).
    """

    samples: List[tf.Tensor]
    mean: tf.Tensor
    var: tf.Tensor
    kl: tf.Tensor
    inducing: List[tf.Tensor]
    log_ratio: tf.Tensor
    conditional_kl: Optional[tf.Tensor]

    def as_propagation(self) -> Propagation:
        return Propagation(samples=self.samples, mean=self.mean, var=self.var, kl=self.kl)


class GlobalInducingPosterior(DeepPosterior, _PseudoDataParameters):
    """Global-inducing deep GP posterior (O&A §2.4, App. E, Alg. 2).

    Parameters: ``inducing_inputs`` U_0 ``[M, D]``; per layer ``pseudo_outputs[l]`` V_l
    ``[M, N_l]`` and the precision parameters (see the module docstring).

    :param layers: GP layers **without** inducing inputs (``inducing_variable is None``).
    :param num_inducing: M. Optional if ``inducing_inputs`` is given (must then agree);
        default 100 (O&A's UCI setting).
    :param inducing_inputs: initial U_0 ``[M, D]``; default ``N(0, 1)`` draws.
    :param pseudo_outputs: a sequence of L initial ``V_l`` ``[M, N_l]`` (entries may be None);
        default ``N(0, 1)`` for hidden layers and zeros for the last.
    :param log_precision_init: a number or L numbers, ``log Lambda_l`` at initialisation
        (uniform); default -4 for hidden layers and 0 for the last (O&A App. O).
    :param precision: ``"full"`` (default), ``"diagonal"`` or ``"shared_diagonal"``.
    :param kl: ``"sampled"`` (default: the per-sample log-ratio, as in the paper) or
        ``"analytic"`` (the conditional KL given ``U_{l-1}``, per sample).
    :param residual_mean: if True (default) the layer's mean function is applied to inducing and
        data rows alike (prior ``N(m_l(U_{l-1}), K)``); if False the mean functions are ignored
        (bayesfunc's zero-mean GI-GP).
    :param rho: the Adam re-scaling of stored log-precisions (default 3).
    :param seed: seed of the NumPy generator for the default random initial values.
    """

    def __init__(
        self,
        layers: Sequence[GPLayer],
        num_inducing: Optional[int] = None,
        *,
        inducing_inputs=None,
        pseudo_outputs: Optional[Sequence] = None,
        log_precision_init: Union[None, float, Sequence[float]] = None,
        precision: str = "full",
        kl: str = "sampled",
        residual_mean: bool = True,
        rho: float = 3.0,
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        DeepPosterior.__init__(self, layers, name=name)
        for i, layer in enumerate(self.layers):
            if getattr(layer, "inducing_variable", None) is not None:
                raise ValueError(
                    f"layers[{i}] has local inducing_inputs; the global-inducing posterior propagates "
                    "its inducing inputs from U_0 and needs layers built with inducing_inputs=None "
                    "(use LocalInducingPosterior for per-layer inducing inputs)"
                )
        _check_choice(precision, "precision", PRECISIONS)
        self.kl_mode = _check_choice(kl, "kl", KL_MODES)
        if not isinstance(residual_mean, (bool, np.bool_)):
            raise TypeError(f"residual_mean must be a bool, got {type(residual_mean).__name__}")
        self.residual_mean = bool(residual_mean)
        L = self.depth
        D = self.layers[0].input_dim
        rng = np.random.default_rng(seed)

        if num_inducing is not None:
            num_inducing = _check_int(num_inducing, "num_inducing")
        if inducing_inputs is not None:
            Z = np.asarray(inducing_inputs.numpy() if hasattr(inducing_inputs, "numpy") else inducing_inputs)
            if Z.ndim != 2:
                raise ValueError(f"inducing_inputs must have shape [M, {D}], got {list(Z.shape)}")
            if num_inducing is not None and Z.shape[0] != num_inducing:
                raise ValueError(
                    f"inducing_inputs has {Z.shape[0]} rows but num_inducing is {num_inducing}"
                )
            M = Z.shape[0] if num_inducing is None else num_inducing
            if M < 1:
                raise ValueError("inducing_inputs must have at least one row (num_inducing >= 1)")
            U0 = _check_array(Z, "inducing_inputs", (M, D))
        else:
            M = DEFAULT_NUM_INDUCING if num_inducing is None else num_inducing
            U0 = rng.standard_normal((M, D))
        self.num_inducing = M

        widths = [layer.output_dim for layer in self.layers]
        V_init = _initial_pseudo_outputs(pseudo_outputs, [M] * L, widths, rng, zero_last=True)
        log_prec = _per_layer(log_precision_init, "log_precision_init", L, [-4.0] * (L - 1) + [0.0])

        self.inducing_inputs = gpflow.Parameter(np.asarray(U0, dtype=gpflow.default_float()), name="inducing_inputs")
        self._init_pseudo_data([M] * L, widths, V_init, log_prec, precision, rho)

    # ------------------------------------------------------------------ propagation
    def propagate_full(self, X, num_samples: int = 1, noise: NoiseLike = None) -> GlobalInducingPropagation:
        """Like :meth:`propagate`, also returning the sampled inducing rows and per-layer terms."""
        source = as_noise_source(noise)
        dtype = self.inducing_inputs.dtype
        X = tf.convert_to_tensor(X, dtype=dtype) if not isinstance(X, tf.Tensor) else X
        S = num_samples
        jitter = gpflow.config.default_jitter()
        U = tf.broadcast_to(self.inducing_inputs[None], tf.concat([[S], tf.shape(self.inducing_inputs)], 0))
        F = tf.broadcast_to(X[None], tf.concat([[S], tf.shape(X)], 0))
        M = self.num_inducing
        N = tf.shape(X)[0]

        samples, inducing, log_ratios, kls = [], [], [], []
        mean = var = None
        for l, layer in enumerate(self.layers):
            P = layer.output_dim
            Kuu = add_jitter(layer.K(U), jitter)  # [S, M, M]
            L_K = safe_cholesky(Kuu, name=f"K_uu of layer {l} (global inducing)")
            L_B, a_mean = self._whitened(l, L_K)
            eps = source.normal(f"u/{l}", [S, M, P], dtype)
            a = sample_whitened(L_B, a_mean, eps)  # [S, M, P]
            log_ratios.append(whitened_log_ratio(L_B, a, eps))
            if self.kl_mode == "analytic":
                kls.append(whitened_conditional_kl(L_B, a_mean))

            Kuf = layer.K(U, F)  # [S, M, N]
            A = tf.linalg.triangular_solve(L_K, Kuf, lower=True)
            mean = _layer_mean(layer, F, self.residual_mean) + tf.linalg.matmul(A, a, transpose_a=True)
            var = layer.K_diag(F) - tf.reduce_sum(tf.square(A), axis=-2)  # [S, N]
            U = _layer_mean(layer, U, self.residual_mean) + tf.linalg.matmul(L_K, a)
            inducing.append(U)
            if l < self.depth - 1:
                xi = source.normal(f"f/{l}", [S, N, P], dtype)
                F = mean + tf.sqrt(tf.maximum(var, 0.0) + jitter)[..., None] * xi
                samples.append(F)

        var = tf.broadcast_to(tf.maximum(var, 0.0)[..., None], tf.shape(mean))
        samples.append(self.sample_last_layer(mean, var, source, dtype))
        log_ratio = tf.stack(log_ratios)  # [L, S]
        if self.kl_mode == "analytic":
            conditional_kl = tf.stack(kls)
            kl = tf.reduce_sum(conditional_kl, axis=0)
        else:
            conditional_kl = None
            kl = -tf.reduce_sum(log_ratio, axis=0)
        return GlobalInducingPropagation(samples, mean, var, kl, inducing, log_ratio, conditional_kl)

    def propagate(self, X, num_samples: int = 1, noise: NoiseLike = None) -> Propagation:
        """Push ``X`` ``[N, D]`` and the inducing rows through every layer; see the module docs.

        Returns ``samples`` (data rows only, ``[S, N, N_l]`` per layer), the last layer's
        ``mean``/``var`` ``[S, N, P]`` and ``kl`` ``[S]`` (``log q - log p`` summed over layers,
        or the analytic conditional KLs with ``kl="analytic"``).
        """
        return self.propagate_full(X, num_samples, noise).as_propagation()


# ============================================================================= local inducing


class LocalInducingPosterior(DeepPosterior, _PseudoDataParameters):
    """Local-inducing deep GP posterior: the global-inducing Q family with per-layer inducing inputs.

    ``q(U_l) = prod_lambda N(u_lambda | Sigma_l Lambda_l v_lambda, Sigma_l)``, ``Sigma_l =
    (K(Z_{l-1})^{-1} + Lambda_l)^{-1}``, independent across layers; ``Z_{l-1}`` is the layer's
    ``inducing_variable``. Only the data rows are propagated.

    :param layers: GP layers, each with ``inducing_inputs``.
    :param pseudo_outputs: a sequence of L initial ``V_l`` ``[M_l, N_l]`` (entries may be None);
        default ``N(0, 1)`` draws (O&A App. O).
    :param log_precision_init: a number or L numbers; default 0 for every layer.
    :param precision: ``"full"`` (default), ``"diagonal"`` or ``"shared_diagonal"``.
    :param kl: ``"analytic"`` (default): the KL is analytic and the inducing outputs are
        marginalised (each layer's data rows get the Gaussian marginal, DSVI-style);
        ``"sampled"``: each MC sample draws ``U_l ~ q`` (noise ``"u/{l}"``), the data rows are
        conditioned on it, and the regulariser is the sampled log-ratio.
    :param residual_mean: apply the layers' mean functions (default) or ignore them.
    :param rho: Adam re-scaling of stored log-precisions (default 3).
    :param seed: seed of the NumPy generator for the default ``V``.
    """

    def __init__(
        self,
        layers: Sequence[GPLayer],
        *,
        pseudo_outputs: Optional[Sequence] = None,
        log_precision_init: Union[None, float, Sequence[float]] = None,
        precision: str = "full",
        kl: str = "analytic",
        residual_mean: bool = True,
        rho: float = 3.0,
        seed: Optional[int] = None,
        name: Optional[str] = None,
    ):
        DeepPosterior.__init__(self, layers, name=name)
        for i, layer in enumerate(self.layers):
            if getattr(layer, "inducing_variable", None) is None:
                raise ValueError(
                    f"layers[{i}] has no inducing_inputs; the local-inducing posterior needs local "
                    "inducing inputs on every layer (use GlobalInducingPosterior for layers without)"
                )
        _check_choice(precision, "precision", PRECISIONS)
        self.kl_mode = _check_choice(kl, "kl", KL_MODES)
        if not isinstance(residual_mean, (bool, np.bool_)):
            raise TypeError(f"residual_mean must be a bool, got {type(residual_mean).__name__}")
        self.residual_mean = bool(residual_mean)
        L = self.depth
        rng = np.random.default_rng(seed)
        Ms = [layer.num_inducing for layer in self.layers]
        widths = [layer.output_dim for layer in self.layers]
        V_init = _initial_pseudo_outputs(pseudo_outputs, Ms, widths, rng, zero_last=False)
        log_prec = _per_layer(log_precision_init, "log_precision_init", L, 0.0)
        self._init_pseudo_data(Ms, widths, V_init, log_prec, precision, rho)

    def inducing_cholesky(self, l: int) -> tf.Tensor:
        """``chol(K(Z_{l-1}) + jitter I)`` ``[M, M]``."""
        layer = self.layers[l]
        Kuu = add_jitter(layer.K(layer.Z), gpflow.config.default_jitter())
        return safe_cholesky(Kuu, name=f"K_uu of layer {l} (local inducing)")

    def q_moments(self, l: int):
        """``(q_mu [M, N_l], q_sqrt [Q, M, M])``: mean ``Sigma Lambda V`` and ``chol(Sigma)``.

        ``Q = N_l`` for per-unit precisions, else 1. Diagnostic (e.g. comparison with SVGP).
        """
        L_K = self.inducing_cholesky(l)
        L_B, a_mean = self._whitened(l, L_K[None])
        q_mu = tf.linalg.matmul(L_K, a_mean[0])
        if L_B.shape.rank == 3:
            L_B = L_B[:, None]
        eye = tf.eye(tf.shape(L_K)[0], dtype=L_K.dtype)
        # Sigma = L_K B^{-1} L_K^T = (L_K L_B^{-T})(...)^T
        G = tf.linalg.matmul(L_K, tf.linalg.triangular_solve(L_B[0], tf.broadcast_to(eye, tf.shape(L_B[0])),
                                                               lower=True, adjoint=True))
        Sigma = tf.linalg.matmul(G, G, transpose_b=True)
        return q_mu, tf.linalg.cholesky(Sigma)

    def kl_divergence(self) -> tf.Tensor:
        """Sum over layers of the analytic ``KL(q(U_l) || p(U_l))`` (scalar)."""
        terms = []
        for l in range(self.depth):
            L_B, a_mean = self._whitened(l, self.inducing_cholesky(l)[None])
            terms.append(whitened_conditional_kl(L_B, a_mean)[0])
        return tf.add_n(terms)

    def propagate(self, X, num_samples: int = 1, noise: NoiseLike = None) -> Propagation:
        """Push ``X`` ``[N, D]`` through the layers; ``kl`` is ``[S]``.

        Analytic mode: per layer the data rows get ``mean = m(F) + A^T a_mean`` and
        ``var = k_ff - ||A||^2 + ||L_B^{-1} A||^2`` (``A = L_K^{-1} K_uf``); ``kl`` is the analytic KL.
        Sampled mode: ``U_l`` is drawn per sample (``"u/{l}"``) and the data rows are
        conditioned on it; ``kl`` is ``-`` the sampled log-ratio.
        """
        source = as_noise_source(noise)
        dtype = self.pseudo_outputs[0].dtype
        X = tf.convert_to_tensor(X, dtype=dtype) if not isinstance(X, tf.Tensor) else X
        S = num_samples
        N = tf.shape(X)[0]
        jitter = gpflow.config.default_jitter()
        F = tf.broadcast_to(X[None], tf.concat([[S], tf.shape(X)], 0))
        samples, kls = [], []
        mean = var = None
        for l, layer in enumerate(self.layers):
            P = layer.output_dim
            M = layer.num_inducing
            L_K = self.inducing_cholesky(l)  # [M, M]
            L_B, a_mean = self._whitened(l, L_K[None])  # S-axis of 1
            Kuf = layer.K(layer.Z, F)  # [S, M, N]
            A = tf.linalg.triangular_solve(tf.broadcast_to(L_K, tf.concat([[S], tf.shape(L_K)], 0)), Kuf, lower=True)
            prior_var = layer.K_diag(F) - tf.reduce_sum(tf.square(A), axis=-2)  # [S, N]
            m = _layer_mean(layer, F, self.residual_mean)
            if self.kl_mode == "analytic":
                kls.append(tf.fill([S], whitened_conditional_kl(L_B, a_mean)[0]))
                mean = m + tf.linalg.matmul(A, a_mean[0], transpose_a=True)
                L_B_S = tf.broadcast_to(L_B, tf.concat([[S], tf.shape(L_B)[1:]], 0))
                var = prior_var[..., None] + whitened_marginal_variance(L_B_S, A, P)
            else:
                L_B_S = tf.broadcast_to(L_B, tf.concat([[S], tf.shape(L_B)[1:]], 0))
                a_mean_S = tf.broadcast_to(a_mean, [S, M, P])
                eps = source.normal(f"u/{l}", [S, M, P], dtype)
                a = sample_whitened(L_B_S, a_mean_S, eps)
                kls.append(-whitened_log_ratio(L_B_S, a, eps))
                mean = m + tf.linalg.matmul(A, a, transpose_a=True)
                var = tf.broadcast_to(prior_var[..., None], tf.shape(mean))
            if l < self.depth - 1:
                xi = source.normal(f"f/{l}", [S, N, P], dtype)
                F = mean + tf.sqrt(tf.maximum(var, 0.0) + jitter) * xi
                samples.append(F)
        var = tf.maximum(var, 0.0)
        samples.append(self.sample_last_layer(mean, var, source, dtype))
        return Propagation(samples=samples, mean=mean, var=var, kl=tf.add_n(kls))


# ============================================================================= initialisers


def _initial_pseudo_outputs(pseudo_outputs, Ms, widths, rng, zero_last):
    L = len(widths)
    if pseudo_outputs is None:
        pseudo_outputs = [None] * L
    if isinstance(pseudo_outputs, (str, bytes)) or not isinstance(pseudo_outputs, (list, tuple)):
        raise TypeError(f"pseudo_outputs must be a list of {L} arrays (or None), got {type(pseudo_outputs).__name__}")
    if len(pseudo_outputs) != L:
        raise ValueError(f"pseudo_outputs needs {L} entries (one per layer), got {len(pseudo_outputs)}")
    out = []
    for l, (V, M, P) in enumerate(zip(pseudo_outputs, Ms, widths)):
        if V is None:
            V = np.zeros((M, P)) if (zero_last and l == L - 1) else rng.standard_normal((M, P))
        out.append(_check_array(V, f"pseudo_outputs[{l}]", (M, P)))
    return out


def global_inducing_from_data(
    layers: Sequence[GPLayer],
    X,
    Y,
    num_inducing: int,
    *,
    precision: str = "full",
    seed: Optional[int] = None,
    log_precision_hidden: float = -4.0,
    log_precision_output: float = 0.0,
    kl: str = "sampled",
    residual_mean: bool = True,
    rho: float = 3.0,
    name: Optional[str] = None,
) -> GlobalInducingPosterior:
    """A :class:`GlobalInducingPosterior` initialised as in O&A App. O ("Deep GPs").

    * ``U_0`` = the first ``num_inducing`` rows of a shuffled copy of ``X`` (NumPy generator
      seeded with ``seed``), ``V_L`` = the matching rows of ``Y``;
    * hidden ``V_l ~ N(0, 1)`` (same generator);
    * uniform log-precision ``log_precision_hidden`` (-4) for hidden layers and
      ``log_precision_output`` (0) for the last layer.

    :param layers: GP layers without inducing inputs.
    :param X: training inputs ``[N, D]``.
    :param Y: training targets ``[N, P]`` with ``P = layers[-1].output_dim``.
    :param num_inducing: M, at most N.
    :param precision, kl, residual_mean, rho, name: see :class:`GlobalInducingPosterior`.
    """
    layers = list(layers)
    if len(layers) < 1:
        raise ValueError("layers must contain at least one layer (depth >= 1)")
    M = _check_int(num_inducing, "num_inducing")
    Xa = np.asarray(X.numpy() if hasattr(X, "numpy") else X)
    Ya = np.asarray(Y.numpy() if hasattr(Y, "numpy") else Y)
    if Xa.ndim != 2 or Xa.shape[1] != layers[0].input_dim:
        raise ValueError(f"X must have shape [N, {layers[0].input_dim}], got {list(Xa.shape)}")
    P = layers[-1].output_dim
    if Ya.ndim != 2 or Ya.shape[1] != P or Ya.shape[0] != Xa.shape[0]:
        raise ValueError(
            f"Y must have shape [{Xa.shape[0]}, {P}] (one column per output of the last layer) to "
            f"initialise the last pseudo-outputs, got {list(Ya.shape)}"
        )
    if M > Xa.shape[0]:
        raise ValueError(f"num_inducing ({M}) exceeds the number of rows of X ({Xa.shape[0]})")
    for arr, nm in ((Xa, "X"), (Ya, "Y")):
        if arr.dtype.kind not in "fiu":
            raise TypeError(f"{nm} must hold real numbers, got dtype {arr.dtype}")
        if not np.all(np.isfinite(arr)):
            raise ValueError(f"{nm} contains NaN or inf")
    lp_hidden = _check_float(log_precision_hidden, "log_precision_hidden")
    lp_out = _check_float(log_precision_output, "log_precision_output")
    rng = np.random.default_rng(seed)
    idx = rng.permutation(Xa.shape[0])[:M]
    V = [rng.standard_normal((M, layer.output_dim)) for layer in layers[:-1]] + [Ya[idx]]
    return GlobalInducingPosterior(
        layers,
        M,
        inducing_inputs=Xa[idx],
        pseudo_outputs=V,
        log_precision_init=[lp_hidden] * (len(layers) - 1) + [lp_out],
        precision=precision,
        kl=kl,
        residual_mean=residual_mean,
        rho=rho,
        name=name,
    )


def local_inducing_from_data(
    layers: Sequence[GPLayer],
    X=None,
    Y=None,
    *,
    precision: str = "full",
    seed: Optional[int] = None,
    log_precision: float = 0.0,
    kl: str = "analytic",
    residual_mean: bool = True,
    rho: float = 3.0,
    name: Optional[str] = None,
) -> LocalInducingPosterior:
    """A :class:`LocalInducingPosterior` initialised as in O&A App. O: ``V_l ~ N(0, 1)``, log-precision 0.

    The inducing inputs ``Z_l`` live on the layers (O&A draw them ``N(0, 1)``; that is the
    layer builder's job). ``X`` and ``Y`` are accepted for symmetry with
    :func:`global_inducing_from_data` and are not used.

    :param layers: GP layers with ``inducing_inputs``.
    :param seed: seed of the NumPy generator for ``V``.
    :param precision, kl, residual_mean, rho, name: see :class:`LocalInducingPosterior`.
    """
    del X, Y
    lp = _check_float(log_precision, "log_precision")
    return LocalInducingPosterior(
        layers,
        log_precision_init=lp,
        precision=precision,
        kl=kl,
        residual_mean=residual_mean,
        rho=rho,
        seed=seed,
        name=name,
    )
