"""The Student-t likelihood: its predictive density against numerical integration, and the UCI
protocol's ``likelihood="student_t"`` (configuration, the models it builds, a run)."""

import gpflow
import numpy as np
import pytest
from scipy import integrate, stats

import deepgp_gi as dg
from deepgp_gi import uci_protocol
from deepgp_gi.likelihoods import StudentT


def test_a_student_t_configuration_is_normalised_and_a_gaussian_one_keeps_its_key():
    base = dict(dataset="energy", posterior="sghmc", depth=2)
    cfg = uci_protocol.normalise_config(dict(base, likelihood="student_t"))
    assert cfg["likelihood"] == "student_t"
    assert cfg["likelihood_df"] == uci_protocol.DEFAULT_STUDENT_T_DF
    assert uci_protocol.normalise_config(dict(base, likelihood="student_t", likelihood_df=3))[
        "likelihood_df"
    ] == pytest.approx(3.0)
    gaussian = uci_protocol.normalise_config(dict(base, likelihood="gaussian"))
    assert gaussian["likelihood"] is None and gaussian["likelihood_df"] is None
    # a line written before the keys is the same configuration as a Gaussian one written after
    old = {k: v for k, v in gaussian.items() if k not in ("likelihood", "likelihood_df")}
    assert uci_protocol.config_key(old) == uci_protocol.config_key(gaussian)
    assert uci_protocol.config_key(cfg) != uci_protocol.config_key(gaussian)


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(likelihood="cauchy"), "likelihood"),
        (dict(likelihood_df=4.0), "likelihood_df applies to likelihood 'student_t' only"),
        (dict(likelihood="student_t", likelihood_df=2.0), "likelihood_df must be a finite number"),
        (dict(likelihood="student_t", likelihood_df=np.inf), "likelihood_df must be a finite"),
        (dict(likelihood="student_t", likelihood_df=np.nan), "likelihood_df must be a finite"),
        (dict(likelihood="student_t", likelihood_df=True), "likelihood_df must be a finite"),
        (dict(likelihood="student_t", likelihood_df="4"), "likelihood_df must be a finite"),
    ],
)
def test_impossible_likelihood_settings_are_refused_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        uci_protocol.normalise_config(dict(dataset="energy", posterior="sghmc", **bad))


@pytest.mark.parametrize("model", ["gp", "bnn"])
def test_the_built_model_carries_the_student_t_with_its_degrees_of_freedom(model):
    cfg = dict(
        dataset="yacht",
        model=model,
        posterior="mean_field" if model == "gp" else "factorised",
        likelihood="student_t",
        likelihood_df=5,
        num_inducing=5,
    )
    if model == "bnn":
        cfg["hidden"] = [4]
    built, _ = uci_protocol.build_model(cfg, 0)
    assert isinstance(built.likelihood, StudentT)
    assert built.likelihood.df == 5.0
    assert float(built.likelihood.scale.numpy()) == pytest.approx(uci_protocol.INITIAL_NOISE_SCALE)
    plain, _ = uci_protocol.build_model({k: v for k, v in cfg.items() if "likelihood" not in k}, 0)
    assert isinstance(plain.likelihood, gpflow.likelihoods.Gaussian)


def _quad_log_density(y, m, v, scale, df):
    """log of the integral of t(y; f, scale, df) N(f; m, v) df by adaptive quadrature over
    f = m + sqrt(v) z, z in [-12, 12], with a breakpoint where the t peaks."""
    s = np.sqrt(v)

    def integrand(z):
        return stats.t.pdf(y, df, loc=m + s * z, scale=scale) * stats.norm.pdf(z)

    peak = (y - m) / s
    points = [peak] if abs(peak) < 12 else None
    value, _ = integrate.quad(integrand, -12, 12, points=points, limit=500, epsabs=0, epsrel=1e-10)
    return np.log(value)


# (latent mean, latent variance, target): variances from far below the noise scale's square to far
# above it, targets from the mean to 10**4 scales away (an outlier)
CASES = [
    (0.0, 1e-8, 0.05),
    (0.3, 0.01, 0.2),
    (0.0, 2.0, 1.1),
    (-1.0, 25.0, 0.5),
    (0.0, 0.02, 1500.0),
]


@pytest.mark.parametrize("df", [2.5, 4.0, 30.0])
def test_the_predictive_density_is_the_t_integrated_over_the_gaussian(df):
    scale = 0.15
    lik = StudentT(scale=scale, df=df)
    m, v, y = (np.array([[c[i]] for c in CASES]) for i in range(3))
    X = np.zeros((len(CASES), 1))
    ours = lik.predict_log_density(X, m, v, y).numpy()
    exact = [_quad_log_density(y[n, 0], m[n, 0], v[n, 0], scale, df) for n in range(len(CASES))]
    np.testing.assert_allclose(ours, exact, rtol=1e-6, atol=1e-6)
    # with no latent variance it is the t density itself
    np.testing.assert_allclose(
        lik.predict_log_density(X, m, 0 * v, y).numpy(),
        stats.t.logpdf(y[:, 0], df, loc=m[:, 0], scale=scale),
        rtol=1e-8,
        atol=1e-8,
    )


def test_gpflows_quadrature_misses_where_the_latent_variance_dwarfs_the_scale():
    """Why the class exists: 20-point Gauss-Hermite in f is off by tenths of a nat here."""
    scale, df = 0.15, 4.0
    X, m, v, y = np.zeros((1, 1)), np.zeros((1, 1)), np.full((1, 1), 2.0), np.full((1, 1), 1.1)
    exact = _quad_log_density(1.1, 0.0, 2.0, scale, df)
    gpflow_t = gpflow.likelihoods.StudentT(scale=scale, df=df).predict_log_density(X, m, v, y)
    ours = StudentT(scale=scale, df=df).predict_log_density(X, m, v, y)
    assert abs(float(gpflow_t) - exact) > 0.1
    assert abs(float(ours) - exact) < 1e-6


def test_many_degrees_of_freedom_give_the_gaussian_of_the_same_scale():
    scale = 0.2
    m, v, y = (np.array([[c[i]] for c in CASES[:4]]) for i in range(3))
    X = np.zeros_like(m)
    t = StudentT(scale=scale, df=1e5).predict_log_density(X, m, v, y).numpy()
    g = gpflow.likelihoods.Gaussian(variance=scale**2).predict_log_density(X, m, v, y).numpy()
    np.testing.assert_allclose(t, g, rtol=0, atol=1e-4)


def test_a_one_layer_model_scores_its_moments_through_the_exact_density():
    rng = np.random.default_rng(0)
    X = rng.uniform(-2, 2, size=(12, 1))
    Y = np.sin(2 * X) + 0.1 * rng.standard_normal(X.shape)
    Y[3] += 4.0  # an outlier among the targets scored
    scale, df = 0.15, 4.0
    model = dg.build_deep_gp(
        X,
        Y,
        depth=1,
        posterior="mean_field",
        num_inducing=6,
        seed=0,
        likelihood=StudentT(scale=scale, df=df),
    )
    lpd = model.predict_log_density((X, Y), num_samples=3, seed=0).numpy()
    mean, var = (a.numpy() for a in model.predict_f(X, num_samples=3, seed=0))
    exact = [_quad_log_density(Y[n, 0], mean[n, 0], var[n, 0], scale, df) for n in range(12)]
    np.testing.assert_allclose(lpd, exact, rtol=1e-6, atol=1e-6)


def test_a_student_t_needs_finite_positive_degrees_of_freedom():
    for bad in (0.0, -1.0, np.inf, np.nan, True, "4"):
        with pytest.raises(ValueError, match="df must be a finite number above 0"):
            StudentT(df=bad)


@pytest.mark.slow  # trains one split of the benchmark protocol end to end: `make test-all`
def test_a_split_runs_with_a_student_t_and_records_it():
    cfg = dict(dataset="yacht", posterior="mean_field", depth=2, likelihood="student_t")
    record = uci_protocol.run_split(
        dict(cfg, num_inducing=5, steps=3, test_samples=2, batch_size=50), 0
    )
    assert record["likelihood"] == "student_t" and record["likelihood_df"] == 4.0
    assert np.isfinite(record["test_ll"]) and np.isfinite(record["rmse"])
    assert len(record["test_ll_points"]) == record["n_test"]


def test_tables_name_the_student_t():
    import benchmarks.medium as medium
    import benchmarks.uci as uci

    line = dict(posterior="sghmc", protocol="random", likelihood="student_t", likelihood_df=4.0)
    assert "Student-t, df 4" in uci._protocol_marks(line)
    assert medium._family(dict(line, dataset="energy", depth=2)).endswith("+t4")
