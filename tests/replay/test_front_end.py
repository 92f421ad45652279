"""The front end's cost per request output (`front_end_output_us`): one FIFO server behind each engine's steps,
in closed form over a stretch of decode steps exactly as step by step."""

from __future__ import annotations

import pytest
from _support.replay_engine import LinearStep, StepByStep, drive

from tuner.deployment import parse_deployment
from tuner.hardware import GpuSpec
from tuner.models import ModelSpec
from tuner.perf import RooflineModel
from tuner.replay import ArrivalProcess, Engine, ReplayPlan, SchedulerLimits, replay
from tuner.replay._requests import RequestSpec
from tuner.workload import Workload


def _seen(engine_type: type[Engine], cost_ms: float, slope: float = 0.0) -> list[tuple]:
    """Six requests on a linear-time engine: (first token, first seen, finish, finish seen) per request."""
    limits = SchedulerLimits(max_num_seqs=4, max_num_batched_tokens=64, block_size=16, num_blocks=200)
    engine = engine_type("rank 0", LinearStep(slope), limits, front_output_ms=cost_ms)  # type: ignore[arg-type]
    timed = [(RequestSpec(prompt_tokens=p, output_tokens=o, units=()), t)
             for p, o, t in [(20, 40, 0), (30, 25, 0), (10, 60, 3), (40, 30, 5), (15, 20, 30), (25, 45, 31)]]
    requests = drive(engine, timed)
    return [(r.first_token_ms, r.first_seen_ms, r.finish_ms, r.finish_seen_ms) for r in requests]


@pytest.mark.parametrize("cost_ms", [0.1, 0.3, 0.7])
@pytest.mark.parametrize("slope", [0.0, 0.004, -0.004])
def test_a_stretch_queues_the_front_end_as_its_steps_one_by_one(cost_ms: float, slope: float) -> None:
    """Steps of up to four outputs: at 0.1 ms the front end keeps up (lag n x cost after each step), at 0.3
    and 0.7 ms it falls behind while four decode and catches up after; steps growing or shrinking with the context
    (a shrinking one: the closed form's largest term inside the stretch)."""
    stretched, stepped = _seen(Engine, cost_ms, slope), _seen(StepByStep, cost_ms, slope)
    assert [t for row in stretched for t in row] == pytest.approx([t for row in stepped for t in row], rel=1e-12)
    if slope:
        return
    lags = [seen - done for _, _, done, seen in stretched]
    assert min(lags) >= cost_ms - 1e-9
    if cost_ms > 0.25:
        assert max(lags) > 5.0  # the lag built up over the stretches
    else:
        assert max(lags) <= 4 * cost_ms + 1e-9
    assert _seen(Engine, 0.0) == [(f, None, d, None) for f, _, d, _ in stretched]  # 0: no front-end time at all


def test_one_client_sees_each_token_one_output_late(dense: ModelSpec, h200: GpuSpec) -> None:
    """One request at a time: each step's one output costs less than the step, so its first and last tokens
    reach the client one output's cost after the engine gave them, and the next request leaves that much later."""
    base = RooflineModel(dense, h200)
    lagged = base.with_calibration(base.calibration.model_copy(update={"front_end_output_us": 500.0}))
    plan = ReplayPlan(deployment=parse_deployment("TP8"), workload=Workload.model_validate({"isl": 1000, "osl": 20}),
                      arrival=ArrivalProcess("closed", concurrency=1), num_requests=5)
    plain, late = replay(base, plan).requests, replay(lagged, plan).requests
    for i, (p, q) in enumerate(zip(plain, late, strict=True)):
        assert q.ttft_ms == pytest.approx(p.ttft_ms + 0.5, rel=1e-9)
        assert q.e2e_ms == pytest.approx(p.e2e_ms + 0.5, rel=1e-9)
        assert q.prefill_ms == pytest.approx(p.prefill_ms, rel=1e-9)  # vLLM's engine interval: no front end
        assert q.sent_ms == pytest.approx(p.sent_ms + 0.5 * i, rel=1e-9)


def test_a_loaded_front_end_falls_behind(dense: ModelSpec, h200: GpuSpec) -> None:
    """A loaded open loop and a closed loop of 16: each step's outputs cost more than the step, so first and last
    tokens reach the client well after the engine gave them (the engine's own intervals unchanged in the closed-form
    stretches; step by step the replay prices each step apart, so only the lag is compared)."""
    base = RooflineModel(dense, h200)
    lagged = base.with_calibration(base.calibration.model_copy(update={"front_end_output_us": 1500.0}))
    work = Workload.model_validate({"isl": 1500, "osl": 120})
    plans = [ReplayPlan(deployment=parse_deployment("TP8"), workload=work,
                        arrival=ArrivalProcess("poisson", rate_rps=6.0), num_requests=120),
             ReplayPlan(deployment=parse_deployment("TP8"), workload=work,
                        arrival=ArrivalProcess("closed", concurrency=16), num_requests=120)]
    for plan in plans:
        a, p = replay(lagged, plan), replay(base, plan)
        assert a.ttft_ms.p90 > p.ttft_ms.p90 + 5.0  # the front end fell behind
        assert a.e2e_ms.p50 > p.e2e_ms.p50 + 5.0
        assert a.ttft_ms.p50 > p.ttft_ms.p50


@pytest.mark.parametrize(("first", "slope", "c", "free"), [(1.0, 0.0, 0.5, -1.0), (1.0, 0.0, 1.5, 3.0),
                                                            (2.0, -0.05, 1.2, 0.0), (0.5, 0.02, 0.8, 30.0),
                                                            (3.0, -0.1, 0.9, -5.0)])
def test_the_closed_form_is_the_queue_step_by_step(first: float, slope: float, c: float, free: float) -> None:
    """`_front_stretch` against max(free, end of step) + c over 25 steps, the step times linear (shrinking ones
    put the largest term inside the stretch)."""
    limits = SchedulerLimits(max_num_seqs=4, max_num_batched_tokens=64)
    engine = Engine("rank 0", LinearStep(0.0), limits, front_output_ms=c / 4)  # type: ignore[arg-type]
    engine.front_free_ms = free
    k, before = 25, 2.0
    engine._front_stretch(before, first, slope, k, 4)
    end, expect = before, free
    for j in range(k):
        end += first + slope * j
        expect = max(expect, end) + c
    assert engine.front_free_ms == pytest.approx(expect, rel=1e-12)
