# Two commands do everything on a fresh machine (each creates the virtualenv when missing):
#   make demo   the main job: a study on the built-in simulator (SQLite storage, a local Ray)
#   make test   ruff + the whole test suite (CI runs exactly this through .ci/run)
# `make test PYTEST_ARGS=--skip-slow` skips the real-process tests (real vLLM on CPU, multi-node Ray).
# `make test` runs pytest twice: the tests not marked slow on TEST_WORKERS processes (pytest-xdist), then the slow
# ones (and the few marked serial) alone, one at a time; PYTEST_ARGS goes to both, and it fails if either part fails.

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

# Two parts (docs/README.md#the-test-suite): the non-slow tests on TEST_WORKERS pytest-xdist workers (--dist worksteal:
# each worker starts with one contiguous half of the tests, so a module's fixtures are mostly built once, and takes
# tests from the other's queue when its own runs out), then the slow real-process tests and the `serial` ones (Ray
# heads that must start within Ray's fixed 30 s) in one process, alone on the machine. The second part runs after any
# outcome of the first but an interrupted or unusable run (exit 2-4); a part that selects nothing (exit 5: PYTEST_ARGS
# naming only non-slow tests, say) is not a failure unless both select nothing.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/ruff check .
	@case "$(PYTEST_ARGS)" in *--skip-slow*) ;; *) $(MAKE) --no-print-directory cpu-vllm prometheus ;; esac
	@export TOPOTUNE_ENVS_DIR=$(CPU_ENVS); \
	echo "== make test, part 1 of 2: not slow (nor serial), on $(TEST_WORKERS) workers"; \
	$(BIN)/pytest -m "not slow and not serial" -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS); one=$$?; \
	case $$one in 0|1|5) ;; *) echo "== make test: part 1 ended with exit $$one; part 2 not run"; exit $$one ;; esac; \
	echo "== make test, part 2 of 2: slow and serial, one at a time"; \
	$(BIN)/pytest -m "slow or serial" $(PYTEST_ARGS); two=$$?; \
	echo "== make test: part 1 exit $$one, part 2 exit $$two (0 passed, 1 failed, 5 none selected)"; \
	case $$one$$two in 55) exit 5 ;; *[!05]*) [ $$one = 1 ] && exit 1; exit $$two ;; esac

bench: $(STAMP)
	@for b in benchmarks/*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
