"""A simulated trial's latencies and SLA attainment from the replay (tuner/replay): each level of an aggregated
trial is replayed request by request through vLLM's scheduler (closed loop at its clients, or open loop at its
offered rate), so the study's SLA constraint and goodput read what the requests did (bursts, bimodal cache hits,
queues) rather than a steady state. Bounded: at most TRIAL_REPLAY_REQUESTS requests per trial, the levels replayed
from the lightest while the budget lasts (a closed-loop level takes 2 requests per client, at least 32; an open-loop
level 32 at least); a level past the budget keeps the analytic figures (`replayed_sla_attainment` None). A PD phase
trial (prefill or decode alone) keeps the analytic figures: the replay needs both sides of a PD deployment.
"""

from __future__ import annotations

import numpy as np

from tuner.deployment import Deployment
from tuner.errors import InfeasibleError
from tuner.metrics import SKETCH_PROBABILITIES, ServingMetrics
from tuner.perf import RooflineModel
from tuner.replay import ArrivalProcess, Percentiles, ReplayPlan, replay
from tuner.replay import Sla as ReplaySla
from tuner.topology import Role
from tuner.workload import Workload

TRIAL_REPLAY_REQUESTS = 400  # per trial, over its levels
MIN_LEVEL_REQUESTS = 32


def _level_requests(point: ServingMetrics) -> int:
    return max(MIN_LEVEL_REQUESTS, 2 * point.concurrency if point.offered_rps is None else MIN_LEVEL_REQUESTS)


def _sketch(values: list[float]) -> tuple[float, ...]:
    return tuple(float(v) for v in np.quantile(np.asarray(values, dtype=float), SKETCH_PROBABILITIES))


def replayed_point(perf: RooflineModel, deployment: Deployment, workload: Workload, point: ServingMetrics, *,
                   sla: ReplaySla, requests: int) -> ServingMetrics:
    """The point with its TTFT and ITL (mean, percentiles, sketches) and its SLA attainment from a replay at the
    point's load; the point as it was when the replay stops past its horizon (a load far past capacity)."""
    arrival = (ArrivalProcess("poisson", rate_rps=point.offered_rps) if point.offered_rps else
               ArrivalProcess("closed", concurrency=point.concurrency))
    plan = ReplayPlan(deployment=deployment, workload=workload, arrival=arrival, sla=sla, warmup_share=0.1,
                      num_requests=requests)
    try:
        report = replay(perf, plan)
    except InfeasibleError:
        return point
    ttft = [r.ttft_ms for r in report.requests]
    itl = [r.itl_ms for r in report.requests if r.itl_ms is not None] or [0.0]  # one-token answers: no gap
    itl_ms = Percentiles.of(itl)
    return point.model_copy(update={
        "ttft_ms_mean": report.ttft_ms.mean, "ttft_ms_p50": report.ttft_ms.p50, "ttft_ms_p90": report.ttft_ms.p90,
        "ttft_ms_p99": report.ttft_ms.p99, "ttft_ms_sketch": _sketch(ttft),
        "itl_ms_mean": itl_ms.mean, "itl_ms_p50": itl_ms.p50, "itl_ms_p90": itl_ms.p90, "itl_ms_p99": itl_ms.p99,
        "itl_ms_sketch": _sketch(itl), "replayed_sla_attainment": report.sla_attainment})


def replayed_points(perf: RooflineModel, deployment: Deployment, workload: Workload,
                    points: list[ServingMetrics], *, max_ttft_ms: float | None,
                    max_itl_ms: float | None) -> list[ServingMetrics]:
    """Every level of an aggregated trial under an SLA, replayed; other trials' points as they are."""
    if (max_ttft_ms is None and max_itl_ms is None) or deployment.groups[0].role is not Role.BOTH:
        return points
    sla = ReplaySla(max_ttft_ms=max_ttft_ms, max_itl_ms=max_itl_ms)
    budget = TRIAL_REPLAY_REQUESTS
    out = list(points)
    for i in sorted(range(len(points)), key=lambda i: points[i].load):
        requests = _level_requests(points[i])
        if requests > budget:
            break
        budget -= requests
        out[i] = replayed_point(perf, deployment, workload, points[i], sla=sla, requests=requests)
    return out
