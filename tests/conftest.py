import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def rng():
    return np.random.default_rng(20261122)


@pytest.fixture(autouse=True)
def _float64():
    """Every test starts in GPflow's float64 default with the default jitter, and with
    TensorFlow's global generator seeded so that unseeded draws are reproducible too."""
    import tensorflow as tf

    tf.random.set_seed(1234)
    with gpflow.config.as_context(gpflow.config.Config(float=np.float64, jitter=1e-6)):
        yield
