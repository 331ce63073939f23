"""deepgp_gi.metrics.estimate_elbo: evaluating the rows in chunks estimates the same ELBO; the
record of deepgp_gi.uci_protocol.run_split; the library stands without the benchmarks."""

import numpy as np
import pytest

import deepgp_gi as dg
from deepgp_gi.families import DEEP_GP_FAMILIES
from deepgp_gi.metrics import estimate_elbo


def _data(n=30, d=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    Y = np.sin(X[:, :1]) + 0.1 * rng.normal(size=(n, 1))
    return X, Y


@pytest.mark.parametrize("num_data", ["builder", None])
def test_chunked_elbo_equals_the_full_batch_elbo_when_it_is_deterministic(num_data):
    # one layer, Gaussian likelihood: the marginals and the KL are analytic, so every draw is the
    # exact ELBO and the chunked sum must equal it to rounding, with or without num_data set
    X, Y = _data()
    model = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=6, seed=0)
    if num_data is None:
        model.num_data = None
    exact = float(model.elbo((X, Y), 1, 0)) / len(X)
    full, full_se, _ = estimate_elbo(model, (X, Y), seed=1)
    chunked, chunked_se, _ = estimate_elbo(model, (X, Y), seed=1, chunk_size=7)
    assert full_se < 1e-12 and chunked_se < 1e-12
    np.testing.assert_allclose(full, exact, rtol=0, atol=1e-12)
    np.testing.assert_allclose(chunked, exact, rtol=0, atol=1e-10)


# global inducing needs many more draws for the same standard error: `make test-all`
@pytest.mark.parametrize(
    "posterior", ["mean_field", pytest.param("global", marks=pytest.mark.slow)]
)
def test_chunked_elbo_agrees_with_the_full_batch_estimate_at_depth_two(posterior):
    # sampled propagation (and, for global inducing, a sampled regulariser): the two estimators
    # differ draw by draw but have the same expectation
    X, Y = _data(n=40)
    model = dg.build_deep_gp(X, Y, depth=2, posterior=posterior, num_inducing=6, seed=0)
    full, full_se, _ = estimate_elbo(model, (X, Y), seed=2, se_target=0.003, samples_per_draw=16)
    chunked, chunked_se, _ = estimate_elbo(
        model, (X, Y), seed=3, se_target=0.003, samples_per_draw=16, chunk_size=15
    )
    assert abs(full - chunked) < 4 * np.hypot(full_se, chunked_se) + 1e-9, (
        full,
        full_se,
        chunked,
        chunked_se,
    )


def test_estimate_elbo_stops_early_only_when_its_target_is_out_of_reach():
    # global inducing samples its regulariser: draws differ by several nats per datapoint, so
    # max_draws draws would leave the SE far above ten times 0.01; the estimate stops after
    # projection_draws draws with its honest SE, and with the projection switched off (at
    # max_draws) it spends all max_draws; a reachable target stops as soon as it is met
    X, Y = _data(n=40)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="global", num_inducing=6, seed=0)
    spd = 2

    def estimate(se_target, projection_draws):
        return estimate_elbo(
            model,
            (X, Y),
            seed=4,
            se_target=se_target,
            samples_per_draw=spd,
            max_draws=60,
            projection_draws=projection_draws,
        )

    early, early_se, early_n = estimate(0.01, 12)
    assert early_n == 12 * spd and early_se > 0.1
    full, full_se, full_n = estimate(0.01, 60)
    assert full_n == 60 * spd
    # the same seeds: the first twelve draws are shared, and both estimates agree within their SEs
    assert abs(early - full) < 4 * np.hypot(early_se, full_se)
    # a target met before projection_draws: stops there, whatever the projection
    loose, loose_se, loose_n = estimate(10 * early_se, 12)
    assert loose_n == 4 * spd and loose_se < 10 * early_se


def test_estimate_elbo_refuses_a_bad_chunk_size_and_a_foreign_num_data():
    X, Y = _data()
    model = dg.build_deep_gp(X, Y, depth=1, posterior="mean_field", num_inducing=4, seed=0)
    with pytest.raises(ValueError, match="chunk_size"):
        estimate_elbo(model, (X, Y), chunk_size=0)
    with pytest.raises(ValueError, match="projection_draws"):
        estimate_elbo(model, (X, Y), projection_draws=2)
    model.num_data = 2 * len(X)
    with pytest.raises(ValueError, match="num_data"):
        estimate_elbo(model, (X, Y), chunk_size=7)


def test_every_family_has_a_positive_evaluation_budget_and_fully_coupled_the_smallest():
    budgets = {name: f.eval_row_samples for name, f in DEEP_GP_FAMILIES.items()}
    assert all(isinstance(b, int) and b > 0 for b in budgets.values())
    assert budgets["fully_coupled"] == min(budgets.values()) < budgets["mean_field"]


@pytest.mark.slow
def test_run_split_collects_a_sampling_familys_sample_set():
    """A sampling family (sghmc) is trained, its sample set collected (SAMPLER_COLLECT), and scored
    over the samples; it has no ELBO, so the record's is NaN."""
    import math

    from deepgp_gi.uci_protocol import SAMPLER_COLLECT, run_split

    r = run_split(dict(dataset="yacht", posterior="sghmc", depth=2, steps=40, num_inducing=8), 0)
    assert r["collected"] == SAMPLER_COLLECT and r["collect_time_s"] > 0
    assert (
        math.isfinite(r["test_ll"])
        and math.isfinite(r["rmse"])
        and math.isnan(r["elbo_per_datapoint"])
    )
    assert r["train_time_s"] >= r["collect_time_s"]
    assert len(r["layer_variances"]["between_rows"]) == 2
    # the record says where it trained: the CPU here unless TensorFlow sees a GPU
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    assert r["device"] == "CPU" if not gpus else r["device"].startswith("GPU: ")


@pytest.mark.slow  # two run_split calls: `make test-all`
def test_a_resumed_run_records_the_training_time_of_every_process(tmp_path, monkeypatch):
    """run_split's train_time_s counts the earlier processes of a run resumed from its checkpoint
    (the history's clock), not only the last one's."""
    from deepgp_gi import uci_protocol
    from deepgp_gi.training.checkpoint import Checkpointer

    cfg = dict(
        dataset="yacht", posterior="mean_field", depth=1, steps=20, num_inducing=5, test_samples=2
    )
    first = uci_protocol.run_split(cfg, 0, checkpoint_dir=str(tmp_path))
    # the checkpoint holds all 20 steps: the rerun restores it and trains no further, so its own
    # process spends almost nothing on training; pretend the earlier process took 1,000 s
    real_restore = Checkpointer.restore

    def slow_restore(self, history, log_every):
        start = real_restore(self, history, log_every)
        history.wall_time = [t + 1000.0 for t in history.wall_time]
        return start

    monkeypatch.setattr(Checkpointer, "restore", slow_restore)
    again = uci_protocol.run_split(cfg, 0, checkpoint_dir=str(tmp_path))
    assert again["test_ll"] == first["test_ll"]
    # the layer diagnostic is seeded: the same restored model gives the same numbers
    lv = first["layer_variances"]
    assert (
        lv["rows"] == first["n_train"] and len(lv["between_rows"]) == len(lv["within_samples"]) == 1
    )
    assert again["layer_variances"] == lv and lv["within_samples"][0] > 0
    assert 1000.0 < again["train_time_s"] < 1000.0 + first["train_time_s"] + 5.0


def test_the_library_never_imports_the_benchmarks():
    """No module of deepgp_gi imports the repository's benchmarks/ (an installed package has none);
    ``deepgp-gi uci`` runs on deepgp_gi.uci_protocol alone."""
    import re
    from pathlib import Path

    package = Path(dg.__file__).parent
    importing = [
        str(path.relative_to(package))
        for path in sorted(package.rglob("*.py"))
        if re.search(r"^\s*(from|import)\s+benchmarks\b", path.read_text(), re.MULTILINE)
    ]
    assert importing == []


@pytest.mark.slow  # trains one tiny configuration: `make test-all`
def test_run_split_with_a_validation_split_fits_the_rest_and_records_both_log_likelihoods(
    monkeypatch,
):
    """``validation=0.1``: the model fits 90 % of the training rows and the record holds the
    validation LL and RMSE beside the test ones; the test rows are the split's own."""
    import math

    from deepgp_gi import datasets, uci_protocol
    from deepgp_gi.uci_protocol import run_split

    cfg = dict(
        dataset="yacht", posterior="mean_field", depth=1, steps=20, num_inducing=5, test_samples=4
    )
    r = run_split(dict(cfg, validation=True), 0)
    plain = datasets.load_uci("yacht", 0)
    assert r["validation"] == 0.1 and r["n_valid"] == 28 and r["n_train"] == len(plain.X_train) - 28
    assert r["n_test"] == len(plain.X_test)
    assert all(math.isfinite(r[k]) for k in ("valid_ll", "valid_rmse", "test_ll", "rmse"))
    assert r["layer_variances"]["rows"] == r["n_train"]
    # each test point's log density, whose mean is the test LL (one layer: no sampled layers)
    assert len(r["test_ll_points"]) == r["n_test"]
    assert np.mean(r["test_ll_points"]) == pytest.approx(r["test_ll"], abs=1e-4)
    without = run_split(cfg, 0)
    assert (
        without["validation"] is None
        and "valid_ll" not in without
        and without["n_train"] == len(plain.X_train)
    )
    monkeypatch.setattr(uci_protocol, "POINTWISE_TEST_ROWS", len(plain.X_test) - 1)
    assert "test_ll_points" not in run_split(cfg, 0)  # a larger test set: its mean only


@pytest.mark.slow  # trains one tiny configuration: `make test-all`
def test_run_split_trains_a_dspp_on_the_predictive_objective():
    """``objective="predictive"`` reaches fit: the trace is the predictive objective, which is at
    least the ELBO the record estimates afterwards (the mixture's log density bounds the expected
    log-likelihood from above)."""
    import math

    from deepgp_gi.uci_protocol import run_split

    cfg = dict(dataset="yacht", posterior="dspp", depth=2, steps=20, num_inducing=5, test_samples=4)
    r = run_split(dict(cfg, objective="predictive"), 0)
    assert r["objective"] == "predictive" and math.isfinite(r["test_ll"])
    elbo, se = r["elbo_per_datapoint"], r["elbo_se_per_datapoint"]
    assert r["final_train_elbo_per_datapoint"] > elbo - 3 * se - 0.05
