"""Closed and open loop agree (#45): a deployment offered, open loop, 90% of the rate it sustains closed loop is
stable and meets the closed loop's latencies within 10% (benchmarks/closed_open_agreement.py runs more cases)."""

from __future__ import annotations

from tuner.deployment import parse_deployment
from tuner.hardware import GpuSpec
from tuner.models import ModelSpec
from tuner.perf import RooflineModel
from tuner.replay import ArrivalProcess, ReplayPlan, replay
from tuner.workload import Workload


def test_open_loop_at_90_percent_of_the_closed_loop_rate_holds_its_latencies(dense: ModelSpec, h200: GpuSpec) -> None:
    perf = RooflineModel(dense, h200)
    deployment = parse_deployment("1P:TP4,1D:TP4")
    traffic = Workload.fixed(2000, 200, concurrency=(1,))
    closed = replay(perf, ReplayPlan(deployment=deployment, workload=traffic,
                                     arrival=ArrivalProcess("closed", concurrency=32), num_requests=500,
                                     warmup_share=0.1))
    # the sustained rate counts the time every client is busy, not the drain after the last request is sent
    assert closed.sustained_rps > closed.request_rps
    rate = 0.9 * closed.sustained_rps
    opened = replay(perf, ReplayPlan(deployment=deployment, workload=traffic,
                                     arrival=ArrivalProcess("poisson", rate_rps=rate), num_requests=500,
                                     warmup_share=0.1))
    assert not opened.queue.grows
    assert abs(opened.sustained_rps / rate - 1) < 0.15  # the open loop sends what it is offered
    for percentile in ("p50", "p90"):
        assert opened.ttft_ms.at(percentile) <= 1.1 * closed.ttft_ms.at(percentile)
        assert opened.itl_ms.at(percentile) <= 1.1 * closed.itl_ms.at(percentile)
