# Two commands do everything on a fresh machine (each creates the virtualenv when missing):
#   make demo   the main job: a study on the built-in simulator (SQLite storage, a local Ray)
#   make test   ruff + the whole test suite (CI runs exactly this through .ci/run)
# `make test PYTEST_ARGS=--skip-slow` skips the real-process tests (real vLLM on CPU, multi-node Ray).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.topotune-installed
PYTEST_ARGS ?=
MODEL ?= examples/models/qwen3.8-2.4t-a95b-nvfp4

.PHONY: demo test lint bench venv clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/topotune memory $(MODEL) --hardware gb300 --topology TP4DP4+EP --mtp 3
	$(BIN)/topotune memory $(MODEL) --hardware gb300 --sweep --gpus 16

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/pytest $(PYTEST_ARGS)

bench: $(STAMP)
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
