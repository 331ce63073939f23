"""q(s) of random-scale priors: O13 for the Gamma log-ratio."""
import gpflow
import numpy as np
import pytest
import scipy.stats
import tensorflow as tf
import tensorflow_probability as tfp

from deepgp_gi.bnn import BNN_POSTERIORS, build_bnn
from deepgp_gi.datasets import deep_linear, deep_linear_log_evidence
from deepgp_gi.kernels import WeightKernel, batched_K, batched_K_diag, batched_K_sym
from deepgp_gi.layers import DenseLayer
from deepgp_gi.models import DeepGP
from deepgp_gi.noise import FixedNoise, SeededNoise
from deepgp_gi.posteriors import GlobalInducingPosterior, LocalInducingPosterior, ScalePosterior
from deepgp_gi.posteriors.factorised import (
    FactorisedGlobalPosterior,
    FactorisedWeightPosterior,
    RandomGlobalPosterior,
    factorised_kl,
    local_reparameterisation_moments,
)
from deepgp_gi.posteriors.pseudo_data import analytic_kl, log_ratio, pseudo_data_posterior, sample_weights
from deepgp_gi.priors import NealPrior, ScalePrior, StandardPrior

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
