"""Every family's ELBO (and a few predictions) on fixed data and fixed noise, as recorded in
``tests/reference/family_elbos.json``: a regression oracle for refactoring. A change of the maths
that is meant shows here; rewrite the file with ``python tests/family_reference.py --write`` and
say why in the commit.

``values(trained=False)`` builds each family with a fixed seed and evaluates it untrained;
``values(trained=True)`` fits each deep-GP family for a few steps first (the samplers also
collect samples), which also pins the training step."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

import deepgp_gi as dg
from deepgp_gi.families import BNN_FAMILIES, CONV_BNN_FAMILIES, DEEP_GP_FAMILIES

REFERENCE = Path(__file__).resolve().parent / "reference" / "family_elbos.json"
BUILT_IN = {
    "deep_gp": ("mean_field", "fully_coupled", "stripes_arrow", "global", "local", "sghmc", "bsgp"),
    "latent": ("mean_field", "fully_coupled", "stripes_arrow", "global", "local"),
    "bnn": (
        "factorised",
        "local",
        "global",
        "factorised_global",
        "random_global",
        "ffg_u",
        "ensemble_u",
        "ensemble_w",
    ),
    "conv": (
        "factorised",
        "local",
        "global",
        "factorised_global",
        "ffg_u",
        "ensemble_u",
        "ensemble_w",
    ),
}


def _regression_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(30, 3))
    return X, np.sin(X[:, :1]) + 0.1 * rng.normal(size=(30, 1))


def _untrained_deep_gp() -> dict:
    X, Y = _regression_data()
    out = {}
    for name in BUILT_IN["deep_gp"]:
        assert name in DEEP_GP_FAMILIES
        for depth in (1, 3):
            m = dg.build_deep_gp(X, Y, depth=depth, posterior=name, num_inducing=7, seed=3)
            out[f"dgp/{name}/{depth}"] = float(m.elbo((X, Y), 3, seed=5).numpy())
            mean = m.predict_y(X[:4], num_samples=3, seed=2)[0].numpy()
            out[f"dgp/{name}/{depth}/pred"] = [float(v) for v in np.ravel(mean)]
    return out


def _untrained_latent() -> dict:
    X, Y = _regression_data()
    out = {}
    for name in BUILT_IN["latent"]:
        m = dg.build_deep_gp(X, Y, depth=2, posterior=name, num_inducing=7, seed=3, latent_dim=1)
        out[f"latent/{name}"] = float(m.elbo((X, Y), 3, seed=5, importance_samples=2).numpy())
    return out


def _untrained_bnn() -> dict:
    X, Y = _regression_data()
    out = {}
    for name in BUILT_IN["bnn"]:
        assert name in BNN_FAMILIES
        for prior in ("standard", "neal", "scale"):
            m = dg.build_bnn(
                X, Y, hidden=(4, 4), posterior=name, prior=prior, num_inducing=6, seed=3
            )
            out[f"bnn/{name}/{prior}"] = float(m.elbo((X, Y), 3, seed=5).numpy())
    return out


def _untrained_conv() -> dict:
    out = {}
    images = np.random.default_rng(1).normal(size=(12, 8, 8, 1))
    labels = np.random.default_rng(2).integers(0, 3, (12, 1)).astype(float)
    for name in BUILT_IN["conv"]:
        assert name in CONV_BNN_FAMILIES
        m = dg.build_conv_bnn(
            images,
            labels,
            architecture="resnet",
            channels=4,
            posterior=name,
            num_inducing=5,
            seed=1,
        )
        out[f"conv/{name}"] = float(m.elbo((images, labels), 2, seed=5).numpy())
    return out


#: The untrained values by model kind, in the record's order.
UNTRAINED = {
    "deep_gp": _untrained_deep_gp,
    "latent": _untrained_latent,
    "bnn": _untrained_bnn,
    "conv": _untrained_conv,
}


def untrained_values(groups: tuple = tuple(UNTRAINED)) -> dict:
    """The untrained values of the model kinds in ``groups`` (keys of ``UNTRAINED``)."""
    unknown = sorted(set(groups) - set(UNTRAINED))
    if unknown:
        raise ValueError(f"groups: {unknown} are not among {tuple(UNTRAINED)}")
    out = {}
    for name, values in UNTRAINED.items():
        if name in groups:
            out.update(values())
    return out


def trained_values() -> dict:
    X, Y = _regression_data()
    out = {}
    for name in BUILT_IN["deep_gp"]:
        m = dg.build_deep_gp(X, Y, depth=2, posterior=name, num_inducing=7, seed=3)
        dg.fit(m, (X, Y), steps=6, batch_size=10, seed=4, progress=False)
        if name in ("sghmc", "bsgp"):
            dg.collect_samples(m, (X, Y), num_samples=3, thin=2, seed=1)
        out[f"trained/{name}"] = float(m.elbo((X, Y), 3, seed=5).numpy())
        lpd = m.predict_log_density((X[:3], Y[:3]), num_samples=3, seed=2).numpy()
        out[f"trained/{name}/lpd"] = [float(v) for v in lpd]
    for name in ("mean_field", "global"):
        m = dg.build_deep_gp(X, Y, depth=2, posterior=name, num_inducing=7, seed=3, latent_dim=1)
        dg.fit(m, (X, Y), steps=4, batch_size=10, seed=4, progress=False, importance_samples=2)
        out[f"trained/latent/{name}"] = float(
            m.elbo((X, Y), 3, seed=5, importance_samples=2).numpy()
        )
    return out


def mismatches(recorded: dict, current: dict, rtol: float = 1e-10) -> list:
    """``(key, recorded, current)`` for every recorded value the current code does not reproduce
    to ``rtol`` (relative to ``max(1, |recorded|)``)."""
    bad = []
    for key, value in current.items():
        want = recorded[key]
        a, b = np.atleast_1d(want), np.atleast_1d(value)
        if a.shape != b.shape or np.any(np.abs(a - b) > rtol * np.maximum(1.0, np.abs(a))):
            bad.append((key, want, value))
    return bad


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/family_reference.py --write")
    REFERENCE.parent.mkdir(exist_ok=True)
    REFERENCE.write_text(json.dumps({**untrained_values(), **trained_values()}, indent=1) + "\n")
    print(f"wrote {REFERENCE}")
