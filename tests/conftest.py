import importlib.util
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow
import numpy as np
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# Long tests of files this suite does not otherwise edit, marked ``slow`` here so that ``make test``
# leaves them to ``make test-all``: {file name: test function names}.
SLOW_TESTS = {
    # each check runs tests/distributed_check.py in a fresh process (2 logical CPU replicas)
    "test_distributed.py": ("test_mirrored_strategy_equals_one_device",),
}


def pytest_configure(config):
    """Under ``pytest -n W`` (``make test``), give each worker's TensorFlow its share of the cores
    (``cpu_count // W`` threads, at least one) instead of a pool as wide as the machine: W workers
    each running a pool of every core oversubscribe it, and the suite's small ops then wait on one
    another. Runs before any test makes a tensor; an explicit ``TF_NUM_*_THREADS`` wins, and the
    variables reach the suite's subprocesses too."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if workers < 2:
        return
    import tensorflow as tf

    share = str(max(1, (os.cpu_count() or 1) // workers))
    intra = int(os.environ.setdefault("TF_NUM_INTRAOP_THREADS", share))
    inter = int(os.environ.setdefault("TF_NUM_INTEROP_THREADS", share))
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark the tests of ``SLOW_TESTS`` ``slow`` before ``-m`` selects (tryfirst: this runs before
    pytest's own deselection by marker)."""
    for item in items:
        names = SLOW_TESTS.get(os.path.basename(str(item.fspath)), ())
        if getattr(item, "originalname", item.name) in names:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def load_script():
    """``load_script("tools/fetch_mnist.py")``: a script of the repository imported as a module, by
    path (the tool scripts are not part of the installed package; the benchmarks are the package
    ``benchmarks``, imported as such)."""

    def load(relative_path: str):
        name = os.path.splitext(relative_path.replace("/", "_"))[0]
        spec = importlib.util.spec_from_file_location(name, os.path.join(REPO_ROOT, relative_path))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load


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
