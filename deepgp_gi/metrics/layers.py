"""How much of each layer's output is signal and how much is sampling spread: a diagnostic of a
trained deep GP's propagation.

A deep GP passes samples from layer to layer. When its last layer stops following its inputs,
the likelihood's noise takes over the whole target variance and the fit collapses to a constant:
the last layer's between-row variance falls to near zero. An inner layer's samples may spread as
much at one input as its mean varies between inputs without that (mean-field fits that work
often show it), so the inner layers' numbers describe the propagation, not a failure.
:func:`layer_variances` measures both quantities per layer from joint samples of every layer
(``model.sample_layers``).
"""

from __future__ import annotations

from typing import List, NamedTuple

import tensorflow as tf

from ..validation import check_positive_int

__all__ = ["LayerVariances", "layer_variances"]


class LayerVariances(NamedTuple):
    """Per layer ``l`` (outputs ``f_l``, ``D_l`` columns), averaged over the columns:

    :ivar between_rows: the variance over the rows ``x_n`` of the sample mean of ``f_l(x_n)``: how
        much the layer's (mean) output changes from input to input.
    :ivar within_samples: the mean over the rows of the variance of ``f_l(x_n)`` over the joint
        samples: how far one input's samples spread.
    """

    between_rows: List[float]
    within_samples: List[float]


def layer_variances(model, X, num_samples: int = 16, seed: int = 0) -> LayerVariances:
    """The between-row and within-sample variance of every layer's output on the inputs ``X``.

    ``X``: ``[N, D]`` inputs (N ≥ 2), e.g. a few thousand training rows. ``num_samples`` (≥ 2)
    joint samples are drawn with ``model.sample_layers(X, num_samples, seed)``: ``[S, N, D_l]`` per
    layer. With the sample mean ``m_nd = mean_s f[s, n, d]``, layer ``l`` gives

    * ``between_rows = mean_d var_n m_nd``;
    * ``within_samples = mean_{n,d} var_s f[s, n, d]`` (the unbiased, S - 1, estimate).

    For a one-layer model these are the variance over the rows of the predictive mean and the mean
    predictive variance of ``predict_f``, up to Monte Carlo error (the tests' oracle).

    :return: a :class:`LayerVariances`, one entry per tensor of ``sample_layers``, first layer
        first (a latent-variable deep GP's first entry is its latent coordinate ``w``).
    """
    num_samples = check_positive_int(num_samples, "num_samples", minimum=2)
    X = model.check_inputs(X, "X")
    if X.shape[0] is not None and X.shape[0] < 2:
        raise ValueError(
            f"X needs at least 2 rows to compare layers' outputs between rows, got {X.shape[0]}"
        )
    between, within = [], []
    for F in model.sample_layers(X, num_samples, seed):
        mean = tf.reduce_mean(F, axis=0)  # [N, D_l]
        between.append(float(tf.reduce_mean(tf.math.reduce_variance(mean, axis=0))))
        spread = tf.math.reduce_variance(F, axis=0) * (num_samples / (num_samples - 1))  # unbiased
        within.append(float(tf.reduce_mean(spread)))
    return LayerVariances(between, within)
