"""Families defined outside the package: ``dg.posteriors.register`` makes the builders build and
``fit`` train them; the ELBO of a registered subclass equals its parent's under the same noise,
and the "Adding a family" page's example runs."""

import numpy as np
import pytest

import deepgp_gi as dg
from deepgp_gi.posteriors import registry
from doc_examples import run_page


class ScaledKLMeanField(dg.posteriors.MeanFieldPosterior):
    """Mean-field with the regulariser times ``kl_scale``: ELBO = ell - kl_scale * KL."""

    options = dg.posteriors.MeanFieldPosterior.options + ("kl_scale",)

    def __init__(self, layers, kl_scale=1.0, **options):
        super().__init__(layers, **options)
        self.kl_scale = float(kl_scale)

    def propagate(self, X, num_samples=1, seed=None):
        prop = super().propagate(X, num_samples, seed)
        return prop._replace(kl=self.kl_scale * prop.kl)


class RenamedFactorised(dg.posteriors.FactorisedWeightPosterior):
    """The factorised BNN family under another name."""


class RenamedGlobalConv(dg.posteriors.GlobalConvPosterior):
    """The convolutional global-inducing family under another name."""


@pytest.fixture
def tables():
    """Restore the tables after a test that registers."""
    saved = {kind: dict(table) for kind, table in registry.MODEL_KINDS.items()}
    yield registry.MODEL_KINDS
    for kind, table in registry.MODEL_KINDS.items():
        table.clear()
        table.update(saved[kind])


def _data(N=40, D=2, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, D))
    return X, np.sin(X[:, :1]) + 0.1 * rng.normal(size=(N, 1))


@pytest.mark.slow  # builds three models and trains one: `make test-all`
def test_a_registered_subclass_builds_trains_and_has_its_own_elbo(tables):
    X, Y = _data()
    dg.posteriors.register("scaled_kl_mean_field", ScaledKLMeanField)
    assert dg.families.DEEP_GP_FAMILIES["scaled_kl_mean_field"] is ScaledKLMeanField
    assert "scaled_kl_mean_field" not in dg.families.BNN_FAMILIES  # a deep-GP family's subclass
    ours = dg.build_deep_gp(
        X, Y, depth=2, posterior="scaled_kl_mean_field", num_inducing=6, seed=2, kl_scale=0.25
    )
    parent = dg.build_deep_gp(X, Y, depth=2, posterior="mean_field", num_inducing=6, seed=2)
    assert type(ours.posterior) is ScaledKLMeanField
    # the same initial values (the parent's from_data), so the same noise gives the same ell and KL
    ell, kl = parent.elbo_terms((X, Y), 3, seed=7)
    np.testing.assert_allclose(
        ours.elbo((X, Y), 3, seed=7).numpy(), np.mean(ell - 0.25 * kl), rtol=1e-12
    )
    unscaled = dg.build_deep_gp(
        X, Y, depth=2, posterior="scaled_kl_mean_field", num_inducing=6, seed=2
    )
    np.testing.assert_allclose(
        unscaled.elbo((X, Y), 3, seed=7).numpy(), parent.elbo((X, Y), 3, seed=7).numpy(), rtol=1e-12
    )
    before = ours.elbo((X, Y), 8, seed=1).numpy()
    dg.fit(ours, (X, Y), steps=30, seed=0, progress=False)
    assert ours.elbo((X, Y), 8, seed=1).numpy() > before
    with pytest.raises(ValueError, match="accepted options: whiten, q_sqrt_scales, kl_scale"):
        dg.build_deep_gp(X, Y, depth=2, posterior="scaled_kl_mean_field", num_inducing=6, bogus=1)


def test_weight_families_register_for_their_model_kinds(tables):
    X, Y = _data()
    dg.posteriors.register("renamed_factorised", RenamedFactorised)
    assert "renamed_factorised" in dg.families.BNN_FAMILIES
    ours = dg.build_bnn(X, Y, hidden=(4,), posterior="renamed_factorised", seed=3)
    theirs = dg.build_bnn(X, Y, hidden=(4,), posterior="factorised", seed=3)
    np.testing.assert_allclose(
        ours.elbo((X, Y), 3, seed=5).numpy(), theirs.elbo((X, Y), 3, seed=5).numpy(), rtol=1e-12
    )
    dg.posteriors.register("renamed_global_conv", RenamedGlobalConv)
    rng = np.random.default_rng(0)
    images, labels = rng.normal(size=(10, 8, 8, 1)), rng.integers(0, 3, (10, 1)).astype(float)
    kwargs = dict(architecture="resnet", channels=2, num_inducing=4, seed=1)
    ours = dg.build_conv_bnn(images, labels, posterior="renamed_global_conv", **kwargs)
    theirs = dg.build_conv_bnn(images, labels, posterior="global", **kwargs)
    np.testing.assert_allclose(
        ours.elbo((images, labels), 2, seed=5).numpy(),
        theirs.elbo((images, labels), 2, seed=5).numpy(),
        rtol=1e-12,
    )


def test_register_refuses_bad_calls(tables):
    with pytest.raises(ValueError, match="already MeanFieldPosterior; pass replace=True"):
        dg.posteriors.register("mean_field", ScaledKLMeanField)
    with pytest.raises(TypeError, match="subclass of deepgp_gi.posteriors.DeepPosterior"):
        dg.posteriors.register("not_a_family", object)
    with pytest.raises(ValueError, match="non-empty string"):
        dg.posteriors.register("", ScaledKLMeanField)
    with pytest.raises(ValueError, match="unknown model kind 'gp'"):
        dg.posteriors.register("x", ScaledKLMeanField, kinds="gp")

    class Bare(dg.posteriors.DeepPosterior):
        def propagate(self, X, num_samples=1, seed=None):  # pragma: no cover - never built here
            raise NotImplementedError

    with pytest.raises(ValueError, match="derives from no registered family; give kinds="):
        dg.posteriors.register("bare", Bare)
    dg.posteriors.register("bare", Bare, kinds="deep_gp")
    assert dg.families.DEEP_GP_FAMILIES["bare"] is Bare
    dg.posteriors.register("mean_field", ScaledKLMeanField, replace=True)
    assert dg.families.DEEP_GP_FAMILIES["mean_field"] is ScaledKLMeanField


def test_the_adding_a_family_page_runs(tables, capsys):
    namespace = run_page("adding_a_family.md")
    assert np.isfinite(float(capsys.readouterr().out.split()[-1]))
    model = namespace["model"]
    assert (
        type(model.posterior).__name__ == "WeightedKLMeanField" and model.posterior.kl_weight == 0.5
    )
