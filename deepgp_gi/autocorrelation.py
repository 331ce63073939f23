"""The Gram matrices of a convolution's Bayesian linear regression, without patch matrices.

A stride-1 ``k x k`` convolution is linear regression on patches (docs/algorithms.md,
"Convolutional global inducing"): the row
of output pixel ``u`` of image ``i`` has features ``X'_{(i,u),(delta,c)} = X_{i, u+delta, c}``
over the offsets ``delta`` of the kernel and the input channels ``c``, and the weights are the
filter reshaped to ``[k*k*C_in, C_out]``. Features are **offset-major**: feature
``(a*k + b)*C_in + c`` is filter tap ``(a, b)`` (row, column) of channel ``c``, which is exactly
``tf.reshape(filter, [k*k*C_in, C_out])`` of a ``[k, k, C_in, C_out]`` filter; the bias is one
more feature (a column of ones), last.

The global-inducing posterior of such a layer needs only

* ``G = X'^T Lambda X'`` ``[D, D]`` and
* ``R = X'^T Lambda V`` ``[D, C_out]``,

with ``Lambda`` one precision per inducing image. This module builds both by convolutions of the
inducing images with themselves and with the pseudo-outputs (O&A 2021, App. C), so the memory
is that of the images and of ``G``, never that of the ``k^2``-fold patch matrix:

* ``padding="same"`` (the paper's layer): the posterior uses **circular** boundaries, under which
  ``G`` depends on the offsets only through their difference; a single convolution gives the
  table of lags ``-(k-1) .. k-1`` and ``G`` is gathered from it. (The forward pass of the layer
  still pads with zeros; the circular ``G`` is the paper's approximation of the posterior's
  Gram matrix near the borders.)
* ``padding="valid"``: no boundary approximation; ``G`` takes one convolution per offset
  (``k^2`` small convolutions, each the size of the images).

:func:`patch_matrix` forms ``X'`` explicitly; it is the reference the tests compare with, and is
not used by the layers.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
import tensorflow as tf
from check_shapes import check_shapes

__all__ = ["PADDINGS", "patch_gram", "patch_cross", "patch_matrix", "circular_pad", "output_size"]

#: Paddings of a stride-1 convolution: ``"same"`` (output as large as the input, zero padding in
#: the forward pass, circular boundaries in the posterior) and ``"valid"``.
PADDINGS = ("same", "valid")


def output_size(size: int, kernel_size: int, padding: str) -> int:
    """The spatial output size of a stride-1 convolution along one axis."""
    return size if padding == "same" else size - kernel_size + 1


def _half(kernel_size: int) -> int:
    if kernel_size % 2 != 1:
        raise ValueError(f"padding='same' needs an odd kernel_size, got {kernel_size}")
    return kernel_size // 2


def circular_pad(X: tf.Tensor, pad: int) -> tf.Tensor:
    """Pad the two spatial axes of ``X`` ``[..., H, W, C]`` by ``pad`` on every side, wrapping
    around (any ``pad``, also larger than the image)."""
    H, W = X.shape[-3], X.shape[-2]
    rows = np.arange(-pad, H + pad) % H
    cols = np.arange(-pad, W + pad) % W
    return tf.gather(tf.gather(X, rows, axis=-3), cols, axis=-2)


def _images_as_channels(X: tf.Tensor) -> tf.Tensor:
    """``[S, M, H, W, C]`` -> ``[S*C, H, W, M]``: the conv batch runs over samples and channels,
    and the inducing images become the conv channels that the filter contracts."""
    S, M = tf.shape(X)[0], tf.shape(X)[1]
    H, W, C = X.shape[2:]
    Xt = tf.transpose(X, [0, 4, 2, 3, 1])  # [S, C, H, W, M]
    return tf.reshape(Xt, tf.stack([S * C, H, W, M]))


def _precision_weights(lam: tf.Tensor, ndim: int) -> tf.Tensor:
    return tf.reshape(lam, [-1] + [1] * (ndim - 1))


@check_shapes(
    "X: [S, M, H, W, C]",
    "V: [M, H2, W2, P]",
    "precision: [M]",
    "return: [S, D, P]",
)
def patch_cross(
    X: tf.Tensor,
    V: tf.Tensor,
    precision: tf.Tensor,
    kernel_size: int,
    padding: str = "same",
    bias: bool = True,
) -> tf.Tensor:
    """``R = X'^T Lambda V`` ``[S, k*k*C (+1), P]`` for images ``X`` and outputs ``V``.

    :param X: the layer's input features on the inducing images ``[S, M, H, W, C]`` (one set per
        sample).
    :param V: per-pixel outputs ``[M, H', W', P]`` (``H' = H`` for "same", ``H - k + 1`` for
        "valid"), shared by the samples.
    :param precision: ``Lambda`` ``[M]``, one precision per image.
    :param bias: append the bias feature's row ``sum_{i,u} lambda_i V_{i,u}``.
    """
    k = int(kernel_size)
    S, C = tf.shape(X)[0], X.shape[-1]
    P = V.shape[-1]
    lamV = _precision_weights(precision, 4) * V
    if padding == "same":
        X = circular_pad(X, _half(k))
    filt = tf.transpose(lamV, [1, 2, 0, 3])  # [H', W', M, P]
    out = tf.nn.conv2d(_images_as_channels(X), filt, strides=1, padding="VALID")  # [S*C, k, k, P]
    out = tf.reshape(out, tf.stack([S, C, k, k, P]))
    R = tf.reshape(tf.transpose(out, [0, 2, 3, 1, 4]), tf.stack([S, k * k * C, P]))
    if bias:
        rb = tf.reduce_sum(lamV, axis=[0, 1, 2])  # [P]
        R = tf.concat([R, tf.broadcast_to(rb[None, None], tf.stack([S, 1, P]))], axis=1)
    return R


def _lag_index(k: int) -> np.ndarray:
    """``[k*k, k*k]`` flat index into the ``(2k-1) x (2k-1)`` lag table of offsets
    ``delta - delta'``."""
    a = np.arange(k * k) // k
    b = np.arange(k * k) % k
    rows = a[:, None] - a[None, :] + k - 1
    cols = b[:, None] - b[None, :] + k - 1
    return rows * (2 * k - 1) + cols


@check_shapes(
    "X: [S, M, H, W, C]",
    "precision: [M]",
    "return: [S, D, D]",
)
def patch_gram(
    X: tf.Tensor, precision: tf.Tensor, kernel_size: int, padding: str = "same", bias: bool = True
) -> tf.Tensor:
    """``G = X'^T Lambda X'`` ``[S, k*k*C (+1), k*k*C (+1)]`` by autocorrelation of the images.

    "same": one convolution per sample of the circularly padded images with themselves gives
    the lag table ``[C, 2k-1, 2k-1, C]``, and block ``(delta, delta')`` of ``G`` is the table at
    lag ``delta - delta'``. "valid": one convolution per offset ``delta'`` (a crop of the images
    as the filter). The result is symmetrised.
    """
    k = int(kernel_size)
    S, M, H, W, C = X.shape
    Xs = tf.sqrt(_precision_weights(precision, 4)) * X  # sqrt(lambda_i) on both sides

    def gram(Xs_s):  # one sample's images [M, H, W, C] -> [k*k*C, k*k*C]
        if padding == "same":
            pad = circular_pad(Xs_s, k - 1)  # [M, H + 2(k-1), W + 2(k-1), C]
            inp = tf.transpose(pad, [3, 1, 2, 0])  # [C, ., ., M]
            filt = tf.transpose(Xs_s, [1, 2, 0, 3])  # [H, W, M, C]
            table = tf.nn.conv2d(inp, filt, strides=1, padding="VALID")  # [C, 2k-1, 2k-1, C]
            table = tf.reshape(tf.transpose(table, [1, 2, 0, 3]), [(2 * k - 1) ** 2, C, C])
            blocks = tf.gather(table, _lag_index(k))  # [k*k, k*k, C, C]
        else:
            Ho, Wo = H - k + 1, W - k + 1
            inp = tf.transpose(Xs_s, [3, 1, 2, 0])  # [C, H, W, M]
            cols = []
            for a in range(k):
                for b in range(k):
                    filt = tf.transpose(
                        Xs_s[:, a : a + Ho, b : b + Wo, :], [1, 2, 0, 3]
                    )  # [Ho, Wo, M, C]
                    out = tf.nn.conv2d(inp, filt, strides=1, padding="VALID")  # [C, k, k, C]
                    cols.append(tf.reshape(tf.transpose(out, [1, 2, 0, 3]), [k * k, C, C]))
            blocks = tf.stack(cols, axis=1)  # [k*k (delta), k*k (delta'), C, C]
        return tf.reshape(tf.transpose(blocks, [0, 2, 1, 3]), [k * k * C, k * k * C])

    if S is None:  # a sample count known only at run time (a saved model's input): a loop op
        G = tf.map_fn(gram, Xs)
    else:
        G = tf.stack([gram(Xs[s]) for s in range(S)])
    G = 0.5 * (G + tf.linalg.matrix_transpose(G))
    if bias:
        ones = tf.ones(
            tf.stack([tf.shape(X)[1], output_size(H, k, padding), output_size(W, k, padding), 1]),
            X.dtype,
        )
        gb = patch_cross(X, ones, precision, k, padding, bias=False)  # [S, D, 1]
        lam_sum = tf.reduce_sum(precision) * float(
            output_size(H, k, padding) * output_size(W, k, padding)
        )
        top = tf.concat([G, gb], axis=2)
        bottom = tf.concat(
            [tf.linalg.matrix_transpose(gb), tf.fill(tf.stack([tf.shape(X)[0], 1, 1]), lam_sum)],
            axis=2,
        )
        G = tf.concat([top, bottom], axis=1)
    return G


@check_shapes(
    "X: [M, H, W, C]",
    "return: [M, H2, W2, D]",
)
def patch_matrix(
    X: tf.Tensor,
    kernel_size: int,
    padding: str = "same",
    boundary: str = "zeros",
    bias: bool = True,
) -> tf.Tensor:
    """The explicit patches ``X'`` ``[M, H', W', k*k*C (+1)]`` in offset-major order (the
    reference for tests; costs ``k^2`` times the images' memory).

    :param boundary: for "same": ``"zeros"`` (what the forward convolution sees) or
        ``"circular"`` (what :func:`patch_gram` and :func:`patch_cross` assume).
    """
    k = int(kernel_size)
    M, H, W, C = X.shape
    if padding == "same":
        p = _half(k)
        if boundary == "circular":
            Xp = circular_pad(X, p)
        elif boundary == "zeros":
            Xp = tf.pad(X, [[0, 0], [p, p], [p, p], [0, 0]])
        else:
            raise ValueError(f"boundary must be 'zeros' or 'circular', got {boundary!r}")
    else:
        Xp = X
    Ho, Wo = output_size(H, k, padding), output_size(W, k, padding)
    taps = [Xp[:, a : a + Ho, b : b + Wo, :] for a in range(k) for b in range(k)]
    out = tf.concat(taps, axis=-1)  # [M, Ho, Wo, k*k*C], offset-major
    if bias:
        out = tf.concat([out, tf.ones([M, Ho, Wo, 1], X.dtype)], axis=-1)
    return out


def check_padding(padding: str, kernel_size: int, image_size: Tuple[int, int]) -> str:
    """Validate ``padding`` for a ``kernel_size`` kernel on ``image_size`` images."""
    if padding not in PADDINGS:
        raise ValueError(f"padding must be one of {PADDINGS}, got {padding!r}")
    if padding == "same":
        _half(kernel_size)
    elif kernel_size > min(image_size):
        raise ValueError(
            f"padding='valid' needs kernel_size <= the image size {image_size}, got {kernel_size}"
        )
    return padding
