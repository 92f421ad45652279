"""The engine's host time sharing its front end's core (`front_end_core_share`): a step's host part and the front
end's queued outputs run at half speed while both are busy, in closed form over a stretch exactly as step by step."""

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


class _Counted(Engine):
    """The engine as it runs, counting its closed-form stretches."""

    stretches = 0

    def _stretch(self, k: int):
        self.stretches += 1
        return super()._stretch(k)


_TIMED = [(20, 40, 0), (30, 25, 0), (10, 60, 3), (40, 30, 5), (15, 20, 30), (25, 45, 31), (12, 70, 90)]


def _run(engine_type: type[Engine], cost_ms: float, host: tuple[float, float], slope: float = 0.0):
    """Seven requests on a linear-time engine: the engine and (first token, first seen, finish, finish seen) each."""
    limits = SchedulerLimits(max_num_seqs=4, max_num_batched_tokens=64, block_size=16, num_blocks=200)
    engine = engine_type("rank 0", LinearStep(slope), limits,  # type: ignore[arg-type]
                         front_output_ms=cost_ms, shared_host_ms=host)
    requests = drive(engine, [(RequestSpec(prompt_tokens=p, output_tokens=o, units=()), t) for p, o, t in _TIMED])
    return engine, [(r.first_token_ms, r.first_seen_ms, r.finish_ms, r.finish_seen_ms) for r in requests]


@pytest.mark.parametrize("cost_ms", [0.1, 0.3, 0.7])
@pytest.mark.parametrize("host", [(0.3, 0.0), (0.1, 0.1), (0.5, 0.05), (0.9, 0.1)])
@pytest.mark.parametrize("slope", [0.0, 0.004, -0.004])
def test_a_stretch_shares_the_core_as_its_steps_one_by_one(cost_ms: float, host: tuple[float, float],
                                                           slope: float) -> None:
    """Up to four outputs a step, at 0.1 ms each below the host part (the lag falls to one step's outputs and stays
    there), at 0.3 and 0.7 above it (every step delayed by the whole host part while the front end lags); a host part
    longer than some steps (0.9 + 0.4 ms against steps shrinking to ~0.6 ms) is capped by each step's price."""
    engine, stretched = _run(_Counted, cost_ms, host, slope)
    stepped = _run(StepByStep, cost_ms, host, slope)[1]
    assert [t for row in stretched for t in row] == pytest.approx([t for row in stepped for t in row], rel=1e-12)
    if slope >= 0 and host[0] + 4 * host[1] <= 1.0:
        assert engine.stretches > 5  # the closed form ran, not only single steps
    unshared = _run(Engine, cost_ms, (0.0, 0.0), slope)[1]
    assert stretched[-1][3] > unshared[-1][3] + 1.0  # the front end's lag slowed the steps, and itself with them


def test_no_front_end_cost_no_sharing() -> None:
    """With no time per output the front end is never busy: a host part on its core changes nothing."""
    assert _run(Engine, 0.0, (0.5, 0.1))[1] == _run(Engine, 0.0, (0.0, 0.0))[1]


@pytest.mark.parametrize(("backlog", "host", "step", "delay"), [(3.0, 1.0, 2.0, 1.0), (0.4, 1.0, 2.0, 0.4),
                                                                (-1.0, 1.0, 2.0, 0.0), (3.0, 5.0, 2.0, 2.0)])
def test_processor_sharing_delays_both_by_the_overlap(backlog: float, host: float, step: float,
                                                      delay: float) -> None:
    """Two jobs on one core at half speed each until the shorter is done: the host part (capped by its step) and the
    front end's backlog both end min(backlog, host) later than alone."""
    limits = SchedulerLimits(max_num_seqs=4, max_num_batched_tokens=64)
    engine = Engine("rank 0", LinearStep(0.0), limits, front_output_ms=0.1,  # type: ignore[arg-type]
                    shared_host_ms=(host, 0.0))
    engine.clock = 10.0
    engine.front_free_ms = 10.0 + backlog
    assert engine._share_core(host, step) == pytest.approx(delay)
    assert engine.front_free_ms == pytest.approx(10.0 + backlog + delay)


def test_a_shared_core_slows_steps_only_while_the_front_end_is_busy(dense: ModelSpec, h200: GpuSpec) -> None:
    """A closed loop of 16 whose front end lags (1.5 ms an output): with the host part on its core every step is
    longer, so tokens come further apart and the engine's own prefill interval grows. At one client each step's one
    output (0.1 ms) is handled while the next step's host part runs: every decode step after the first token is
    0.1 ms longer, and nothing else changes."""
    base = RooflineModel(dense, h200)

    def calibrated(output_us: float, share: float) -> RooflineModel:
        return base.with_calibration(base.calibration.model_copy(
            update={"front_end_output_us": output_us, "front_end_core_share": share}))

    work = Workload.model_validate({"isl": 1500, "osl": 120})

    def plan(concurrency: int) -> ReplayPlan:
        return ReplayPlan(deployment=parse_deployment("TP8"), workload=work,
                          arrival=ArrivalProcess("closed", concurrency=concurrency), num_requests=64)

    alone, shared = replay(calibrated(1500.0, 0.0), plan(16)), replay(calibrated(1500.0, 1.0), plan(16))
    assert shared.itl_ms.p50 > alone.itl_ms.p50 * 1.05
    assert shared.token_gap_ms.mean > alone.token_gap_ms.mean * 1.05
    assert sum(r.prefill_ms for r in shared.requests) > sum(r.prefill_ms for r in alone.requests)
    one_alone, one_shared = replay(calibrated(100.0, 0.0), plan(1)), replay(calibrated(100.0, 1.0), plan(1))
    for a, b in zip(one_alone.requests, one_shared.requests, strict=True):
        assert b.ttft_ms == pytest.approx(a.ttft_ms, rel=1e-12)
        assert b.e2e_ms - a.e2e_ms == pytest.approx(0.1 * (work.osl - 1), rel=1e-9)
    assert replay(calibrated(0.0, 1.0), plan(16)).requests == replay(calibrated(0.0, 0.0), plan(16)).requests
