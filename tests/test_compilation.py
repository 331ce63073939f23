"""fit(jit_compile="auto"): XLA exactly for the (family, device kind) pairs measured faster."""

import numpy as np
import pytest
import tensorflow as tf

import deepgp_gi as dg
from deepgp_gi.training import compilation
from deepgp_gi.training.compilation import XLA_FASTER, device_kind, resolve_jit_compile


def data(n=10, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 2)), rng.normal(size=(n, 1))


def test_device_kind_follows_the_visible_devices():
    assert device_kind() == ("GPU" if tf.config.list_logical_devices("GPU") else "CPU")


def test_auto_is_xla_exactly_for_the_measured_pairs(monkeypatch):
    X, Y = data()
    gp = dg.build_deep_gp(
        X, Y, depth=2, posterior="mean_field", num_inducing=3, inner_width=2, seed=0
    )
    bnn = dg.build_bnn(X, Y, hidden=(4,), posterior="factorised", seed=0)
    for kind in ("CPU", "GPU"):
        monkeypatch.setattr(compilation, "device_kind", lambda kind=kind: kind)
        for model in (gp, bnn):
            expected = (type(model.posterior).__name__, kind) in XLA_FASTER
            assert resolve_jit_compile("auto", model) is expected
            assert resolve_jit_compile("auto", model, natgrad=True) is False
            assert (
                resolve_jit_compile("auto", model, strategy=tf.distribute.get_strategy()) is False
            )
            assert (
                resolve_jit_compile(True, model) is True
                and resolve_jit_compile(False, model) is False
            )
    monkeypatch.setattr(compilation, "device_kind", lambda: "CPU")
    assert resolve_jit_compile("auto", gp) is False  # no deep-GP family is faster with XLA on a CPU
    monkeypatch.setattr(
        compilation, "XLA_FASTER", frozenset({("FactorisedWeightPosterior", "CPU")})
    )
    assert resolve_jit_compile("auto", bnn) is True and resolve_jit_compile("auto", gp) is False
    assert resolve_jit_compile("auto", bnn, natgrad=True) is False


def test_fit_runs_the_resolved_mode(monkeypatch):
    """fit's default is "auto", and the step it builds is compiled as resolve_jit_compile says."""
    from deepgp_gi.training import loop, step

    X, Y = data()
    modes = []
    original = step.TrainStep.__init__

    def record(self, *args, **kwargs):
        modes.append(kwargs["jit_compile"])
        original(self, *args, **kwargs)

    monkeypatch.setattr(step.TrainStep, "__init__", record)
    monkeypatch.setattr(loop, "resolve_jit_compile", lambda jit, model, **kw: jit == "auto")
    model = dg.build_bnn(X, Y, hidden=(4,), posterior="factorised", seed=0)
    dg.fit(model, (X, Y), steps=1, seed=0, progress=False)
    dg.fit(model, (X, Y), steps=1, seed=0, progress=False, jit_compile=False)
    assert modes == [True, False]


@pytest.mark.parametrize("bad", ["yes", "AUTO", None, 1])
def test_other_values_are_refused(bad):
    X, Y = data()
    model = dg.build_bnn(X, Y, hidden=(4,), posterior="factorised", seed=0)
    with pytest.raises(TypeError, match="jit_compile must be True, False or 'auto'"):
        resolve_jit_compile(bad, model)
