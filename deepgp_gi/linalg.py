"""Numerically careful linear algebra shared by every posterior.

The one rule: never form the inverse of a kernel matrix. Everything goes through
:func:`safe_cholesky` and triangular solves.

Failures and compiled code
--------------------------
:func:`safe_cholesky` raises :class:`CholeskyError` when a matrix stays indefinite after the
jitter escalation. Eagerly it raises at once. Inside a ``tf.function`` (XLA-compiled or not) an
exception cannot leave the device without a host round-trip per factorisation, so instead each
call records a boolean failure flag, with a static message, into the active
:func:`cholesky_checks` collector; the compiled function returns ``checks.status()`` (an int32
scalar, 0 when every factorisation succeeded) and the caller turns it into the exception with
:func:`raise_if_failed` when it next reads results anyway. ``fit`` does this for you;
:func:`checked_function` does it for your own functions::

    @dg.linalg.checked_function(jit_compile=True)
    def step(A):
        return dg.safe_cholesky(A, name="my matrix")

    step(tf.constant([[1.0, 2.0], [2.0, 1.0]], tf.float64))  # raises CholeskyError

A ``tf.function`` traced with no collector active falls back to ``tf.debugging.Assert`` (raises
a plain ``tf.errors.InvalidArgumentError`` with the same message); XLA drops that assertion, so
under ``jit_compile=True`` use a collector.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import warnings
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

__all__ = [
    "safe_cholesky",
    "CholeskyError",
    "CholeskyChecks",
    "cholesky_checks",
    "raise_if_failed",
    "failure_message",
    "checked_function",
    "add_jitter",
    "base_jitter",
    "compiled_ladder",
    "CholeskyWithInverse",
    "cholesky_with_inverse",
    "cholesky_and_solve",
    "triangular_solve_with_inverse",
]


class CholeskyError(tf.errors.InvalidArgumentError):
    """A matrix was not positive definite even after the jitter escalation.

    A subclass of ``tf.errors.InvalidArgumentError``, so ``except tf.errors.InvalidArgumentError``
    catches it too. The message names the matrix, its shape and dtype, and the jitter tried.
    """

    def __init__(self, message: str):
        super().__init__(None, None, message)

    def __reduce__(self):  # picklable (OpError's own __reduce__ expects node_def, op, message)
        return (type(self), (self.message,))


def base_jitter(dtype: tf.DType) -> float:
    """Relative jitter of the first escalation step for ``dtype`` (times the mean diagonal)."""
    return 1e-8 if dtype == tf.float64 else 1e-5


@check_shapes("A: [batch..., N, N]", "return: [batch..., N, N]")
def add_jitter(A: tf.Tensor, jitter) -> tf.Tensor:
    """``A + jitter * I``; ``jitter`` is a scalar or broadcasts against ``A``'s batch shape.

    An addition of a diagonal matrix rather than ``tf.linalg.set_diag``: the gradient of
    ``set_diag`` on a matrix whose shape is only known at run time builds a zeros tensor of a
    dynamic-rank shape, which XLA cannot compile, and runs three ``tf.cond``s otherwise. When
    ``N`` is static the diagonal matrix is ``jitter * I`` with ``I`` a constant (two elementwise
    kernels forward, one backward); otherwise it is built from ``A``'s diagonal.
    """
    jitter = tf.convert_to_tensor(jitter, dtype=A.dtype)
    n = A.shape[-1]
    if n is not None:
        eye = tf.eye(n, dtype=A.dtype)
        scaled = (
            jitter * eye
            if jitter.shape.rank == 0
            else tf.expand_dims(tf.expand_dims(jitter, -1), -1) * eye
        )
        return A + scaled
    diag = tf.zeros_like(tf.linalg.diag_part(A)) + tf.expand_dims(jitter, -1)
    return A + tf.linalg.diag(diag)


def _finite_per_matrix(L: tf.Tensor) -> tf.Tensor:
    return tf.reduce_all(tf.math.is_finite(L), axis=[-2, -1])


# --------------------------------------------------------------------------- failure registry

_MESSAGES: List[str] = [""]  # code -> message; code 0 means "no failure"
_CODES: Dict[str, int] = {}
_REGISTRY_LOCK = threading.Lock()
_ACTIVE = threading.local()


def _code_for(message: str) -> int:
    with _REGISTRY_LOCK:
        code = _CODES.get(message)
        if code is None:
            code = len(_MESSAGES)
            _MESSAGES.append(message)
            _CODES[message] = code
        return code


def _active_collectors() -> List["CholeskyChecks"]:
    stack = getattr(_ACTIVE, "stack", None)
    if stack is None:
        stack = _ACTIVE.stack = []
    return stack


class CholeskyChecks:
    """Failure flags recorded by :func:`safe_cholesky` while tracing one function.

    Created by :func:`cholesky_checks`; only factorisations traced in the same graph (the same
    ``tf.function`` trace) as the collector's creation are recorded.
    """

    def __init__(self):
        self.graph = tf.compat.v1.get_default_graph()
        self._flags: List[Tuple[tf.Tensor, int]] = []

    def _record(self, failed: tf.Tensor, code: int) -> None:
        self._flags.append((failed, code))

    @property
    def num_checks(self) -> int:
        """How many factorisations have been recorded."""
        return len(self._flags)

    def status(self) -> tf.Tensor:
        """An int32 scalar: 0 if no recorded factorisation failed, else the first failure's code.

        Branch-free (``tf.where``); return it from the compiled function and pass it to
        :func:`raise_if_failed` on the host.
        """
        status = tf.constant(0, tf.int32)
        for failed, code in reversed(self._flags):
            status = tf.where(failed, tf.constant(code, tf.int32), status)
        return status


@contextlib.contextmanager
def cholesky_checks() -> Iterator[CholeskyChecks]:
    """Collect the failure flags of every :func:`safe_cholesky` traced inside the block.

    Use it inside the body of a ``tf.function`` and return ``checks.status()``::

        @tf.function(jit_compile=True)
        def step(A):
            with dg.linalg.cholesky_checks() as checks:
                L = dg.safe_cholesky(A)
            return L, checks.status()

        L, status = step(A)
        dg.linalg.raise_if_failed(status)
    """
    collector = CholeskyChecks()
    stack = _active_collectors()
    stack.append(collector)
    try:
        yield collector
    finally:
        stack.remove(collector)


def failure_message(status) -> Optional[str]:
    """The message of a :meth:`CholeskyChecks.status` value, or ``None`` for 0 (no failure)."""
    code = int(status)
    if code == 0:
        return None
    return _MESSAGES[code]


def raise_if_failed(status, context: str = "") -> None:
    """Raise :class:`CholeskyError` if ``status`` (from :meth:`CholeskyChecks.status`) is non-zero.

    Reads ``status`` on the host (one device-to-host copy of a scalar). ``context`` is appended
    to the message (``fit`` passes the step number).
    """
    message = failure_message(status)
    if message is not None:
        raise CholeskyError(message + (f" ({context})" if context else ""))


def checked_function(fn=None, **tf_function_kwargs):
    """``tf.function`` whose :func:`safe_cholesky` failures raise :class:`CholeskyError`.

    Accepts ``tf.function``'s keyword arguments (``jit_compile=True``, ``input_signature``...).
    Every call reads one int32 scalar back from the device to decide whether to raise.
    """

    def decorate(fn):
        def with_status(*args, **kwargs):
            with cholesky_checks() as checks:
                out = fn(*args, **kwargs)
            return out, checks.status()

        compiled = tf.function(with_status, **tf_function_kwargs)

        @functools.wraps(fn)
        def call(*args, **kwargs):
            out, status = compiled(*args, **kwargs)
            raise_if_failed(status)
            return out

        return call

    return decorate if fn is None else decorate(fn)


def in_xla_context() -> bool:
    try:
        from tensorflow.python.ops import control_flow_util

        return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
    except Exception:  # pragma: no cover - private API moved
        return False


# --------------------------------------------------------------------------- the factorisation


def _cholesky_backward(L: tf.Tensor, dL: tf.Tensor) -> tf.Tensor:
    """Reverse-mode derivative of ``L = chol(A)`` (TensorFlow's formula, symmetrised).

    ``dA = sym(L^-H Phi(L^H dL) L^-1) / 2`` with ``Phi`` the lower triangle with a halved
    diagonal, by two triangular solves: no explicit inverse and no ``tf.eye`` of a dynamic batch
    shape (XLA cannot build that when the shape is only known at run time).

    With a static size, ``Phi`` and the final halving are one product with a constant mask (1/2
    below the diagonal, 1/4 on it) after the band part: four kernels fewer than ``set_diag`` of a
    halved ``diag_part`` and a last multiplication, and the same values (halving is exact in
    floating point and the solves are linear). The second solve gives ``grad^H`` itself, so
    ``grad + grad^H`` needs one transpose, not two.
    """
    middle = tf.linalg.band_part(tf.linalg.matmul(L, dL, adjoint_a=True), -1, 0)
    n = L.shape[-1]
    if n is not None:
        mask = np.tril(np.full((n, n), 0.5)) - 0.25 * np.eye(n)
        middle = middle * tf.constant(mask, dtype=L.dtype)
    else:
        middle = 0.5 * tf.linalg.set_diag(middle, 0.5 * tf.linalg.diag_part(middle))
    left = tf.linalg.triangular_solve(L, middle, lower=True, adjoint=True)  # L^-H middle
    grad_h = tf.linalg.triangular_solve(
        L, tf.linalg.adjoint(left), lower=True, adjoint=True
    )  # grad^H
    return grad_h + tf.linalg.adjoint(grad_h)


def _matrix_axes(flags: tf.Tensor) -> tf.Tensor:
    """``flags[..., None, None]`` as two ``ExpandDims`` (a new-axis slice is a ``StridedSlice``,
    one more executed op)."""
    return tf.expand_dims(tf.expand_dims(flags, -1), -1)


def compiled_ladder(max_tries: int) -> List[int]:
    """The escalation steps ``k`` tried in compiled code: the first, middle and last of
    ``0 .. max_tries-1`` (eager code tries every ``k`` in turn, stopping at the first success)."""
    if max_tries <= 0:
        return []
    return sorted({0, max_tries // 2, max_tries - 1})


@contextlib.contextmanager
def accelerator_branch() -> Iterator[None]:
    """Within this context, :func:`safe_cholesky` is traced on its accelerator branch (the
    branch-free jitter ladder a GPU step runs, plain or XLA) even when no GPU is visible: to count
    on a CPU the ops a GPU step runs (``benchmarks/gpu.py --accelerator-branch``) and to test that
    branch. Functions traced inside keep the branch; the setting is per thread."""
    previous = getattr(_ACTIVE, "accelerator", False)
    _ACTIVE.accelerator = True
    try:
        yield
    finally:
        _ACTIVE.accelerator = previous


def _host_is_the_device() -> bool:
    """True when no GPU is visible (and :func:`accelerator_branch` is not active): every tensor
    lives on the host, so reading a predicate in a ``tf.cond`` costs no device-to-host transfer."""
    if getattr(_ACTIVE, "accelerator", False):
        return False
    return not tf.config.list_logical_devices("GPU")


def _ladder(A, L, ok, jitter, scale, ladder, skip, factorise=tf.linalg.cholesky):
    """Refactorise the failed members with jitter ``start * 10**k * scale`` for ``k`` in ``ladder``,
    each keeping the first that works; ``skip`` (or None) replaces members that already succeeded.
    ``factorise`` maps ``[..., N, N]`` matrices to their factors (``[..., N, N]`` or wider, as
    :func:`cholesky_with_inverse`'s unrolled ``[L^T | L^{-1}]``); a factor is kept where finite.

    The retries are independent of each other, so they are one batched factorisation of the
    ``K = len(ladder)`` jittered copies ``[K, batch..., N, N]`` (one kernel launch, not ``K``),
    followed by a selection of each member's first success (last to first with ``tf.where``)."""
    ladder = list(ladder)
    if not ladder:
        return L, jitter
    start = base_jitter(A.dtype)
    steps = tf.constant([start * 10.0**k for k in ladder], A.dtype)
    trials = tf.reshape(steps, [len(ladder)] + [1] * scale.shape.rank) * scale  # [K, batch...]
    B = add_jitter(tf.expand_dims(A, 0), trials)  # [K, batch..., N, N]
    if skip is not None:
        B = tf.where(tf.expand_dims(_matrix_axes(ok), 0), skip, B)
    K = len(ladder)
    factors = factorise(B)
    # unstacked once each (three ops), not sliced per rung
    worked = tf.unstack(_finite_per_matrix(factors), num=K)  # K x [batch...]
    factors, trials = tf.unstack(factors, num=K), tf.unstack(trials, num=K)
    new_L, new_jitter = factors[-1], trials[-1]
    for i in reversed(range(K - 1)):
        new_L = tf.where(_matrix_axes(worked[i]), factors[i], new_L)
        new_jitter = tf.where(worked[i], trials[i], new_jitter)
    return tf.where(_matrix_axes(ok), L, new_L), tf.where(ok, jitter, new_jitter)


def _jitter_scale(A: tf.Tensor) -> tf.Tensor:
    """Per member, the mean absolute diagonal of ``A`` (1 where it is 0): the unit of the jitter."""
    scale = tf.reduce_mean(tf.abs(tf.linalg.diag_part(A)), axis=-1)
    return tf.where(scale > 0, scale, tf.ones_like(scale))


def _escalated(
    A: tf.Tensor, max_tries: int, factorise=tf.linalg.cholesky
) -> Tuple[tf.Tensor, tf.Tensor, Optional[tf.Tensor]]:
    """(L, jitter used per member, failed) with per-member escalation; no gradient (see
    safe_cholesky). ``failed`` is the scalar "some member is still not finite" where the regime
    knows it without another check, else None. ``factorise``: as :func:`_ladder`'s.

    Three regimes, all without a host round-trip on an accelerator:

    * eagerly, each step of the ladder in turn, stopping when every member succeeded;
    * compiled with no GPU visible (tensors live on the host), plain or XLA, a ``tf.cond`` on
      "every member succeeded": the common case costs nothing beyond the one factorisation and
      its finiteness check (the jitter's scale, the ladder and the final check are in the other
      branch), and the full ladder runs only when needed (XLA compiles the ``cond`` to a
      conditional, whose predicate is already on the host);
    * compiled with a GPU visible: a fixed, branch-free subset of the ladder
      (:func:`compiled_ladder`) selected with ``tf.where``.
    """
    L = factorise(A)
    if _host_is_the_device() and not tf.executing_eagerly():
        # one reduction over every entry for the predicate; the per-member flags are needed (and
        # computed) only in the retry branch
        def retry():
            ok = _finite_per_matrix(L)
            scale = _jitter_scale(A)
            new_L, jitter = _ladder(
                A, L, ok, tf.zeros_like(scale), scale, range(max_tries), None, factorise
            )
            return new_L, jitter, tf.logical_not(tf.reduce_all(_finite_per_matrix(new_L)))

        batch = A.shape[:-2]
        no_jitter = (
            (lambda: tf.zeros(batch, A.dtype))
            if batch.is_fully_defined()
            else (lambda: tf.zeros(tf.shape(A)[:-2], A.dtype))
        )
        return tf.cond(
            tf.reduce_all(tf.math.is_finite(L)), lambda: (L, no_jitter(), tf.constant(False)), retry
        )
    ok = _finite_per_matrix(L)
    if tf.executing_eagerly():
        scale = _jitter_scale(A)
        jitter = tf.zeros_like(scale)
        for k in range(max_tries):
            if bool(tf.reduce_all(ok)):
                break
            L, jitter = _ladder(A, L, ok, jitter, scale, [k], None, factorise)
            ok = _finite_per_matrix(L)
        return L, jitter, None
    # Members that already succeeded get a stand-in matrix instead of a refactorisation: -I makes
    # TensorFlow's (Eigen) kernel stop at the first pivot, so in the common case the retries cost
    # a few copies, not factorisations. XLA's expander does not stop early and is slow on NaN, so
    # there the stand-in is +I.
    scale = _jitter_scale(A)
    n = A.shape[-1] if A.shape[-1] is not None else tf.shape(A)[-1]
    skip = (1.0 if in_xla_context() else -1.0) * tf.eye(n, dtype=A.dtype)  # broadcast by tf.where
    L, jitter = _ladder(
        A, L, ok, tf.zeros_like(scale), scale, compiled_ladder(max_tries), skip, factorise
    )
    return L, jitter, None


@check_shapes("A: [batch..., N, N]", "return: [batch..., N, N]")
def safe_cholesky(A: tf.Tensor, *, max_tries: int = 6, name: str = "matrix") -> tf.Tensor:
    """Lower Cholesky factor of the symmetric matrices ``A``, with escalating jitter.

    The plain factorisation is tried first. Batch members whose factor is not finite (the matrix
    was not numerically positive definite) are refactorised with jitter
    ``base_jitter(dtype) * mean(diag(A)) * 10**k`` added to the diagonal, ``k = 0 .. max_tries-1``,
    each member keeping the smallest jitter that works. Eagerly, the retries stop as soon as every
    member succeeds. In a ``tf.function`` on a machine with no GPU (plain or XLA-compiled), a
    ``tf.cond`` skips the retries when every member succeeded (the predicate already lives on
    the host: no transfer). With a GPU visible, a fixed, branch-free subset of the ladder is tried
    (:func:`compiled_ladder`: ``k`` = first, middle, last), as one batched factorisation of the
    jittered copies, and selected with ``tf.where``: no
    ``tf.cond``/``tf.while_loop`` whose predicate the host would have to read; members that
    already succeeded are not refactorised (see ``_escalated``), so the common case costs one
    factorisation plus a few copies.

    If some member still fails, :class:`CholeskyError` is raised naming ``name``, the shape, the
    dtype and the last jitter tried: eagerly at once; in compiled code through the active
    :func:`cholesky_checks` collector (see the module docstring).

    The gradient is that of ``chol(A + jitter * I)`` with the jitter each member used, computed
    from the selected factor only (failed attempts never leak NaN into it).

    :param A: symmetric matrices, shape [batch..., N, N].
    :param max_tries: how many escalation steps (each 10x the previous jitter).
    :param name: a human name for the matrix, used in the error message.
    :return: lower-triangular factors, shape [batch..., N, N].
    """
    A = tf.convert_to_tensor(A)
    max_tries = int(max_tries)
    if max_tries < 0:
        raise ValueError(f"max_tries must be >= 0, got {max_tries}")

    jitter_out, failed_out = [], []

    @tf.custom_gradient
    def factor(A):
        L, jitter, failed = _escalated(A, max_tries)
        jitter_out.append(jitter)
        failed_out.append(failed)

        def grad(dL):
            return _cholesky_backward(L, dL)

        return L, grad

    return _reported(factor(A), A, failed_out[0], jitter_out[0], max_tries, name)


def _reported(
    L: tf.Tensor,
    A: tf.Tensor,
    failed: Optional[tf.Tensor],
    jitter: tf.Tensor,
    max_tries: int,
    name: str,
) -> tf.Tensor:
    """``L`` once its failures are reported (:func:`safe_cholesky`'s contract): eagerly a
    :class:`CholeskyError` if some member is not finite; compiled, the failure flag recorded into
    the active :func:`cholesky_checks` collectors, else a ``tf.debugging.Assert`` (none under
    XLA). ``failed``: the scalar flag where :func:`_escalated` knows it, else None (checked here);
    ``jitter``: the jitter per member (for the eager message)."""
    ok = _finite_per_matrix(L) if failed is None else None
    rel = base_jitter(A.dtype) * 10.0 ** (max_tries - 1) if max_tries else 0.0
    head = (
        f"safe_cholesky: {name} is not positive definite (shape {A.shape.as_list()}, "
        f"{A.dtype.name}) even with jitter up to {rel:.1e} x its mean diagonal"
    )
    tail = "; check the inputs for NaN/inf, a collapsed lengthscale or a kernel variance near zero"

    if tf.executing_eagerly():
        if not bool(tf.reduce_all(ok)):
            last = float(tf.reduce_max(tf.where(ok, tf.zeros_like(jitter), jitter)))
            raise CholeskyError(f"{head} (last jitter tried: {last:.3e}){tail}")
        return L

    message = head + tail
    if failed is None:
        failed = tf.logical_not(tf.reduce_all(ok))
    graph = tf.compat.v1.get_default_graph()
    collectors = [c for c in _active_collectors() if c.graph is graph]
    if collectors:
        code = _code_for(message)
        for collector in collectors:
            collector._record(failed, code)
        return L
    if in_xla_context():
        warnings.warn(
            f"safe_cholesky({name}) traced in an XLA-compiled function without "
            "deepgp_gi.linalg.cholesky_checks(): a failed factorisation will return NaN silently",
            RuntimeWarning,
            stacklevel=3,
        )
        return L
    check = tf.debugging.Assert(tf.logical_not(failed), [message])
    with tf.control_dependencies([check]):
        return tf.identity(L)


# --------------------------------------------------------------------------- factor and inverse


class CholeskyWithInverse(NamedTuple):
    """What :func:`cholesky_with_inverse` returns.

    :ivar factor: ``L = chol(A)`` ``[batch..., N, N]`` (lower triangular).
    :ivar inverse: ``L^{-1}`` ``[batch..., N, N]`` (lower triangular).
    """

    factor: tf.Tensor
    inverse: tf.Tensor


def _unrolled_factor(A: tf.Tensor) -> tf.Tensor:
    """``[L^T | L^{-1}]`` ``[batch..., n, 2n]`` of ``L = chol(A)`` for a static, small ``n``, by
    symmetric elimination on ``[A | I]`` written as elementwise operations over the batch: ``n``
    steps of a few operations each (no Cholesky or triangular-solve kernel, so the operations do
    not depend on the batch size on any device).

    Step ``j`` scales row ``j`` by ``1 / sqrt(pivot)`` (it is then row ``j`` of ``[L^T | L^{-1}]``)
    and subtracts ``W[i, j] / sqrt(pivot) = L[i, j]`` times it from every row ``i``. For ``i > j``
    that is the elimination; the rows ``i <= j`` are finished (their scaled copies are kept) and
    what the subtraction leaves in them is never read again, so no mask selects the rows (eight
    operations a step). A pivot that is not positive makes the member's factor non-finite, which
    the jitter ladder and the failure report see. The left half's entries below the diagonal are
    rounding residues of the elimination: the caller keeps the upper triangle of ``L^T``."""
    n = A.shape[-1]
    W = tf.concat([A, tf.broadcast_to(tf.eye(n, dtype=A.dtype), tf.shape(A))], axis=-1)
    rows = []
    for j in range(n):
        row = W[..., j : j + 1, :]  # [..., 1, 2n]
        scale = tf.math.rsqrt(row[..., j : j + 1])  # [..., 1, 1]
        row = row * scale
        rows.append(row)
        if j + 1 < n:
            W = (
                W - (W[..., :, j : j + 1] * scale) * row
            )  # column j of W times 1 / sqrt(pivot): L[i, j] for i > j
    return tf.concat(rows, axis=-2)


def _escalated_in_one_pass(
    A: tf.Tensor, max_tries: int, factorise
) -> Tuple[tf.Tensor, tf.Tensor, None]:
    """The branch-free jitter ladder of a compiled step with a GPU visible (:func:`_escalated`'s
    third regime) with the plain factorisation as its first rung: ``A`` and its jittered copies
    (:func:`compiled_ladder`) are factorised by one call of ``factorise`` over ``[K + 1, batch...]``
    and each member keeps its first finite factor (an added jitter of ``0 * scale`` leaves the first
    copy equal to ``A``). One factorisation kernel instead of two (the plain one, then the ladder's
    of stand-ins), for ``K + 1`` times the flops of one: on an accelerator, where a small
    factorisation costs its launches, not its arithmetic, this halves a factorisation's launches;
    for :func:`_unrolled_factor`, whose operations do not depend on the batch, its operations."""
    ladder = compiled_ladder(max_tries)
    scale = _jitter_scale(A)
    start = base_jitter(A.dtype)
    steps = tf.constant([0.0] + [start * 10.0**k for k in ladder], A.dtype)
    trials = (
        tf.reshape(steps, [len(ladder) + 1] + [1] * scale.shape.rank) * scale
    )  # [K + 1, batch...]
    factors = factorise(add_jitter(tf.expand_dims(A, 0), trials))
    worked = tf.unstack(_finite_per_matrix(factors), num=len(ladder) + 1)
    factors, trials = (
        tf.unstack(factors, num=len(ladder) + 1),
        tf.unstack(trials, num=len(ladder) + 1),
    )
    F, jitter = factors[-1], trials[-1]
    for i in reversed(range(len(ladder))):
        F = tf.where(_matrix_axes(worked[i]), factors[i], F)
        jitter = tf.where(worked[i], trials[i], jitter)
    return F, jitter, None


def _factor_with_ladder(A: tf.Tensor, max_tries: int, factorise=tf.linalg.cholesky):
    """``(factor, jitter, failed)`` of :func:`cholesky_with_inverse` and :func:`cholesky_and_solve`:
    no ladder for ``max_tries=0`` (one factorisation; a failure is reported, not repaired); else
    :func:`_escalated`'s regimes, except that with a GPU visible the factorisation and its ladder
    are one pass (:func:`_escalated_in_one_pass`)."""
    if max_tries == 0:
        return factorise(A), tf.zeros(tf.shape(A)[:-2], A.dtype), None
    if tf.executing_eagerly() or _host_is_the_device():
        return _escalated(A, max_tries, factorise)
    return _escalated_in_one_pass(A, max_tries, factorise)


def _inverse_backward(
    L: tf.Tensor,
    T: tf.Tensor,
    dL: Optional[tf.Tensor],
    solved: Optional[tf.Tensor],
    d_solved: Optional[tf.Tensor],
) -> tf.Tensor:
    """Reverse-mode derivative ``dA`` of ``L = chol(A)`` and ``Y = L^{-1} Z`` (``Z`` constant) from
    the upstream ``dL`` and ``dY`` (either may be None), written with ``T = L^{-1}``: products only.

    ``Y`` adds ``-T^T dY Y^T`` to ``dL``; then ``dA = T^T (P + P^T) T`` with ``P`` the lower
    triangle of ``L^T dL`` halved below the diagonal and quartered on it, which
    is :func:`_cholesky_backward` with its two triangular solves replaced by products with ``T``.
    Only the lower triangle of ``dL`` enters (``L^T`` is upper triangular), as in TensorFlow's own
    Cholesky gradient."""
    if d_solved is not None:
        correction = tf.linalg.matmul(
            T, tf.linalg.matmul(d_solved, solved, transpose_b=True), transpose_a=True
        )
        dL = -correction if dL is None else dL - correction
    if dL is None:
        return tf.zeros_like(L)
    middle = tf.linalg.band_part(tf.linalg.matmul(L, dL, transpose_a=True), -1, 0)
    n = L.shape[-1]
    if n is not None:
        middle = middle * tf.constant(
            np.tril(np.full((n, n), 0.5)) - 0.25 * np.eye(n), dtype=L.dtype
        )
    else:
        middle = 0.5 * tf.linalg.set_diag(middle, 0.5 * tf.linalg.diag_part(middle))
    symmetric = middle + tf.linalg.matrix_transpose(middle)
    return tf.linalg.matmul(tf.linalg.matmul(T, symmetric, transpose_a=True), T)


def _validated_tries(max_tries) -> int:
    max_tries = int(max_tries)
    if max_tries < 0:
        raise ValueError(f"max_tries must be >= 0, got {max_tries}")
    return max_tries


def _eye_like(A: tf.Tensor) -> tf.Tensor:
    """``I`` of ``A``'s shape ``[batch..., N, N]`` (``[N, N]`` when ``A`` has no batch axes)."""
    n = A.shape[-1] if A.shape[-1] is not None else tf.shape(A)[-1]
    eye = tf.eye(n, dtype=A.dtype)
    return eye if A.shape.rank == 2 else tf.broadcast_to(eye, tf.shape(A))


@check_shapes("A: [batch..., N, N]", "return[0]: [batch..., N, N]", "return[1]: [batch..., N, N]")
def cholesky_with_inverse(
    A: tf.Tensor, *, max_tries: int = 6, unrolled: bool = False, name: str = "matrix"
) -> CholeskyWithInverse:
    """:func:`safe_cholesky`'s factor ``L`` of ``A`` and its inverse ``L^{-1}``, with a gradient
    that needs no solve.

    The jitter ladder (``max_tries`` rungs) and the failure report are :func:`safe_cholesky`'s,
    except that with a GPU visible the plain factorisation is the ladder's first rung, all in one
    batched factorisation (``_escalated_in_one_pass``), and that ``max_tries=0`` (for matrices
    positive definite by construction, such as ``I + C^T C``) factorises once, with no ladder and
    no ``tf.cond``, still reporting a failure. The inverse is one triangular solve against ``I``.
    The reverse-mode derivative is written with the inverse (products only, ``_inverse_backward``)
    where :func:`safe_cholesky`'s takes two triangular solves. Solves by ``L`` whose gradient should
    use the inverse: :func:`triangular_solve_with_inverse`, or
    :func:`cholesky_and_solve` for a right-hand side known with ``A``.

    ``unrolled=True`` (a static, small ``N``, e.g. a covariance per data point): factor and
    inverse by elimination written as elementwise operations over the batch
    (``_unrolled_factor``), about ``9 N`` operations whatever the batch size and no Cholesky
    or triangular-solve kernel, whose launches on a GPU can grow with the number of matrices.

    :param A: symmetric matrices ``[batch..., N, N]``.
    :param max_tries: jitter escalation steps, as :func:`safe_cholesky`.
    :param unrolled: the elementwise factorisation (needs a static ``N``).
    :param name: the matrix's name in the failure message.
    :return: a :class:`CholeskyWithInverse`.
    """
    A = tf.convert_to_tensor(A)
    max_tries = _validated_tries(max_tries)
    if unrolled and A.shape[-1] is None:
        raise ValueError("cholesky_with_inverse(unrolled=True) needs the matrix size at trace time")

    @tf.custom_gradient
    def factor(A):
        if not unrolled:
            L, jitter, failed = _factor_with_ladder(A, max_tries)
            L = _reported(L, A, failed, jitter, max_tries, name)
            T = tf.linalg.triangular_solve(L, _eye_like(A), lower=True)
        else:
            F, jitter, failed = _factor_with_ladder(A, max_tries, _unrolled_factor)
            upper, T = tf.split(_reported(F, A, failed, jitter, max_tries, name), 2, axis=-1)
            L = tf.linalg.band_part(tf.linalg.matrix_transpose(upper), -1, 0)

        def grad(dL, dT):
            return _inverse_backward(L, T, dL, T, dT)

        return (L, T), grad

    return CholeskyWithInverse(*factor(A))


@check_shapes(
    "A: [batch..., N, N]",
    "rhs: [batch..., N, K]",
    "return[0]: [batch..., N, N]",
    "return[1]: [batch..., N, K]",
)
def cholesky_and_solve(
    A: tf.Tensor, rhs: tf.Tensor, *, max_tries: int = 6, name: str = "matrix"
) -> Tuple[tf.Tensor, tf.Tensor]:
    """``(L, L^{-1} rhs)`` with ``L`` the factor of ``A`` (with the ladder and report of
    :func:`cholesky_with_inverse`), from one triangular solve of ``[I | rhs]``: the inverse
    ``L^{-1}`` it also gives is kept for the gradient, which is then products only
    (``_inverse_backward``), where :func:`safe_cholesky` followed by a solve takes three triangular
    solves. The values of ``L^{-1} rhs`` are those of the solve.

    :param A: symmetric matrices ``[batch..., N, N]``.
    :param rhs: right-hand sides ``[batch..., N, K]`` (``A``'s batch shape).
    :param max_tries: jitter escalation steps, as :func:`safe_cholesky`.
    :param name: the matrix's name in the failure message.
    :return: ``(L [batch..., N, N], L^{-1} rhs [batch..., N, K])``.
    """
    A, rhs = tf.convert_to_tensor(A), tf.convert_to_tensor(rhs)
    max_tries = _validated_tries(max_tries)

    @tf.custom_gradient
    def factor_and_solve(A, rhs):
        L, jitter, failed = _factor_with_ladder(A, max_tries)
        L = _reported(L, A, failed, jitter, max_tries, name)
        n = A.shape[-1] if A.shape[-1] is not None else tf.shape(A)[-1]
        T, X = tf.split(
            tf.linalg.triangular_solve(L, tf.concat([_eye_like(A), rhs], axis=-1), lower=True),
            [n, -1],
            axis=-1,
        )

        def grad(dL, dX):
            return _inverse_backward(L, T, dL, X, dX), tf.linalg.matmul(T, dX, transpose_a=True)

        return (L, X), grad

    return factor_and_solve(A, rhs)


@check_shapes(
    "L: [batch..., N, N]",
    "inverse: [batch..., N, N]",
    "rhs: [batch..., N, K]",
    "return: [batch..., N, K]",
)
def triangular_solve_with_inverse(L: tf.Tensor, inverse: tf.Tensor, rhs: tf.Tensor) -> tf.Tensor:
    """``L^{-1} rhs`` by a triangular solve (the same values as ``tf.linalg.triangular_solve``),
    whose gradient uses the known ``inverse = L^{-1}`` (:func:`cholesky_with_inverse`) instead of a
    second solve: ``d rhs = L^{-T} dX`` and ``dL = -d rhs X^T`` (lower triangle), two products. No
    gradient flows into ``inverse`` (it only stands for ``L^{-1}``)."""

    @tf.custom_gradient
    def solve(L, inverse, rhs):
        X = tf.linalg.triangular_solve(L, rhs, lower=True)

        def grad(dX):
            d_rhs = tf.linalg.matmul(inverse, dX, transpose_a=True)
            dL = -tf.linalg.band_part(tf.linalg.matmul(d_rhs, X, transpose_b=True), -1, 0)
            return dL, None, d_rhs

        return X, grad

    return solve(L, inverse, rhs)
