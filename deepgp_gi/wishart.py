"""Wishart and inverse-Wishart densities and Bartlett draws for real degrees of freedom.

docs/algorithms.md, "Wishart densities for real degrees of freedom" (O&A 2021 App. D). For an
``m x m`` scale ``V = C C^T`` and real ``nu > m - 1``:

* Wishart: ``log W(X; V, nu) = (nu - m - 1)/2 log|X| - tr(V^{-1} X)/2 - nu m/2 log 2
  - nu/2 log|V| - log Gamma_m(nu/2)``, with the multivariate Gamma function
  ``Gamma_m(a) = pi^{m(m-1)/4} prod_{j=1..m} Gamma(a + (1 - j)/2)`` at real ``a``;
* inverse Wishart: ``log IW(X; Psi, nu) = log W(X^{-1}; Psi^{-1}, nu) - (m + 1) log|X|
  = nu/2 log|Psi| - nu m/2 log 2 - log Gamma_m(nu/2) - (nu + m + 1)/2 log|X| - tr(Psi X^{-1})/2``;
* Bartlett: ``A`` lower-triangular with ``A_jj^2 ~ Gamma((nu - j + 1)/2, rate 1/2)`` (a
  chi-squared with ``nu - j + 1`` degrees of freedom, ``j = 1..m``) and ``A_jk ~ N(0, 1)`` for
  ``j > k``; then ``C A A^T C^T ~ W(C C^T, nu)``. This holds for every real ``nu > m - 1``
  (TFP's ``WishartTriL`` insists on ``nu >= m``; docs/algorithms.md, "Paper versus reference
  code", item 9).

Every density takes Cholesky factors and uses triangular solves: no matrix is inverted. The
functions are pure TensorFlow, for float32 and float64, and batch over leading dimensions.
``dof`` is validated eagerly (a Python number or an eager tensor); inside a ``tf.function`` it
is the caller's job.
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

from .linalg import safe_cholesky
from .noise import NoiseSource

__all__ = [
    "check_dof",
    "log_multivariate_gamma",
    "wishart_log_prob",
    "inverse_wishart_log_prob",
    "bartlett_factor",
    "bartlett_log_prob",
    "bartlett_log_jacobian",
    "bartlett_inverse_wishart_log_prob",
    "kron_identity",
]


def check_dof(dof, dim: int, name: str = "dof") -> None:
    """Raise ``ValueError`` unless every ``dof`` is a finite number ``> dim - 1`` (the range where
    the Wishart distribution and the Bartlett draw exist). Symbolic tensors are not checked."""
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"the matrix dimension must be a positive integer, got {dim!r}")
    if isinstance(dof, (tf.Tensor, tf.Variable)):
        if not tf.executing_eagerly():
            return
        value = np.asarray(dof.numpy())
    else:
        if isinstance(dof, bool):
            raise ValueError(f"{name} must be a number, got {dof!r}")
        value = np.asarray(dof)
    if value.dtype.kind not in "fiu":
        raise ValueError(f"{name} must be real, got {dof!r}")
    if not np.all(np.isfinite(value)) or not np.all(value > dim - 1):
        raise ValueError(
            f"{name} must be finite and greater than dim - 1 = {dim - 1} for a {dim} x {dim} "
            f"Wishart, got {value.min() if value.size else value!r}"
        )


def _as_dof(dof, dtype: tf.DType) -> tf.Tensor:
    """``dof`` as a ``dtype`` tensor: tensors are cast, numbers converted directly (a Python float
    must not pass through float32)."""
    if isinstance(dof, (tf.Tensor, tf.Variable)):
        return tf.cast(dof, dtype)
    return tf.convert_to_tensor(np.asarray(dof, dtype.as_numpy_dtype))


def log_multivariate_gamma(a: tf.Tensor, dim: int) -> tf.Tensor:
    """``log Gamma_m(a) = m(m-1)/4 log pi + sum_{j=1..m} lgamma(a + (1 - j)/2)`` for real
    ``a > (m - 1)/2``, elementwise over ``a`` ``[batch...]`` (numbers are taken as float64)."""
    a = (
        a
        if isinstance(a, (tf.Tensor, tf.Variable))
        else tf.convert_to_tensor(np.asarray(a, np.float64))
    )
    j = tf.range(dim, dtype=a.dtype)
    const = tf.constant(dim * (dim - 1) / 4.0 * math.log(math.pi), a.dtype)
    return const + tf.reduce_sum(tf.math.lgamma(a[..., None] - 0.5 * j), axis=-1)


def _log_det_tril(tril: tf.Tensor) -> tf.Tensor:
    """``log|T T^T|`` from a lower-triangular factor with positive diagonal."""
    return 2.0 * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(tril)), axis=-1)


def _broadcast_batch(tril: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    shape = tf.broadcast_dynamic_shape(tf.shape(tril), tf.shape(like))
    return tf.broadcast_to(tril, shape)


# The shapes of both densities' arguments and result.
_density_shapes = check_shapes(
    "X: [batch..., m, m]",
    "scale_tril: [broadcast batch..., m, m]",
    "dof: [broadcast batch...]",
    "X_tril: [batch..., m, m] if X_tril is not None",
    "return: [batch...]",
)


def _prepare(X, scale_tril, dof, X_tril):
    """The shared prologue of the two densities: ``(m, dtype, dof, scale_tril, chol(X))``."""
    X = tf.convert_to_tensor(X)
    m = int(X.shape[-1])
    check_dof(dof, m)
    dof = _as_dof(dof, X.dtype)
    scale_tril = tf.convert_to_tensor(scale_tril, X.dtype)
    if X_tril is None:
        X_tril = safe_cholesky(X, name="Wishart argument X")
    return m, X.dtype, dof, scale_tril, X_tril


@_density_shapes
def wishart_log_prob(
    X: tf.Tensor, scale_tril: tf.Tensor, dof, X_tril: Optional[tf.Tensor] = None
) -> tf.Tensor:
    """``log W(X; V, nu)`` with ``V = scale_tril scale_tril^T`` for real ``nu = dof > m - 1``.

    :param X: positive-definite matrices ``[batch..., m, m]``.
    :param scale_tril: the lower Cholesky factor of the scale ``V`` (broadcasts against ``X``).
    :param dof: degrees of freedom (broadcast against the batch).
    :param X_tril: ``chol(X)`` if already known (else computed).
    """
    m, dtype, dof, scale_tril, X_tril = _prepare(X, scale_tril, dof, X_tril)
    # tr(V^{-1} X) = ||C^{-1} chol(X)||_F^2.
    solved = tf.linalg.triangular_solve(_broadcast_batch(scale_tril, X_tril), X_tril, lower=True)
    trace = tf.reduce_sum(tf.square(solved), axis=[-2, -1])
    return (
        0.5 * (dof - m - 1.0) * _log_det_tril(X_tril)
        - 0.5 * trace
        - 0.5 * dof * m * tf.constant(math.log(2.0), dtype)
        - 0.5 * dof * _log_det_tril(scale_tril)
        - log_multivariate_gamma(0.5 * dof, m)
    )


@_density_shapes
def inverse_wishart_log_prob(
    X: tf.Tensor, scale_tril: tf.Tensor, dof, X_tril: Optional[tf.Tensor] = None
) -> tf.Tensor:
    """``log IW(X; Psi, nu)`` with ``Psi = scale_tril scale_tril^T`` for real ``nu = dof > m - 1``:
    the density of ``X`` when ``X^{-1} ~ W(Psi^{-1}, nu)`` (mean ``Psi / (nu - m - 1)`` for
    ``nu > m + 1``). ``tr(Psi X^{-1}) = ||chol(X)^{-1} scale_tril||_F^2`` by one triangular solve.

    :param X: positive-definite matrices ``[batch..., m, m]``.
    :param scale_tril: the lower Cholesky factor of the scale ``Psi``.
    :param dof: degrees of freedom.
    :param X_tril: ``chol(X)`` if already known.
    """
    m, dtype, dof, scale_tril, X_tril = _prepare(X, scale_tril, dof, X_tril)
    solved = tf.linalg.triangular_solve(X_tril, _broadcast_batch(scale_tril, X_tril), lower=True)
    trace = tf.reduce_sum(tf.square(solved), axis=[-2, -1])
    return (
        0.5 * dof * _log_det_tril(scale_tril)
        - 0.5 * dof * m * tf.constant(math.log(2.0), dtype)
        - log_multivariate_gamma(0.5 * dof, m)
        - 0.5 * (dof + m + 1.0) * _log_det_tril(X_tril)
        - 0.5 * trace
    )


def _strict_lower_positions(dim: int) -> np.ndarray:
    """``[m, m]`` indices into ``[0, z_1, ..., z_K]`` placing ``K = m(m-1)/2`` values below the
    diagonal in row-major order ``(1,0), (2,0), (2,1), (3,0), ...``; 0 (a zero) elsewhere."""
    positions = np.zeros((dim, dim), dtype=np.int32)
    rows, cols = np.tril_indices(dim, -1)
    positions[rows, cols] = np.arange(1, rows.size + 1)
    return positions


@check_shapes("return: [S, m, m]")
def bartlett_factor(
    dof, dim: int, num_samples: int, noise_source: NoiseSource, name: str, dtype: tf.DType
) -> tf.Tensor:
    """``S`` Bartlett factors ``A`` ``[S, m, m]`` of ``W(I, nu)``: ``A A^T ~ W(I_m, nu)``.

    ``A_jj = sqrt(2 g_j)`` with ``g_j ~ Gamma((nu - j + 1)/2, 1)`` (so ``A_jj^2`` is chi-squared
    with ``nu - j + 1`` degrees of freedom) and ``A_jk ~ N(0, 1)`` below the diagonal. Valid for
    real ``nu > m - 1``; the Gamma draws are reparameterised (implicit gradients), so gradients
    reach ``dof``. For a scale ``V = C C^T``, ``C A`` is a Bartlett factor of ``W(V, nu)``.

    Noise names: ``f"{name}/chi"`` -- the Gamma draws ``g`` ``[S, m]`` (column ``j - 1`` has shape
    ``(nu - j + 1)/2``); ``f"{name}/normal"`` -- the ``m(m-1)/2`` below-diagonal normals
    ``[S, m(m-1)/2]`` in row-major order ``(2,1), (3,1), (3,2), ...`` (not drawn when ``m = 1``).

    :param dof: ``nu``, a scalar or one per sample ``[S]``.
    :param dim: ``m``.
    """
    m = int(dim)
    check_dof(dof, m)
    S = int(num_samples)
    dof = _as_dof(dof, dtype)
    alpha = 0.5 * (dof[..., None] - tf.range(m, dtype=dtype))  # [S | 1, m]: (nu - j + 1)/2
    alpha = tf.broadcast_to(alpha, [S, m])
    g = noise_source.gamma(f"{name}/chi", [S, m], alpha, dtype)
    A = tf.linalg.diag(tf.sqrt(2.0 * g))
    if m > 1:
        z = noise_source.normal(f"{name}/normal", [S, m * (m - 1) // 2], dtype)
        padded = tf.concat([tf.zeros([S, 1], dtype), z], axis=1)
        A = A + tf.gather(padded, _strict_lower_positions(m), axis=1)
    return A


@check_shapes("A: [batch..., m, m]", "dof: [broadcast batch...]", "return: [batch...]")
def bartlett_log_prob(A: tf.Tensor, dof) -> tf.Tensor:
    """Log density of a Bartlett factor ``A`` (lower-triangular, positive diagonal) with respect
    to Lebesgue measure on its ``m(m+1)/2`` free entries: ``A_jj`` has density
    ``chi2_{nu-j+1}(A_jj^2) * 2 A_jj`` and the entries below the diagonal are ``N(0, 1)``."""
    A = tf.convert_to_tensor(A)
    dtype = A.dtype
    m = int(A.shape[-1])
    check_dof(dof, m)
    dof = _as_dof(dof, dtype)
    a = tf.linalg.diag_part(A)  # [batch..., m]
    k = dof[..., None] - tf.range(m, dtype=dtype)  # chi-squared degrees of freedom nu - j + 1
    c = tf.square(a)
    log_2 = tf.constant(math.log(2.0), dtype)
    log_chi2 = (
        (0.5 * k - 1.0) * tf.math.log(c) - 0.5 * c - 0.5 * k * log_2 - tf.math.lgamma(0.5 * k)
    )
    diag_term = tf.reduce_sum(log_chi2 + log_2 + tf.math.log(a), axis=-1)
    below = tf.linalg.band_part(A, -1, 0) - tf.linalg.diag(a)
    num_below = m * (m - 1) / 2.0
    normal_term = -0.5 * tf.reduce_sum(
        tf.square(below), axis=[-2, -1]
    ) - num_below * 0.5 * tf.constant(math.log(2.0 * math.pi), dtype)
    return diag_term + normal_term


@check_shapes("A: [batch..., m, m]", "return: [batch...]")
def bartlett_log_jacobian(A: tf.Tensor) -> tf.Tensor:
    """``log |d(A A^T)/dA| = log(2^m prod_j A_jj^{m-j+1})`` for lower-triangular ``A`` with
    positive diagonal (the map to the ``m(m+1)/2`` free entries of a symmetric matrix)."""
    A = tf.convert_to_tensor(A)
    m = int(A.shape[-1])
    powers = tf.constant(np.arange(m, 0, -1), A.dtype)  # m - j + 1 for j = 1..m
    return m * tf.constant(math.log(2.0), A.dtype) + tf.reduce_sum(
        powers * tf.math.log(tf.linalg.diag_part(A)), axis=-1
    )


@check_shapes(
    "A: [batch..., m, m]",
    "transform_tril: [m, m]",
    "dof: [broadcast batch...]",
    "scale_tril: [m, m] if scale_tril is not None",
    "return: [batch...]",
)
def bartlett_inverse_wishart_log_prob(
    A: tf.Tensor, transform_tril: tf.Tensor, dof, scale_tril: Optional[tf.Tensor] = None
) -> tf.Tensor:
    """``log IW(X; Psi, nu)`` at ``X = C (A A^T)^{-1} C^T`` without forming or inverting ``X``.

    With ``C = transform_tril`` and ``Psi = B B^T`` (``B = scale_tril``; ``B = C`` when ``None``):
    ``log|X| = log|C C^T| - 2 sum log A_jj`` and ``tr(Psi X^{-1}) = ||A^T C^{-1} B||_F^2``, which
    is ``||A||_F^2 = tr(A A^T)`` when ``B = C`` (no solve at all) and otherwise needs one
    triangular solve ``C^{-1} B`` shared by the batch.

    :param A: Bartlett factors ``[batch..., m, m]`` (from :func:`bartlett_factor`).
    :param transform_tril: ``C`` ``[m, m]``, lower-triangular with positive diagonal.
    :param dof: the density's degrees of freedom ``nu`` (not necessarily those ``A`` was drawn
        with).
    :param scale_tril: ``B`` ``[m, m]``; default ``C``.
    """
    A = tf.convert_to_tensor(A)
    dtype = A.dtype
    m = int(A.shape[-1])
    check_dof(dof, m)
    dof = _as_dof(dof, dtype)
    C = tf.convert_to_tensor(transform_tril, dtype)
    log_det_C = _log_det_tril(C)
    log_det_X = log_det_C - 2.0 * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(A)), axis=-1)
    if scale_tril is None:
        log_det_scale = log_det_C
        trace = tf.reduce_sum(tf.square(A), axis=[-2, -1])
    else:
        B = tf.convert_to_tensor(scale_tril, dtype)
        log_det_scale = _log_det_tril(B)
        Cinv_B = tf.linalg.triangular_solve(C, B, lower=True)  # [m, m]
        trace = tf.reduce_sum(
            tf.square(tf.linalg.matmul(A, _broadcast_batch(Cinv_B, A), transpose_a=True)),
            axis=[-2, -1],
        )
    return (
        0.5 * dof * log_det_scale
        - 0.5 * dof * m * tf.constant(math.log(2.0), dtype)
        - log_multivariate_gamma(0.5 * dof, m)
        - 0.5 * (dof + m + 1.0) * log_det_X
        - 0.5 * trace
    )


@check_shapes("L: [batch..., p, p]", "return: [batch..., pC, pC]")
def kron_identity(L: tf.Tensor, channels: int) -> tf.Tensor:
    """``L kron I_C`` ``[batch..., pC, pC]`` in offset-major order: the entry at
    ``(a C + c, b C + c')`` is ``L[a, b] * [c == c']`` (feature index = offset index * C + channel).

    :param L: ``[batch..., p, p]``.
    :param channels: ``C``.
    """
    L = tf.convert_to_tensor(L)
    C = int(channels)
    if C < 1:
        raise ValueError(f"channels must be a positive integer, got {channels!r}")
    p = int(L.shape[-1])
    eye = tf.eye(C, dtype=L.dtype)
    blocks = L[..., :, None, :, None] * eye[:, None, :]  # [batch..., p, C, p, C]
    return tf.reshape(blocks, tf.concat([tf.shape(L)[:-2], [p * C, p * C]], axis=0))
