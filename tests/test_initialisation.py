"""deepgp_gi.initialisation: one policy for the global inducing rows of every model kind, class
labels as one-hot pseudo-outputs, and the family tables' named initialisers."""

import gpflow
import numpy as np
import pytest

import deepgp_gi as dg
from deepgp_gi import initialisation as init


def test_rows_are_a_seeded_subset_of_the_data_when_m_is_at_most_n():
    X = np.arange(20.0).reshape(10, 2)
    T = np.arange(10.0)[:, None] * 100
    U0, V = init.global_inducing_rows(X, T, 4, np.random.default_rng(0))
    U0b, _ = init.global_inducing_rows(X, T, 4, np.random.default_rng(0))
    np.testing.assert_array_equal(U0, U0b)
    assert len({tuple(u) for u in U0}) == 4
    for u, v in zip(U0, V):  # each pseudo-output is its row's target
        row = int(np.flatnonzero((X == u).all(1))[0])
        assert v[0] == T[row, 0]
    U0, V = init.global_inducing_rows(X, T, 10, np.random.default_rng(1))  # M = N: a permutation
    assert sorted(map(tuple, U0)) == sorted(map(tuple, X))


def test_rows_are_standard_normal_draws_when_m_exceeds_n():
    X = np.full((5, 3), 7.0)
    T = np.full((5, 2), 7.0)
    U0, V = init.global_inducing_rows(X, T, 4000, np.random.default_rng(0))
    assert U0.shape == (4000, 3) and V.shape == (4000, 2)
    for draws in (U0, V):  # N(0, 1): no data row, mean 0 and variance 1 to sampling error
        assert abs(draws.mean()) < 0.05 and abs(draws.var() - 1.0) < 0.06
    images = np.zeros((3, 4, 4, 1))
    U0, _ = init.global_inducing_rows(images, np.zeros((3, 2)), 5, np.random.default_rng(0))
    assert U0.shape == (5, 4, 4, 1)


@pytest.mark.parametrize("kind", ["deep_gp", "bnn", "conv_bnn"])
def test_every_model_kind_follows_the_one_policy_for_m_greater_than_n(kind):
    rng = np.random.default_rng(3)
    if kind == "conv_bnn":
        X, Y = rng.normal(size=(6, 8, 8, 1)), rng.integers(0, 2, size=(6, 1)).astype(float)
        model = dg.build_conv_bnn(
            X, Y, posterior="global", num_inducing=9, channels=(2, 2), hidden=(4,), seed=0
        )
    elif kind == "bnn":
        X, Y = rng.normal(size=(6, 2)), rng.normal(size=(6, 1))
        model = dg.build_bnn(X, Y, hidden=(4,), posterior="global", num_inducing=9, seed=0)
    else:
        X, Y = rng.normal(size=(6, 2)), rng.normal(size=(6, 1))
        model = dg.build_deep_gp(X, Y, depth=2, posterior="global", num_inducing=9, seed=0)
    U0 = model.posterior.inducing_inputs.numpy()
    assert U0.shape[0] == 9
    flat = X.reshape(len(X), -1)
    assert not any(np.allclose(u.ravel(), x) for u in U0 for x in flat)


def test_class_labels_become_one_hot_pseudo_outputs_in_every_builder():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(12, 2))
    labels = rng.integers(0, 3, size=(12, 1)).astype(float)
    np.testing.assert_array_equal(
        init.pseudo_targets(labels, gpflow.likelihoods.Softmax(3), 3),
        np.eye(3)[labels[:, 0].astype(int)],
    )
    Y = rng.normal(size=(12, 2))
    np.testing.assert_array_equal(init.pseudo_targets(Y, gpflow.likelihoods.Gaussian(), 2), Y)
    with pytest.raises(ValueError, match="Y must hold integer class labels 0..2"):
        init.pseudo_targets(labels + 0.5, gpflow.likelihoods.Softmax(3), 3)
    # a deep GP with a Softmax likelihood and global inducing (this used to fail on [N, 1] labels)
    model = dg.build_deep_gp(
        X,
        labels,
        depth=2,
        posterior="global",
        num_inducing=5,
        inner_width=2,
        likelihood=gpflow.likelihoods.Softmax(3),
        seed=0,
    )
    V = model.posterior.pseudo_data[-1].pseudo_outputs.numpy()
    U0 = model.posterior.inducing_inputs.numpy()
    rows = [int(np.flatnonzero((X == u).all(1))[0]) for u in U0]
    np.testing.assert_array_equal(V, np.eye(3)[labels[rows, 0].astype(int)])


def test_the_weight_prior_factory_makes_a_fresh_prior_per_layer():
    from deepgp_gi.priors import NealPrior, ScalePrior

    make = init.weight_prior_factory("neal")
    assert isinstance(make(), NealPrior) and make() is not make()
    template = ScalePrior(power=-0.5)
    copy = init.weight_prior_factory(template)
    assert copy() is not template and copy().power == -0.5
    with pytest.raises(ValueError, match="prior"):
        init.weight_prior_factory("nael")
