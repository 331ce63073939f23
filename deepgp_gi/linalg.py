"""Numerically careful linear algebra shared by every posterior.

The one rule: never form the inverse of a kernel matrix. Everything goes through
:func:`safe_cholesky` and triangular solves.
"""
from __future__ import annotations

import tensorflow as tf
from check_shapes import check_shapes

__all__ = ["safe_cholesky", "CholeskyError", "add_jitter", "base_jitter"]


class CholeskyError(tf.errors.InvalidArgumentError):
    """Raised (as a TensorFlow InvalidArgumentError) when a matrix is not positive definite."""


def base_jitter(dtype: tf.DType) -> float:
    """Relative jitter of the first escalation step for ``dtype`` (times the mean diagonal)."""
    return 1e-8 if dtype == tf.float64 else 1e-5


@check_shapes("A: [batch..., N, N]", "return: [batch..., N, N]")
def add_jitter(A: tf.Tensor, jitter) -> tf.Tensor:
    """``A + jitter * I``; ``jitter`` is a scalar or broadcasts against ``A``'s batch shape."""
    jitter = tf.convert_to_tensor(jitter, dtype=A.dtype)
    diag = tf.linalg.diag_part(A) + tf.expand_dims(jitter, -1)
    return tf.linalg.set_diag(A, diag)


def _finite_per_matrix(L: tf.Tensor) -> tf.Tensor:
    return tf.reduce_all(tf.math.is_finite(L), axis=[-2, -1])


@check_shapes("A: [batch..., N, N]", "return: [batch..., N, N]")
def safe_cholesky(A: tf.Tensor, *, max_tries: int = 6, name: str = "matrix") -> tf.Tensor:
    """Lower Cholesky factor of the symmetric matrices ``A``, with escalating jitter.

    The plain factorisation is tried first. Batch members whose factor is not finite (the
    matrix was not numerically positive definite) are refactorised with jitter
    ``base_jitter(dtype) * mean(diag(A)) * 10**k`` added to the diagonal, ``k = 0 .. max_tries-1``,
    each member keeping the smallest jitter that works. If some member still fails, an
    ``InvalidArgumentError`` is raised whose message names ``name``, the shape and the largest
    jitter tried. Works in eager and compiled (``tf.function``) code, with gradients.

    :param A: symmetric matrices, shape [batch..., N, N].
    :param max_tries: how many escalation steps (each 10x the previous jitter).
    :param name: a human name for the matrix, used in the error message.
    :return: lower-triangular factors, shape [batch..., N, N].
    """
    A = tf.convert_to_tensor(A)
    L0 = tf.linalg.cholesky(A)
    ok0 = _finite_per_matrix(L0)

    def escalate() -> tf.Tensor:
        diag = tf.linalg.diag_part(A)
        scale = tf.reduce_mean(tf.abs(diag), axis=-1)
        scale = tf.where(scale > 0, scale, tf.ones_like(scale))
        start = base_jitter(A.dtype)

        def cond(k, L, ok):
            return tf.logical_and(k < max_tries, tf.logical_not(tf.reduce_all(ok)))

        def body(k, L, ok):
            jitter = start * tf.pow(tf.constant(10.0, A.dtype), tf.cast(k, A.dtype)) * scale
            L_new = tf.linalg.cholesky(add_jitter(A, jitter))
            ok_new = _finite_per_matrix(L_new)
            take = tf.logical_and(tf.logical_not(ok), ok_new)
            L = tf.where(take[..., None, None], L_new, L)
            return k + 1, L, tf.logical_or(ok, ok_new)

        _, L, ok = tf.while_loop(cond, body, (tf.constant(0), L0, ok0))
        max_jitter = start * 10.0 ** (max_tries - 1)
        message = (
            f"safe_cholesky: {name} is not positive definite even with jitter up to "
            f"{max_jitter:.1e} x its mean diagonal; check the inputs for NaN/inf, a collapsed "
            f"lengthscale or a kernel variance near zero"
        )
        check = tf.debugging.Assert(tf.reduce_all(ok), [message, tf.shape(A)])
        with tf.control_dependencies([check]):
            return tf.identity(L)

    return tf.cond(tf.reduce_all(ok0), lambda: L0, escalate)
