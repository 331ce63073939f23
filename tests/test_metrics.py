"""Classification metrics: ECE, accuracy and entropy on arrays against constructed cases, and on a
Softmax / Bernoulli model against the array versions applied to its class probabilities.
Regression calibration: the predictive CDF and per-point log density against the Gaussian of a
one-layer model, and calibration curves against analytic coverages."""

import gpflow
import numpy as np
import pytest

import deepgp_gi as dg
from deepgp_gi.metrics import (
    calibration_curve,
    categorical_entropy,
    expected_calibration_error,
    pointwise_log_density,
    predict_class_probabilities,
    predictive_cdf,
    top1_accuracy,
)


def _brute_force_ece(probs, labels, num_bins):
    """Guo et al.'s definition, bin by bin: bin m holds the confidences in ((m-1)/M, m/M]."""
    conf, pred = probs.max(axis=1), probs.argmax(axis=1)
    total = 0.0
    for m in range(1, num_bins + 1):
        lo, hi = np.linspace(0, 1, num_bins + 1)[m - 1], np.linspace(0, 1, num_bins + 1)[m]
        members = (conf > lo) & (conf <= hi)
        if members.any():
            total += (
                members.sum()
                / len(conf)
                * abs(np.mean(pred[members] == labels[members]) - conf[members].mean())
            )
    return total


# ------------------------------------------------------------------------------------- arrays
def test_ece_of_a_constant_overconfident_predictor_is_the_gap():
    # every confidence 0.9, 70% correct: ECE = |0.7 - 0.9| = 0.2, for any number of bins
    probs = np.tile([0.9, 0.1], (100, 1))
    labels = np.r_[np.zeros(70), np.ones(30)]
    for bins in (1, 10, 15):
        assert expected_calibration_error(probs, labels, bins) == pytest.approx(0.2, abs=1e-12)


def test_ece_two_bin_construction():
    # half the points at confidence 0.6, all correct (gap 0.4); half at 0.95, half
    # correct (gap 0.45)
    probs = np.r_[np.tile([0.6, 0.3, 0.1], (40, 1)), np.tile([0.025, 0.95, 0.025], (40, 1))]
    labels = np.r_[np.zeros(40), np.ones(20), np.zeros(20)]
    assert expected_calibration_error(probs, labels, 15) == pytest.approx(
        0.5 * 0.4 + 0.5 * 0.45, abs=1e-12
    )
    # one bin pools them: |accuracy 0.75 - mean confidence 0.775|
    assert expected_calibration_error(probs, labels, 1) == pytest.approx(0.025, abs=1e-12)
    # labels as [N, 1] integer-valued floats (the models' Y) give the same
    assert expected_calibration_error(probs, labels[:, None].astype(float), 15) == pytest.approx(
        0.425, abs=1e-12
    )


def test_ece_of_one_hot_predictions():
    labels = np.array([0, 2, 1, 1, 0])
    one_hot = np.eye(3)[labels]
    assert expected_calibration_error(one_hot, labels) == 0.0
    assert expected_calibration_error(one_hot, (labels + 1) % 3) == 1.0  # certain and always wrong


def test_ece_matches_the_definition_bin_by_bin():
    rng = np.random.default_rng(5)
    probs = rng.dirichlet(np.full(4, 0.7), size=500)
    labels = rng.integers(0, 4, size=500)
    for bins in (1, 3, 15, 40):
        np.testing.assert_allclose(
            expected_calibration_error(probs, labels, bins),
            _brute_force_ece(probs, labels, bins),
            rtol=1e-12,
        )


def test_ece_of_a_calibrated_predictor_is_within_its_monte_carlo_bound():
    """Labels drawn from the predicted probabilities: in bin b, n_b / N * (acc_b - conf_b) is a sum
    of n_b independent zero-mean terms (I_n - conf_n) / N, nearly normal with sd
    s_b = sqrt(sum_n conf_n (1 - conf_n)) / N. So ECE = sum_b |.| has mean sqrt(2 / pi) sum_b s_b
    and sd below sqrt(sum_b s_b^2): ECE < mean + 5 sd except with probability ~1e-6."""
    rng = np.random.default_rng(0)
    N, C, bins = 200_000, 3, 15
    probs = rng.dirichlet(np.ones(C), size=N)
    labels = (rng.uniform(size=(N, 1)) > np.cumsum(probs, axis=1)).sum(
        axis=1
    )  # y_n ~ Categorical(probs_n)
    conf = probs.max(axis=1)
    which = np.digitize(conf, np.linspace(0, 1, bins + 1)[1:-1], right=True)
    s = np.array(
        [np.sqrt(np.sum(conf[which == b] * (1 - conf[which == b]))) / N for b in range(bins)]
    )
    bound = np.sqrt(2 / np.pi) * s.sum() + 5 * np.sqrt(np.sum(s**2))
    calibrated = expected_calibration_error(probs, labels, bins)
    assert calibrated < bound < 0.01  # the bound is 0.0076; over 200 seeds the ECE averaged 0.0025
    # the same labels judged against sharpened probabilities are clearly miscalibrated
    sharp = probs**3 / np.sum(probs**3, axis=1, keepdims=True)
    assert expected_calibration_error(sharp, labels, bins) > 5 * bound


def test_accuracy_and_entropy_hand_computed():
    probs = np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6], [0.4, 0.5, 0.1], [0.2, 0.2, 0.6]])
    assert top1_accuracy(probs, [0, 1, 1, 2]) == 0.75  # rows 0, 2, 3 right
    assert top1_accuracy(np.full((2, 2), 0.5), [0, 1]) == 0.5  # a tie goes to class 0
    for C in (2, 3, 10):
        np.testing.assert_allclose(
            categorical_entropy(np.full((4, C), 1.0 / C)), np.log(C), rtol=1e-14
        )
    np.testing.assert_array_equal(categorical_entropy(np.eye(3)), np.zeros(3))  # 0 log 0 = 0
    np.testing.assert_allclose(
        categorical_entropy([[0.5, 0.5, 0.0], [0.25, 0.25, 0.5]]),
        [np.log(2), 1.5 * np.log(2)],
        rtol=1e-14,
    )


def test_bad_arrays_are_refused_with_the_argument_named():
    probs = np.array([[0.2, 0.8], [0.6, 0.4]])
    labels = np.array([1, 0])
    with pytest.raises(ValueError, match="probs must be 2-D"):
        expected_calibration_error(probs[0], labels)
    with pytest.raises(ValueError, match="probs contains NaN"):
        expected_calibration_error(np.array([[np.nan, 1.0], [0.5, 0.5]]), labels)
    with pytest.raises(ValueError, match=r"probs must lie in \[0, 1\]; row 1"):
        expected_calibration_error(np.array([[0.5, 0.5], [1.5, -0.5]]), labels)
    with pytest.raises(
        ValueError, match="probs rows must sum to 1 within 1e-06; row 0 sums to 0.9"
    ):
        expected_calibration_error(np.array([[0.5, 0.4], [0.5, 0.5]]), labels)
    with pytest.raises(TypeError, match="probs must hold real numbers"):
        expected_calibration_error(np.array([["a", "b"]]), [0])
    with pytest.raises(ValueError, match=r"labels must be integers in \[0, 2\).*entry 1 is 2"):
        expected_calibration_error(probs, [1, 2])
    with pytest.raises(ValueError, match=r"labels must be integers .* entry 0 is 0.5"):
        expected_calibration_error(probs, [0.5, 1])
    with pytest.raises(ValueError, match=r"labels must be integers .* entry 0 is -1"):
        expected_calibration_error(probs, [-1, 1])
    with pytest.raises(ValueError, match="labels has 3 entries but probs has 2 rows"):
        expected_calibration_error(probs, [0, 1, 1])
    with pytest.raises(ValueError, match=r"labels must have shape \[N\] or \[N, 1\]"):
        expected_calibration_error(probs, np.zeros((2, 2)))
    with pytest.raises(TypeError, match="labels must hold integer class labels"):
        expected_calibration_error(probs, np.array([True, False]))
    with pytest.raises(ValueError, match="num_bins must be at least 1"):
        expected_calibration_error(probs, labels, 0)
    with pytest.raises(TypeError, match="num_bins must be an integer"):
        expected_calibration_error(probs, labels, 2.0)
    with pytest.raises(ValueError, match="probs rows must sum to 1"):
        categorical_entropy([[0.5, 0.6]])
    with pytest.raises(ValueError, match="labels has 1 entries"):
        top1_accuracy(probs, [0])


# ------------------------------------------------------------------------------------- models
def _softmax_bnn(rng, n=31):
    X = rng.normal(size=(n, 2))
    Y = rng.integers(0, 3, size=(n, 1)).astype(float)
    model = dg.build_bnn(
        X, Y, hidden=(8,), likelihood=gpflow.likelihoods.Softmax(3), num_inducing=10, seed=0
    )
    return model, X, Y


def test_class_probabilities_are_the_predictive_mixture_mean(rng):
    model, X, Y = _softmax_bnn(rng)
    probs = predict_class_probabilities(model, X, 20, seed=3)
    assert probs.shape == (31, 3)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-12)
    np.testing.assert_array_equal(probs, model.predict_y(X, 20, seed=3)[0].numpy())  # one chunk
    # the global-inducing BNN samples its last weights: p = mean_s softmax(f_s), no
    # GPflow Monte Carlo
    f = model.predict_f_samples(X, 20, seed=3).numpy()
    softmax = np.exp(f - f.max(-1, keepdims=True))
    np.testing.assert_allclose(
        probs, np.mean(softmax / softmax.sum(-1, keepdims=True), axis=0), rtol=1e-10
    )
    # chunks of 8 rows: the first chunk is the one-chunk draw's, the others differ (own seeds)
    chunked = predict_class_probabilities(model, X, 20, chunk_size=8, seed=3)
    np.testing.assert_array_equal(
        chunked[:8], predict_class_probabilities(model, X[:8], 20, seed=3)
    )
    assert chunked.shape == (31, 3) and not np.allclose(chunked[8:], probs[8:])
    np.testing.assert_array_equal(
        chunked, predict_class_probabilities(model, X, 20, chunk_size=8, seed=3)
    )


@pytest.mark.parametrize("chunk_size", [1000, 8])
def test_model_metrics_equal_the_array_metrics_on_its_probabilities(rng, chunk_size):
    model, X, Y = _softmax_bnn(rng)
    kwargs = dict(num_samples=20, chunk_size=chunk_size, seed=4)
    probs = predict_class_probabilities(model, X, **kwargs)
    labels = Y[:, 0].astype(int)
    assert dg.metrics.accuracy(model, X, Y, **kwargs) == top1_accuracy(probs, labels)
    assert dg.metrics.ece(model, X, Y, num_bins=7, **kwargs) == expected_calibration_error(
        probs, labels, 7
    )
    entropy = categorical_entropy(probs)
    np.testing.assert_array_equal(
        dg.metrics.predictive_entropy(model, X, per_point=True, **kwargs), entropy
    )
    assert dg.metrics.predictive_entropy(model, X, **kwargs) == pytest.approx(
        np.mean(entropy), rel=1e-14
    )
    assert 0 < np.mean(entropy) < np.log(3)
    # the test log-likelihood of a classifier is the mean log probability of the true class
    ll = dg.metrics.test_log_likelihood(model, X, Y, **kwargs)
    np.testing.assert_allclose(ll, np.mean(np.log(probs[np.arange(len(X)), labels])), rtol=1e-10)


def test_confident_model_metrics(rng):
    """A model pushed to predict class 0 everywhere: accuracy = fraction of 0 labels, ECE =
    |that fraction - mean confidence|, entropy near 0."""
    model, X, Y = _softmax_bnn(rng)
    last = model.posterior.pseudo_data[-1].pseudo_outputs  # V_L [M, 3] of the last layer
    big = np.zeros(last.shape)
    big[:, 0] = 200.0  # every inducing point says class 0, loudly
    last.assign(big)
    probs = predict_class_probabilities(model, X, 10, seed=0)
    assert np.all(probs.argmax(axis=1) == 0)
    zero = float(np.mean(Y[:, 0] == 0))
    assert dg.metrics.accuracy(model, X, Y, 10, seed=0) == zero
    np.testing.assert_allclose(
        dg.metrics.ece(model, X, Y, 10, seed=0), abs(zero - probs[:, 0].mean()), rtol=1e-12
    )


@pytest.mark.slow  # trains 100 steps first: `make test-all`
def test_bernoulli_model_has_two_class_probabilities(rng):
    X = rng.normal(size=(25, 2))
    Y = (X[:, :1] > 0).astype(float)
    model = dg.build_bnn(
        X, Y, hidden=(8,), likelihood=gpflow.likelihoods.Bernoulli(), num_inducing=10, seed=0
    )
    # A short fit so that the probabilities straddle 0.5 (at initialisation the marginal last
    # layer's mean has the sign of the pseudo-outputs everywhere) and accuracy is not
    # trivially one class.
    dg.fit(model, (X, Y), steps=100, learning_rate=0.05, progress=False, seed=0)
    probs = predict_class_probabilities(model, X, 10, seed=1)
    p1 = model.predict_y(X, 10, seed=1)[0].numpy()[:, 0]
    np.testing.assert_array_equal(probs[:, 1], p1)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-15)
    assert 0 < p1.min() < 0.5 < p1.max() < 1
    assert np.mean((p1 > 0.5) == Y[:, 0]) > 0.8  # it learned the sign of X[:, 0]
    assert dg.metrics.accuracy(model, X, Y, 10, seed=1) == np.mean(
        np.where(p1 > 0.5, 1, 0) == Y[:, 0]
    )
    assert dg.metrics.ece(model, X, Y, 10, seed=1) == expected_calibration_error(probs, Y)


def test_classification_metrics_refuse_bad_input(rng):
    model, X, Y = _softmax_bnn(rng)
    X_reg, Y_reg = rng.normal(size=(10, 2)), rng.normal(size=(10, 1))
    regression = dg.build_deep_gp(
        X_reg, Y_reg, depth=1, posterior="mean_field", num_inducing=5, seed=0
    )
    for fn, args in (
        (predict_class_probabilities, (X_reg,)),
        (dg.metrics.accuracy, (X_reg, Y_reg)),
        (dg.metrics.ece, (X_reg, Y_reg)),
        (dg.metrics.predictive_entropy, (X_reg,)),
    ):
        with pytest.raises(
            TypeError,
            match="need a model with a Softmax, MultiClass or Bernoulli likelihood; "
            "this model has Gaussian",
        ):
            fn(regression, *args)
    with pytest.raises(ValueError, match=r"Y_test must hold class labels 0..2"):
        dg.metrics.accuracy(model, X, np.full_like(Y, 3.0))
    with pytest.raises(ValueError, match="X_test has 31 rows but Y_test has 30"):
        dg.metrics.ece(model, X, Y[:30])
    with pytest.raises(ValueError, match="num_bins must be at least 1"):
        dg.metrics.ece(model, X, Y, num_bins=0)
    with pytest.raises(ValueError, match="num_samples must be at least 1"):
        dg.metrics.accuracy(model, X, Y, num_samples=0)
    with pytest.raises(ValueError, match="chunk_size must be at least 1"):
        predict_class_probabilities(model, X, chunk_size=0)
    with pytest.raises(TypeError, match="seed must be an integer or None"):
        dg.metrics.predictive_entropy(model, X, seed=1.5)
    with pytest.raises(TypeError, match="per_point must be True or False"):
        dg.metrics.predictive_entropy(model, X, per_point="yes")
    with pytest.raises(ValueError, match="X_test contains NaN at row 2"):
        dg.metrics.predictive_entropy(model, np.where(np.arange(31)[:, None] == 2, np.nan, X))


# ------------------------------------------------------------------------------
# regression calibration
def _one_layer_gp(rng, n=40):
    X = rng.normal(size=(n, 2))
    Y = np.sin(X[:, :1]) + 0.1 * rng.normal(size=(n, 1))
    return dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=8, seed=0), X, Y


def test_predictive_cdf_of_a_one_layer_model_is_the_gaussian_cdf(rng):
    # depth 1: every sample's component is the same Gaussian, so the mixture CDF is the CDF of
    # N(predict_y mean, predict_y var) (an exact identity, independent of the Monte Carlo draws)
    from scipy.stats import norm

    model, X, Y = _one_layer_gp(rng)
    Xt, Yt = rng.normal(size=(25, 2)), rng.normal(size=(25, 1))
    pit = predictive_cdf(model, Xt, Yt, 5, seed=1)
    mean, var = model.predict_y(Xt, 5, seed=1)
    np.testing.assert_allclose(
        pit, norm.cdf(Yt[:, 0], mean.numpy()[:, 0], np.sqrt(var.numpy()[:, 0])), atol=1e-12
    )
    # chunking draws other samples but, here, the same components
    np.testing.assert_allclose(
        predictive_cdf(model, Xt, Yt, 5, chunk_size=7, seed=1), pit, atol=1e-12
    )


def test_pointwise_log_density_is_the_per_point_test_log_likelihood(rng):
    model, X, Y = _one_layer_gp(rng)
    lpd = pointwise_log_density(model, X, Y, y_std=2.5, num_samples=10, seed=4)
    assert lpd.shape == (len(X),)
    assert np.mean(lpd) == pytest.approx(
        dg.metrics.test_log_likelihood(model, X, Y, 2.5, 10, seed=4), abs=1e-12
    )
    mean, var = model.predict_y(X, 10, seed=4)
    from scipy.stats import norm

    np.testing.assert_allclose(
        lpd,
        norm.logpdf(Y[:, 0], mean.numpy()[:, 0], np.sqrt(var.numpy()[:, 0])) - np.log(2.5),
        atol=1e-9,
    )


def test_calibration_curve_oracles():
    from scipy.stats import norm

    rng = np.random.default_rng(0)
    n = 200_000
    levels, observed = calibration_curve(rng.uniform(size=n))  # calibrated: coverage = nominal
    np.testing.assert_allclose(observed, levels, atol=4 * np.sqrt(0.25 / n))
    # predictive N(0, 1) for targets ~ N(0, 2^2): the central p-interval +-q, q =
    # Phi^-1((1 + p) / 2), holds a fraction 2 Phi(q / 2) - 1 of the targets
    y = 2.0 * rng.normal(size=n)
    levels, observed = calibration_curve(norm.cdf(y), [0.2, 0.5, 0.9])
    expected = 2 * norm.cdf(norm.ppf((1 + levels) / 2) / 2) - 1
    np.testing.assert_allclose(observed, expected, atol=4 * np.sqrt(0.25 / n))
    assert np.all(observed < levels)  # overconfident
    # hand-made: u = 0.5 is inside every interval, u = 0 and 1 only inside the 100% one
    lv, ob = calibration_curve([0.5, 0.0, 1.0, 0.3], [0.2, 0.4, 1.0])
    np.testing.assert_allclose(ob, [0.25, 0.5, 1.0])


def test_calibration_inputs_are_checked(rng):
    with pytest.raises(ValueError, match=r"pit values must lie in \[0, 1\]"):
        calibration_curve([0.2, 1.2])
    with pytest.raises(ValueError, match="pit must be a non-empty 1-D array"):
        calibration_curve([])
    with pytest.raises(ValueError, match="pit contains NaN"):
        calibration_curve([0.2, np.nan])
    with pytest.raises(
        ValueError, match=r"levels must be a 1-D array of probabilities in \(0, 1\]"
    ):
        calibration_curve([0.2], [0.0, 0.5])
    model, X, Y = _softmax_bnn(rng)
    with pytest.raises(TypeError, match="predictive_cdf needs a Gaussian likelihood"):
        predictive_cdf(model, X, Y, 3)


# ------------------------------------------------------------------------------ layer variances
def _two_layer_gp(rng, n=30):
    X = rng.normal(size=(n, 2))
    Y = np.sin(X[:, :1]) + 0.1 * rng.normal(size=(n, 1))
    model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=6, seed=0)
    post = model.posterior
    for l, width in enumerate((2, 1)):  # a posterior away from the prior: random means and spreads
        post.q_mu[l].assign(rng.standard_normal((6, width)))
        q_sqrt = np.tril(0.3 * rng.standard_normal((width, 6, 6)), -1) + np.eye(6) * rng.uniform(
            0.2, 0.8, (width, 6, 1)
        )
        post.q_sqrt[l].assign(q_sqrt)
    return model, X


def test_layer_variances_of_a_one_layer_model_are_predict_f_moments(rng):
    # depth 1: every sample is drawn from the same Gaussian per row, so the within-sample variance
    # estimates predict_f's variance and the sample means' spread over rows predict_f's
    # mean's spread
    model, X, _ = _one_layer_gp(rng, n=30)
    model.posterior.q_mu[0].assign(rng.standard_normal((8, 1)))
    model.posterior.q_sqrt[0].assign(
        (np.tril(0.3 * rng.standard_normal((8, 8)), -1) + 0.5 * np.eye(8))[None]
    )
    mean, var = model.predict_f(X, 5, seed=0)
    got = dg.metrics.layer_variances(model, X, num_samples=4000, seed=3)
    assert len(got.between_rows) == len(got.within_samples) == 1
    np.testing.assert_allclose(got.within_samples[0], np.mean(var.numpy()), rtol=0.03)
    np.testing.assert_allclose(got.between_rows[0], np.var(mean.numpy()), rtol=0.03)


def test_layer_variances_follow_the_sampled_layers(rng):
    # two layers: the per-layer numbers are the sample statistics of model.sample_layers's draws
    model, X = _two_layer_gp(rng)
    layers = [F.numpy() for F in model.sample_layers(X, 50, seed=7)]
    got = dg.metrics.layer_variances(model, X, num_samples=50, seed=7)
    np.testing.assert_allclose(
        got.between_rows, [np.mean(np.var(F.mean(0), axis=0)) for F in layers], rtol=1e-10
    )
    np.testing.assert_allclose(
        got.within_samples, [np.mean(np.var(F, axis=0, ddof=1)) for F in layers], rtol=1e-10
    )


def test_layer_variances_inputs_are_checked(rng):
    model, X = _two_layer_gp(rng)
    with pytest.raises(ValueError, match="num_samples must be at least 2"):
        dg.metrics.layer_variances(model, X, num_samples=1)
    with pytest.raises(ValueError, match="X needs at least 2 rows"):
        dg.metrics.layer_variances(model, X[:1])
    with pytest.raises(ValueError, match="X"):
        dg.metrics.layer_variances(model, X[:, :1])
    with pytest.raises(ValueError, match="X contains NaN"):
        dg.metrics.layer_variances(model, np.where(np.arange(30)[:, None] == 3, np.nan, X))


# ------------------------------------------------------------------------------ constant baseline
def test_constant_gaussian_test_ll_is_the_raw_units_gaussian_fit(rng):
    # standardised targets and y_std give the same number as fitting the Gaussian to the raw targets
    from scipy.stats import norm

    raw_train, raw_test = (
        3.0 + 0.2 * rng.normal(size=(50, 1)),
        3.1 + 0.25 * rng.normal(size=(20, 1)),
    )
    m, s = raw_train.mean(), raw_train.std()
    expected = norm.logpdf(raw_test, m, s).mean()
    got = dg.metrics.constant_gaussian_test_ll((raw_train - m) / s, (raw_test - m) / s, y_std=s)
    assert got == pytest.approx(expected, abs=1e-12)


def test_constant_gaussian_test_ll_inputs_are_checked(rng):
    Y = rng.normal(size=(10, 1))
    with pytest.raises(ValueError, match=r"Y_train must be \[N, 1\] with N >= 2"):
        dg.metrics.constant_gaussian_test_ll(Y[:1], Y)
    with pytest.raises(ValueError, match=r"Y_test must be \[N, 1\]"):
        dg.metrics.constant_gaussian_test_ll(Y, np.c_[Y, Y])
    with pytest.raises(ValueError, match="Y_test contains NaN"):
        dg.metrics.constant_gaussian_test_ll(Y, np.where(np.arange(10)[:, None] == 1, np.nan, Y))
    with pytest.raises(ValueError, match="y_std must be a positive"):
        dg.metrics.constant_gaussian_test_ll(Y, Y, y_std=0.0)
    with pytest.raises(ValueError, match="Y_train is constant"):
        dg.metrics.constant_gaussian_test_ll(np.ones((5, 1)), Y)
