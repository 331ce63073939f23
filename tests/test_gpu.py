"""On a GPU: every deep-GP family's and the BNN families' ELBO computed on ``/GPU:0`` equals the
CPU's (same model, same data, same seeded noise; float64), and a short ``fit`` on the GPU raises
the ELBO. Marked ``gpu`` (deselected by default: ``make test-gpu`` or ``pytest -m gpu``) and
skipped when no GPU is visible."""

import numpy as np
import pytest
import tensorflow as tf

import deepgp_gi as dg
from deepgp_gi.families import DEEP_GP_FAMILIES

pytestmark = pytest.mark.gpu

if not tf.config.list_physical_devices("GPU"):
    pytest.skip("no GPU visible", allow_module_level=True)

GPU, CPU = "/GPU:0", "/CPU:0"
BNN_POSTERIORS = ("factorised", "global", "factorised_global")
MODELS = [("deep GP", name) for name in DEEP_GP_FAMILIES] + [
    ("BNN", name) for name in BNN_POSTERIORS
]
NOISE_SEED = [3, 7]


def _data(n: int = 64):
    """``X [n, 3]``, ``Y [n, 1]``: a smooth function of the inputs plus noise, float64."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, 3))
    Y = np.sin(2.0 * X[:, :1]) + 0.5 * X[:, 1:2] + 0.1 * rng.normal(size=(n, 1))
    return X, Y


def _build(kind: str, posterior: str, X, Y):
    if kind == "deep GP":
        return dg.build_deep_gp(X, Y, depth=2, posterior=posterior, num_inducing=10, seed=0)
    return dg.build_bnn(X, Y, hidden=(20, 20), posterior=posterior, num_inducing=10, seed=0)


def _elbo_on(device: str, model, X, Y, num_samples: int = 2) -> tf.Tensor:
    """The ELBO with ``num_samples`` draws of ``SeededNoise(NOISE_SEED)``, every op on
    ``device``."""
    with tf.device(device):
        data = (tf.constant(X), tf.constant(Y))
        return model.elbo(data, num_samples, seed=dg.noise.SeededNoise(NOISE_SEED))


@pytest.mark.parametrize("kind, posterior", MODELS)
def test_elbo_on_the_gpu_equals_the_cpu(kind, posterior):
    X, Y = _data()
    model = _build(kind, posterior, X, Y)
    on_gpu = _elbo_on(GPU, model, X, Y)
    on_cpu = _elbo_on(CPU, model, X, Y)
    assert on_gpu.dtype == tf.float64
    assert "GPU" in on_gpu.device and "CPU" in on_cpu.device
    assert np.isfinite(on_cpu.numpy())
    np.testing.assert_allclose(on_gpu.numpy(), on_cpu.numpy(), rtol=1e-10)


def _assert_a_short_fit_on_the_gpu_raises_the_elbo(kind, posterior, **fit_options):
    X, Y = _data()
    with tf.device(GPU):
        model = _build(kind, posterior, X, Y)
        before = float(_elbo_on(GPU, model, X, Y, num_samples=16))
        history = dg.fit(model, (X, Y), steps=20, progress=False, seed=0, **fit_options)
        after = float(_elbo_on(GPU, model, X, Y, num_samples=16))
    assert history.step[-1] == 20 and np.all(np.isfinite(history.elbo))
    assert np.isfinite(after) and after > before, (before, after)


@pytest.mark.parametrize("kind, posterior", MODELS)
def test_short_fit_on_the_gpu_raises_the_elbo(kind, posterior):
    _assert_a_short_fit_on_the_gpu_raises_the_elbo(kind, posterior)


@pytest.mark.parametrize("posterior", list(DEEP_GP_FAMILIES))
def test_an_xla_fit_on_the_gpu_runs_and_raises_the_elbo(posterior):
    """``fit(jit_compile=True)`` on the GPU: the compiled step reads every variable of the step
    on the device (an int32 status variable, kept in host memory, once made it fail there)."""
    _assert_a_short_fit_on_the_gpu_raises_the_elbo("deep GP", posterior, jit_compile=True)
