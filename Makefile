# deepgp_gi: `make demo` runs the main job, `make test` the fast test suite, `make test-all` every test
# but the GPU ones, `make docs` the documentation site (docs/_build/html).
# Both create .venv (Python 3.11) if it is missing and install the package into it.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
export TF_USE_LEGACY_KERAS := 1
# No TF_CPP_MIN_LOG_LEVEL here: deepgp-gi quiets TensorFlow's C++ logs itself (level 3 unless the
# environment sets one; 2 would still let `E0000 ... cuInit` through without a GPU), and the test
# suite, benchmarks and notebook runner each default to 2.

.PHONY: demo test test-all test-slow test-gpu bench notebooks docs lint install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/deepgp-gi demo

# The fast suite (setup.cfg's addopts: `-m "not slow and not gpu"`): a few minutes on 2 CPU cores.
# It runs in TEST_WORKERS processes (pytest-xdist; `make test TEST_WORKERS=0` runs it in one).
TEST_WORKERS ?= 2
test: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

# The rest after `make test`: the `slow` tests (training runs, long oracles, XLA-vs-plain checks of
# every family, notebook execution, tf.distribute subprocesses, benchmark scripts end to end).
# `make test` + `make test-all` run every test but the GPU ones; `.ci/run` runs both.
# Also in TEST_WORKERS processes: the slow tests are independent of one another.
test-all: install
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "slow and not gpu"

# The old name of test-all.
test-slow: test-all

# The GPU tests (ELBO on the GPU against the CPU, short fits on the GPU); skipped without a GPU.
test-gpu: install
	$(BIN)/python -m pytest -q -m gpu

bench: install
	$(BIN)/python -m pip install -e ".[dev,bench]"
	$(BIN)/python benchmarks/speed.py

# Execute every notebooks/NN_*.py in its full setting (minutes each on a CPU) and write the
# paired .ipynb with outputs; `DEEPGP_GI_QUICK=1 make notebooks` for the quick setting.
notebooks: install
	$(BIN)/python -m pip install -e ".[notebooks]"
	$(BIN)/python notebooks/run_notebooks.py

# The documentation site, docs/_build/html: the pages of docs/, the executed notebooks as they are
# committed (not run again) and one API page per module from the docstrings. Strict (-W -n): a
# broken link or reference, or a docstring that is not valid reStructuredText, fails it. The API
# pages are generated afresh each time (docs/api/, git-ignored); about two minutes on 2 CPU cores.
$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(BIN)/python -m pip install -e ".[docs]"
	touch $@

# The linter: ruff (pyproject.toml's [tool.ruff]: pycodestyle with the 100-column limit, pyflakes,
# import order) over the package, the tests, the benchmarks and the notebooks' sources.
lint: install
	$(BIN)/ruff check deepgp_gi tests benchmarks notebooks

docs: $(VENV)/.docs-installed
	rm -rf docs/api
	$(BIN)/python -m sphinx -b html -E -W --keep-going -n -q docs docs/_build/html

clean:
	rm -rf $(VENV) build *.egg-info docs/_build docs/api docs/notebooks
