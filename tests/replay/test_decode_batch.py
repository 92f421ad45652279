"""The decode batch (`DecodeSet`: decoding requests as offsets from one counter) against the engine's own
request-by-request steps, which it replaced on the common path: the same batches, hits, preemptions and reports."""

from __future__ import annotations

import pytest
from _support.replay_engine import drive

from tuner.deployment import parse_deployment
from tuner.perf import RooflineModel
from tuner.replay import ArrivalProcess, Engine, ReplayPlan, SchedulerLimits, Sessions, replay
from tuner.replay import _replay as replay_module
from tuner.replay._gaps import token_gap_percentiles
from tuner.replay._requests import EngineRequest, RequestSpec
from tuner.workload import Workload

BS = 16


class _OneByOne(Engine):
    """Every step and stretch request by request (`_step_each`, `_stretch_each`): the reference."""

    def _step_batched(self) -> list[EngineRequest] | None:
        return None

    def _stretch(self, k: int) -> list[EngineRequest]:
        self._write_back()
        done = self._stretch_each(k)
        self._regroup()
        return done


class _UnitStep:
    accepted = 1.0

    def step_ms(self, *_: float) -> float:
        return 1.0


def _specs() -> list[tuple[RequestSpec, int]]:
    """Shared and repeated prompts whose answers are cached units too (so decodes publish while the pool evicts)."""
    out = []
    for n, (shared, own, max_tokens, arrive) in enumerate([(3, 21, 40, 0), (3, 5, 30, 1), (2, 40, 50, 2),
                                                           (3, 33, 25, 6), (2, 7, 60, 9), (0, 70, 35, 12),
                                                           (3, 21, 40, 40), (0, 90, 30, 41)]):
        prompt = shared * BS + own
        key = ("shared", shared) if n != 6 else ("req", 0)
        own_key = ("req", n if n != 6 else 0)
        units = tuple(((key, b) if b < shared else (own_key, b), 1) for b in range((prompt + max_tokens) // BS))
        out.append((RequestSpec(prompt_tokens=prompt, output_tokens=max_tokens, units=units), arrive))
    return out


def _steps(engine_type: type[Engine], num_blocks: int, threshold: int) -> tuple[list, list, object]:
    limits = SchedulerLimits(max_num_seqs=4, max_num_batched_tokens=64, long_prefill_token_threshold=threshold,
                             block_size=BS, num_blocks=num_blocks)
    engine = engine_type("rank 0", _UnitStep(), limits)  # type: ignore[arg-type]
    engine.log = []
    requests = drive(engine, _specs())
    return engine.log, [(r.hit_tokens, r.preemptions, r.first_token_ms, r.finish_ms) for r in requests], \
        token_gap_percentiles([engine.gaps])


@pytest.mark.parametrize(("num_blocks", "threshold"), [(200, 0), (15, 0), (11, 24), (20, 8), (10, 16)])
def test_the_batch_steps_as_request_by_request(num_blocks: int, threshold: int) -> None:
    batched = _steps(Engine, num_blocks, threshold)
    reference = _steps(_OneByOne, num_blocks, threshold)
    assert batched == reference
    if num_blocks < 100:
        assert any(preempted for _, preempted, _, _ in batched[1])  # the pool runs out: preemption is exercised
        assert batched[2].mean > 1.0  # a gap of more than a step: a recomputed request's, taken one by one


def test_replays_report_the_same_as_request_by_request(small_kv: RooflineModel, chunked_mix: Workload,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A small KV cache (preemption), sessions (decodes cache their answers), PD and a chunked mix."""
    small, mix = small_kv, chunked_mix
    plans = [ReplayPlan(deployment=parse_deployment("TP8"), workload=mix, arrival=ArrivalProcess("poisson", rate_rps=4),
                        sessions=Sessions(turns=3, think_ms=300), num_requests=150),
             ReplayPlan(deployment=parse_deployment("1P:TP4,1D:TP8"), workload=mix,
                        arrival=ArrivalProcess("poisson", rate_rps=3), num_requests=150)]
    batched = [replay(small, plan).as_json() for plan in plans]
    monkeypatch.setattr(replay_module, "Engine", _OneByOne)
    reference = [replay(small, plan).as_json() for plan in plans]
    assert batched == reference
    assert batched[0]["preemptions"] > 0
