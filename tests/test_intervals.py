"""Quantiles and central intervals of Gaussian mixtures (deepgp_gi.intervals).

Oracles: scipy's normal quantiles for one component; for a mixture, the CDF at the solved
quantile equals the probability (to 1e-12), and a fine grid of the CDF brackets it; a point mass
gives the smallest y whose CDF reaches q; weights shift the quantile as their mixture does.
"""

import numpy as np
import pytest
import scipy.stats

from deepgp_gi.intervals import central_interval, mixture_cdf, mixture_quantile


def test_one_component_is_the_gaussian_quantile():
    mean, var = np.array([[3.0, -1.0]]), np.array([[4.0, 0.01]])
    lower, upper = central_interval(0.9, mean, var)
    np.testing.assert_allclose(
        lower, scipy.stats.norm.ppf(0.05, mean[0], np.sqrt(var[0])), rtol=1e-14
    )
    np.testing.assert_allclose(
        upper, scipy.stats.norm.ppf(0.95, mean[0], np.sqrt(var[0])), rtol=1e-14
    )


@pytest.mark.slow  # about 9 s on two cores
def test_a_mixture_quantile_solves_its_cdf(rng):
    mean = rng.normal(0.0, 3.0, (50, 7))
    var = rng.uniform(0.01, 2.0, (50, 7))
    for q in (0.01, 0.3, 0.5, 0.975):
        y = mixture_quantile(q, mean, var)
        np.testing.assert_allclose(mixture_cdf(y, mean, var), q, atol=1e-12)
        grid = np.linspace(-20, 20, 40001)[:, None]
        cdf = np.mean(
            scipy.stats.norm.cdf(grid[:, None, :], mean[None], np.sqrt(var)[None]), axis=1
        )
        first = grid[np.argmax(cdf >= q, axis=0), 0]
        assert np.all(np.abs(first - y) <= 1e-3 + 1e-12)
    lo, hi = central_interval(0.9, mean, var)
    assert np.all(lo < hi)


def test_point_masses_and_weights():
    mean = np.array([[0.0], [1.0]])
    var = np.array([[0.0], [0.0]])
    assert (
        mixture_quantile(0.25, mean, var)[0] == 0.0 and mixture_quantile(0.75, mean, var)[0] == 1.0
    )
    assert mixture_quantile(0.5, mean, var)[0] == 0.0  # F(0) = 0.5 already
    weighted = mixture_quantile(0.5, mean, var, log_weights=np.log([0.2, 0.8]))
    assert weighted[0] == 1.0
    np.testing.assert_allclose(
        mixture_cdf(0.5, mean, np.full_like(var, 1e-4), np.log([0.2, 0.8])), 0.2, atol=1e-12
    )


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="q must be a probability in"):
        mixture_quantile(1.0, np.zeros((2, 1)), np.ones((2, 1)))
    with pytest.raises(ValueError, match="level must be in"):
        central_interval(0.0, np.zeros((2, 1)), np.ones((2, 1)))
    with pytest.raises(ValueError, match="var has shape"):
        mixture_quantile(0.5, np.zeros((2, 1)), np.ones((3, 1)))
    with pytest.raises(ValueError, match="non-negative"):
        mixture_quantile(0.5, np.zeros((2, 1)), -np.ones((2, 1)))
    with pytest.raises(ValueError, match="log_weights must have shape"):
        mixture_quantile(0.5, np.zeros((2, 1)), np.ones((2, 1)), log_weights=np.zeros(3))
