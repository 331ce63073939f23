"""benchmarks/large.py: the generating deep GP (its random-feature layers are GP draws with the
squared-exponential kernel; the true log density two ways) and, in make test-all, the fast run
end to end with its resume and report."""

import json
import math

import gpflow
import numpy as np
import pytest
import tensorflow as tf

from benchmarks import large


def test_random_feature_layer_has_the_squared_exponential_covariance():
    # E[f(x) f(x')] over draws of (w, b, a) is exactly variance * exp(-|x - x'|^2 /
    # (2 lengthscale^2))
    X = np.array([[0.0, 0.0], [0.5, -0.3], [1.5, 1.0]])
    variance, lengthscale, draws = 1.7, 0.8, 4000
    rng = np.random.default_rng(3)
    F = np.stack(
        [large.RandomFeatureGP(2, variance, lengthscale, 50, rng)(X)[:, 0] for _ in range(draws)]
    )
    empirical = F.T @ F / draws
    sq = np.sum((X[:, None] - X[None]) ** 2, -1)
    exact = variance * np.exp(-sq / (2 * lengthscale**2))
    # Monte Carlo standard error of a product of two unit-variance-scale Gaussians: <= variance *
    # sqrt(2 / draws)
    np.testing.assert_allclose(empirical, exact, atol=5 * variance * math.sqrt(2 / draws))


def test_true_log_density_two_ways():
    gen = large.GeneratingDeepGP(seed=0, num_features=100)
    X, Y = gen.sample(10_000, seed=5)
    lpd = gen.log_density(X, Y)
    # 1. GPflow's Gaussian likelihood at the generating function with no latent variance
    lik = gpflow.likelihoods.Gaussian(variance=gen.noise_sd**2)
    F = gen.f(X)
    via_gpflow = np.reshape(
        lik.predict_log_density(X, tf.constant(F), tf.zeros_like(F), tf.constant(Y)).numpy(), -1
    )
    np.testing.assert_allclose(lpd, via_gpflow, rtol=1e-12, atol=1e-12)
    # 2. its expectation over the noise: -log(sd sqrt(2 pi)) - 1/2, within four standard errors
    expected = -math.log(gen.noise_sd * math.sqrt(2 * math.pi)) - 0.5
    assert abs(lpd.mean() - expected) < 4 * lpd.std() / math.sqrt(len(lpd))
    # the draw is fixed by its seed, and the rows by theirs
    again = large.GeneratingDeepGP(seed=0, num_features=100)
    np.testing.assert_allclose(again.f(X[:5]), F[:5], rtol=1e-13)
    assert not np.array_equal(gen.sample(5, seed=6)[0], X[:5])


@pytest.mark.slow  # three deep GPs, each in its own process: `make test-all`
def test_fast_run_resumes_and_reports(tmp_path):
    args = [
        "--fast",
        "--work-dir",
        str(tmp_path / "work"),
        "--results",
        str(tmp_path / "large.jsonl"),
        "--out",
        str(tmp_path / "large.md"),
        "--plot",
        str(tmp_path / "large.png"),
        "--no-progress",
    ]
    assert large.main(args) == 0
    rows = [json.loads(line) for line in (tmp_path / "large.jsonl").read_text().splitlines()]
    assert [(r["config"], r["step"]) for r in rows] == [
        (c, s) for c in large.CONFIGS for s in (10, 20)
    ]
    info = json.loads(next((tmp_path / "work").glob("deep-gp-*/data.json")).read_text())
    for r in rows:
        assert np.isfinite(r["elbo_per_row"]) and np.isfinite(r["test_ll"]) and r["peak_rss_mb"] > 0
        assert (
            r["test_ll"] < info["true_test_ll"] + 4 * info["true_test_ll_se"]
        )  # nothing beats the truth
        assert len(r["trace_step"]) == len(r["trace_elbo_per_row"]) > 0
    assert large.main(args) == 0  # every chunk is in the file: nothing reruns
    assert len((tmp_path / "large.jsonl").read_text().splitlines()) == len(rows)
    text = (tmp_path / "large.md").read_text()
    assert f"{info['true_test_ll']:.4f}" in text and "python benchmarks/large.py --fast" in text
    assert (
        "| global inducing, Adam | 20 | 1.33 |" in text
        and (tmp_path / "large.png").stat().st_size > 0
    )
    # a larger --steps with the same chunk length continues from the last checkpoint: one
    # more chunk each
    assert (
        large.main(args + ["--steps", "30", "--chunks", "3", "--configs", "mean_field_adam"]) == 0
    )
    more = [json.loads(line) for line in (tmp_path / "large.jsonl").read_text().splitlines()]
    assert more[: len(rows)] == rows and [(r["config"], r["step"]) for r in more[len(rows) :]] == [
        ("mean_field_adam", 30)
    ]
    assert (
        more[-1]["train_wall_s"] > rows[1]["train_wall_s"]
    )  # the clock continues from the checkpoint's
