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

CPU_ENVS ?= $(HOME)/.cache/topotune/envs

.PHONY: demo test lint bench venv clean cpu-vllm aiconfigurator aisimulate prometheus

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

# The main job: the reference campaign on the simulator, through a local Ray, stored in SQLite
# (re-running it resumes the same study). DEMO_ARGS adds options, e.g. DEMO_ARGS="--trials 80".
DEMO_ARGS ?=
demo: $(STAMP)
	$(BIN)/topotune tune $(MODEL) --space search_spaces/gb300-nvl72-8k1k.yaml --backend simulated \
		--trials 40 --parallel 4 --storage sqlite:///$(CURDIR)/.topotune/demo.db $(DEMO_ARGS)

# The real vLLM CPU build, AIPerf and vllm-router in their own pinned venvs (reused when present; ~3 min fresh).
# `make test` needs them for the slow real-process tests; with --skip-slow they are not installed.
cpu-vllm:
	TOPOTUNE_ENVS_DIR=$(CPU_ENVS) bash scripts/setup-cpu-vllm.sh

# Prometheus from Debian (8 s here) for the slow live-traffic test's --from-prometheus check; skipped (the test says
# so) where it is absent and apt-get cannot install it (no root, not Debian).
prometheus:
	@command -v prometheus >/dev/null || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus >/dev/null; } || \
		echo "prometheus not installed: tests/backends/test_live_traffic_cpu.py skips its Prometheus check"

# NVIDIA aiconfigurator 0.12 in a venv of its own (it pins its own dependencies; topotune never imports it), then its
# estimates of every public measurement it can represent, stored with their commands in
# benchmarks/data/aiconfigurator.yaml (benchmarks/fidelity.py prints them beside topotune's; ~10-30 min on 2 cores).
AIC_VENV ?= $(HOME)/.cache/topotune/aic-venv
aiconfigurator: $(STAMP)
	@test -x $(AIC_VENV)/bin/aiconfigurator || { $(PYTHON) -m venv $(AIC_VENV) && \
		$(AIC_VENV)/bin/pip install --quiet aiconfigurator==0.12.0; }
	$(BIN)/python benchmarks/aiconfigurator_runs.py --run --aic $(AIC_VENV)/bin/aiconfigurator

# NVIDIA aisimulate (aiconfigurator's successor) in a venv of its own (it pins jax and its own dependencies; topotune
# never imports it): the stable 0.13.0 on PyPI is a stub that downloads from NVIDIA's own index, so the newest
# pre-release, whose wheel PyPI ships. Then its predictions of every vLLM workload row on the replay's own request
# stream, stored with their commands in benchmarks/data/aisimulate.yaml (benchmarks/workload_fidelity.py --replay
# prints them beside the replay's; ~1 min to install, ~4 min to run on 2 cores).
AISIM_VENV ?= $(HOME)/.cache/topotune/aisim-venv
AISIM_VERSION ?= 0.13.0.dev202610270000000085
aisimulate: $(STAMP)
	@test -x $(AISIM_VENV)/bin/aisimulate || { $(PYTHON) -m venv $(AISIM_VENV) && \
		$(AISIM_VENV)/bin/pip install --quiet --pre aisimulate==$(AISIM_VERSION); }
	$(BIN)/python benchmarks/aisimulate_runs.py --run --aisim $(AISIM_VENV)/bin/aisimulate

lint: $(STAMP)
	$(BIN)/ruff check .

test: $(STAMP)
	$(BIN)/ruff check .
	@case "$(PYTEST_ARGS)" in *--skip-slow*) ;; *) $(MAKE) --no-print-directory cpu-vllm prometheus ;; esac
	TOPOTUNE_ENVS_DIR=$(CPU_ENVS) $(BIN)/pytest $(PYTEST_ARGS)

bench: $(STAMP)
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
