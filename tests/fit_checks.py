"""Helpers shared by the training tests (``from fit_checks import ...``; tests/ is on ``sys.path``
under pytest): the toy regression data, a model's parameter values, and the XLA-against-plain
comparison of two ``fit`` runs."""

import numpy as np

import deepgp_gi as dg


def toy_regression(rng, n):
    """``X [n, 2]`` uniform on [-2, 2]^2, ``Y [n, 1] = sin(2 x_1) cos(x_2)`` plus noise 0.1."""
    X = rng.uniform(-2, 2, size=(n, 2))
    Y = np.sin(2 * X[:, :1]) * np.cos(X[:, 1:]) + 0.1 * rng.normal(size=(n, 1))
    return X, Y


def parameter_values(model):
    """Copies of the model's trainable variables, in ``trainable_variables`` order."""
    return [v.numpy().copy() for v in model.trainable_variables]


def assert_xla_fit_matches_plain(build, data, values_rtol=1e-8, **fit_kwargs):
    """``fit`` one model from ``build()`` with the plain compiled step and another with
    ``jit_compile=True``, under the same arguments: the compiled run is healthy (no
    ``CholeskyError``, every logged ELBO finite) and gives the same ELBO history (rtol 1e-8) and
    the same parameters (``values_rtol``, absolute 1e-8). Returns ``(plain, xla)``."""
    plain, xla = build(), build()
    h_plain = dg.fit(plain, data, progress=False, **fit_kwargs)
    h_xla = dg.fit(xla, data, progress=False, jit_compile=True, **fit_kwargs)
    assert len(h_xla.elbo) == len(h_plain.elbo) > 0 and np.all(np.isfinite(h_xla.elbo))
    np.testing.assert_allclose(h_xla.elbo, h_plain.elbo, rtol=1e-8)
    # XLA rounds differently (~1e-16 relative); Adam's first steps turn a gradient that is 0 in one
    # and 1e-12 in the other into updates up to ~lr * 1e-5 apart, hence the small absolute slack
    for a, b in zip(parameter_values(xla), parameter_values(plain)):
        np.testing.assert_allclose(a, b, rtol=values_rtol, atol=1e-8)
    return plain, xla
