"""llm-d's rows replayed as inference-perf ran them (benchmarks/workload_fidelity.py `stage_trace`): the source's
warm-up stage, idle until it drains, then the one stage the row reports, its requests alone; every stage sends the
shuffled prompts from the first. What could break: the stage's length, its rate, the prompts' order, the drain, and
which requests the replay measures."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from _support.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def wf():
    return load_benchmark("workload_fidelity")


@pytest.fixture(scope="module")
def rows(wf) -> dict[str, dict]:
    return {r["id"]: r for r in yaml.safe_load(wf.TABLE.read_text())["rows"]}


def _sends(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_constant_stage_after_the_sources_warm_up(wf, rows, tmp_path) -> None:
    row = rows["llmd37-precise-qps3"]  # constant 3 req/s for 210 s, after "warm-up 9 rps x 30 s"
    stage = wf.stage_trace(row, tmp_path / "trace.jsonl")
    sends = _sends(stage.path)
    assert (stage.warmup_requests, stage.stage_requests) == (270, 630)  # int(rate x duration), as load_generator.py
    assert len(sends) == 900
    warm, main = sends[:270], sends[270:]
    assert warm[1]["timestamp"] - warm[0]["timestamp"] == pytest.approx(1000 / 9, abs=1e-3)
    assert main[1]["timestamp"] - main[0]["timestamp"] == pytest.approx(1000 / 3, abs=1e-3)
    assert main[0]["timestamp"] - warm[-1]["timestamp"] == pytest.approx(wf.STAGE_IDLE_S * 1e3, abs=1e-3)
    assert main[0]["timestamp"] == pytest.approx(stage.stage_start_ms)
    # every stage sends the prompts from the first: the stage's first 270 prompts are the warm-up's, in order
    assert [s["hash_ids"] for s in main[:270]] == [s["hash_ids"] for s in warm]
    prompts = {tuple(s["hash_ids"]) for s in sends}
    assert len(prompts) == 83 * 3  # 83 groups x 3 prompts, cycled
    assert len({p[:8000 // wf.HASH_BLOCK_TOKENS] for p in prompts}) == 83  # one shared prefix per group


def test_poisson_stage_and_its_warm_up_share(wf, rows, tmp_path) -> None:
    row = rows["llmd73-precise-qps30"]  # Poisson 30 req/s for 25 s, after "warm-up 15 rps x 50 s"
    stage = wf.stage_trace(row, tmp_path / "trace.jsonl")
    assert (stage.warmup_requests, stage.stage_requests) == (750, 750)
    main = _sends(stage.path)[750:]
    span_s = (main[-1]["timestamp"] - main[0]["timestamp"]) / 1e3
    assert 25 * 0.85 < span_s < 25 * 1.15  # 749 exponential gaps at 30 req/s (sd ~3.7%)
    # ReplayPlan's warm-up is ceil(share x requests): exactly the warm-up's requests go unmeasured
    total = stage.warmup_requests + stage.stage_requests
    assert math.ceil(stage.warmup_share * total) == stage.warmup_requests


class _Prior:
    """Hopper's physics prior for every row (benchmarks/fidelity.py PRIORS), where replay_row takes the held-out
    fits: what is tested is which requests the replay measures, not the calibration."""

    def __init__(self, wf) -> None:
        self.cal = wf.fidelity.PRIORS["hopper"]

    def held_out(self, gpu: str, source: str):
        return self.cal, "hopper"


def test_the_replay_measures_the_drained_stage_alone(wf, rows) -> None:
    row = rows["llmd73-random-qps3"]  # 60 requests after 750 of warm-up at 15 req/s, random routing
    scored = wf.replay_row(row, _Prior(wf))
    assert "one stage of 60 requests after 750 of warm-up" in scored.note
    assert "NOT drained" not in scored.note, scored.note
    assert {"ttft_mean", "ttft_p90", "itl_mean"} <= set(scored.errors)
    assert scored.saturated is not None
