"""Sharded data: exact round trip, order without shuffling, and a streamed fit equal to the
in-memory fit on the same batches."""

import numpy as np
import pytest
import tensorflow as tf

import deepgp_gi as dg


def _rows(rng, N=37, D=3):
    X = rng.normal(size=(N, D))
    return X, np.sin(X[:, :1]) + 0.1 * rng.normal(size=(N, 1))


def test_rows_come_back_exactly_and_in_order(rng, tmp_path):
    X, Y = _rows(rng)
    paths = dg.datasets.write_shards(X, Y, tmp_path, num_shards=4)
    assert len(paths) == 4 and dg.datasets.shard_info(tmp_path)["rows_per_shard"] == [9, 9, 9, 10]
    xs, ys = zip(
        *[(x.numpy(), y.numpy()) for x, y in dg.datasets.read_shards(tmp_path, 5, shuffle=False)]
    )
    np.testing.assert_array_equal(np.concatenate(xs), X)  # bit-exact float64
    np.testing.assert_array_equal(np.concatenate(ys), Y)
    assert [len(x) for x in xs] == [5] * 7 + [2]


def test_shuffled_pass_is_a_seeded_permutation(rng, tmp_path):
    X, Y = _rows(rng)
    dg.datasets.write_shards(X, Y, tmp_path, num_shards=3)

    def one_pass(seed):
        return np.concatenate(
            [x.numpy() for x, _ in dg.datasets.read_shards(tmp_path, 8, seed=seed)]
        )

    a, b, c = one_pass(1), one_pass(1), one_pass(2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, X) and not np.array_equal(a, c)
    np.testing.assert_array_equal(np.sort(a, axis=0), np.sort(X, axis=0))


def test_streamed_fit_equals_in_memory_fit(rng, tmp_path):
    X, Y = _rows(rng, N=40)
    dg.datasets.write_shards(X, Y, tmp_path, num_shards=5)
    results = []
    for data in (
        tf.data.Dataset.from_tensor_slices((X, Y)).batch(10),
        dg.datasets.read_shards(tmp_path, 10, shuffle=False),
    ):
        model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=6, seed=0)
        assert model.num_data == dg.datasets.shard_info(tmp_path)["num_rows"]
        history = dg.fit(
            model, data, steps=9, seed=3, progress=False, log_every=3
        )  # crosses 2 passes
        results.append((history.elbo, [v.numpy() for v in model.trainable_variables]))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1]):
        np.testing.assert_array_equal(a, b)


def test_bad_shard_arguments(rng, tmp_path):
    X, Y = _rows(rng, N=5)
    with pytest.raises(ValueError, match="num_shards=6 exceeds"):
        dg.datasets.write_shards(X, Y, tmp_path / "a", num_shards=6)
    with pytest.raises(ValueError, match="X has 5 rows but Y has 4"):
        dg.datasets.write_shards(X, Y[:4], tmp_path / "b")
    dg.datasets.write_shards(X, Y, tmp_path / "c", num_shards=2)
    with pytest.raises(ValueError, match="already holds shards"):
        dg.datasets.write_shards(X, Y, tmp_path / "c", num_shards=2)
    with pytest.raises(FileNotFoundError, match="no shards"):
        dg.datasets.read_shards(tmp_path / "nothing", 4)


@pytest.mark.slow  # moved to `make test-all` for the fast suite's time
def test_evaluate_dataset_equals_the_array_metrics(rng, tmp_path):
    """Streamed metrics equal the array metrics when both see the same draws: with a seeded
    model and a single batch holding every row, the two paths run the same computation."""
    X, Y = _rows(rng, N=30)
    dg.datasets.write_shards(X, Y, tmp_path, num_shards=3)
    model = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=6, seed=0)
    dg.fit(model, (X, Y), steps=20, seed=0, progress=False)
    tf.random.set_seed(7)
    streamed = dg.metrics.evaluate_dataset(
        model,
        dg.datasets.read_shards(tmp_path, 30, shuffle=False),
        y_std=2.0,
        num_samples=50,
        progress=False,
    )
    tf.random.set_seed(7)
    ll = dg.metrics.test_log_likelihood(model, X, Y, 2.0, 50)
    rm = dg.metrics.rmse(model, X, Y, 2.0, 50)
    assert streamed["num_points"] == 30
    np.testing.assert_allclose(streamed["test_ll"], ll, rtol=1e-12)
    # in batches the estimate is a fresh Monte Carlo draw per batch: close, not equal
    batched = dg.metrics.evaluate_dataset(
        model,
        dg.datasets.read_shards(tmp_path, 7, shuffle=False),
        y_std=2.0,
        num_samples=400,
        progress=False,
    )
    assert abs(batched["rmse"] - rm) < 0.05 * rm
    with pytest.raises(TypeError, match="tf.data.Dataset"):
        dg.metrics.evaluate_dataset(model, (X, Y))
