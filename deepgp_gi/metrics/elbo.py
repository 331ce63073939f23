"""The ELBO of a trained model on its full training set, estimated to a target standard error."""

from __future__ import annotations

import math
from typing import List, Optional

import numpy as np
import tensorflow as tf

from ..validation import check_positive_int

__all__ = ["estimate_elbo"]

OUT_OF_REACH = 10.0
"""A target is out of reach when ``max_draws`` draws would leave the SE above this many times it."""


def estimate_elbo(
    model,
    data,
    *,
    se_target: float = 0.01,
    samples_per_draw: int = 8,
    min_draws: int = 4,
    max_draws: int = 2500,
    projection_draws: int = 64,
    seed: int = 0,
    chunk_size: Optional[int] = None,
):
    """The ELBO per datapoint on the full data, from independent draws until its SE < ``se_target``.

    Each draw is ``model.elbo(data, samples_per_draw, seed_r)`` with its own stateless seed, so the
    draws are independent; the estimate is their mean and its standard error is their standard
    deviation over the square root of their number.

    When the target is far out of reach it stops early: once ``projection_draws`` draws are in, if
    even ``max_draws`` draws would leave the SE, at the spread seen so far, above
    ``OUT_OF_REACH`` (10) times ``se_target``, the estimate stops there rather than spending
    ``max_draws`` draws on an SE that would still miss the target by that much (a model trained on
    the predictive objective, whose per-sample log-likelihoods are far apart, is the usual case).
    The returned SE and sample count say how far it went.

    With ``chunk_size`` (rows) smaller than N, each draw evaluates the rows in chunks, with
    independent samples per chunk: the sum of the chunks' expected log-likelihoods (each
    ``model.elbo_terms`` of a chunk, un-rescaled when ``model.num_data`` is set) minus the first
    chunk's regulariser. Its expectation is the full-data ELBO's, so only the memory of a draw
    changes (and, for a family with a sampled regulariser, its variance). This needs
    ``model.num_data`` to be None or N (checked).

    :param chunk_size: rows per evaluation call; None: all N at once.
    :param projection_draws: draws after which an out-of-reach target stops the estimate
        (at least ``min_draws``).
    :return: ``(mean, standard_error, total_samples)``, all per datapoint.
    """
    X, Y = data
    N = int(X.shape[0])
    if model.num_data not in (None, N):
        raise ValueError(f"model.num_data={model.num_data} but the data has N={N} rows")
    if chunk_size is not None:
        chunk_size = check_positive_int(chunk_size, "chunk_size")
    projection_draws = check_positive_int(projection_draws, "projection_draws")
    if projection_draws < min_draws:
        raise ValueError(
            f"projection_draws={projection_draws} must be at least min_draws={min_draws}"
        )
    if chunk_size is None or chunk_size >= N:
        elbo = tf.function(
            lambda seed_pair: model.elbo((X, Y), samples_per_draw, seed_pair), autograph=False
        )

        def draw(seed_pair) -> float:
            return float(elbo(seed_pair))

    else:
        starts = list(range(0, N, chunk_size))

        @tf.function(autograph=False)
        def terms(Xc, Yc, seed_pair):
            ell, kl = model.elbo_terms((Xc, Yc), samples_per_draw, seed_pair)
            if (
                model.num_data is not None
            ):  # undo the minibatch rescaling: this is a sum over the chunk
                ell = ell * tf.cast(tf.shape(Xc)[0], ell.dtype) / tf.cast(model.num_data, ell.dtype)
            return tf.reduce_mean(ell), tf.reduce_mean(kl)

        def draw(seed_pair) -> float:
            total = 0.0
            for k, start in enumerate(starts):
                ell, kl = terms(
                    X[start : start + chunk_size],
                    Y[start : start + chunk_size],
                    seed_pair + tf.constant([1_000_003 * k, 0], tf.int64),
                )
                total += float(ell) - (float(kl) if k == 0 else 0.0)
            return total

    values: List[float] = []
    while True:
        values.append(draw(tf.constant([seed, 7919 + len(values)], tf.int64)) / N)
        n = len(values)
        if n >= min_draws:
            sd = float(np.std(values, ddof=1))
            se = sd / math.sqrt(n)
            se_at_max = sd / math.sqrt(max_draws)
            out_of_reach = n >= projection_draws and se_at_max > OUT_OF_REACH * se_target
            if se < se_target or n >= max_draws or out_of_reach:
                return float(np.mean(values)), se, n * samples_per_draw
