"""q(s) of random-scale priors: O13 for the Gamma log-ratio."""
import numpy as np
import tensorflow as tf
import tensorflow_probability as tfp

from deepgp_gi.noise import SeededNoise
from deepgp_gi.posteriors import ScalePosterior
from deepgp_gi.priors import ScalePrior

tfd = tfp.distributions


def test_O13_scale_prior_log_ratio_is_minus_gamma_kl():
    prior = ScalePrior()
    q = ScalePosterior()
    q.alpha.assign(0.3)
    q.beta.assign(-0.4)
    S = 100_000
    _, log_ratio_s = q.sample_scale(prior, S, SeededNoise(11), "s/0", tf.float64)
    mean, se = np.mean(log_ratio_s), np.std(log_ratio_s) / np.sqrt(S)
    expected = -tfd.kl_divergence(q.distribution(), prior.prior_distribution(tf.float64)).numpy()
    assert abs(mean - expected) < 4 * se, (mean, expected, se)
