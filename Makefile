# deepgp_gi: `make demo` runs the main job, `make test` runs the test suite.
# Both create .venv (Python 3.11) if it is missing and install the package into it.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
export TF_USE_LEGACY_KERAS := 1
# No TF_CPP_MIN_LOG_LEVEL here: deepgp-gi quiets TensorFlow's C++ logs itself (level 3 unless the
# environment sets one; 2 would still let `E0000 ... cuInit` through without a GPU), and the test
# suite, benchmarks and notebook runner each default to 2.

.PHONY: demo test test-slow test-gpu bench notebooks install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/deepgp-gi demo

test: install
	$(BIN)/python -m pytest -q

test-slow: install
	$(BIN)/python -m pytest -q -m slow

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

clean:
	rm -rf $(VENV) build *.egg-info
