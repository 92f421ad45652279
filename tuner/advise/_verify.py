"""The replay's verdict on the analytic fronts: the best few deployments are replayed with the real stream and
the first one the replay shows within the SLA is the one to run (tuner/replay `verify_candidates`).

Open loop (a rate): candidates by fewest GPUs, then tok/s/GPU, each replayed at the offered rate (the trace's
timestamps rescaled, or Poisson); closed loop: by tok/s/GPU, each at its own operating concurrency.
"""

from __future__ import annotations

from tuner.advise._fronts import Fronts
from tuner.advise._recommend import Point, operating_deployment
from tuner.frontier import AggregatedPoint
from tuner.perf import RooflineModel
from tuner.replay import ArrivalProcess, Candidate, VerifiedChoice, verify_candidates
from tuner.replay import Sla as ReplaySla
from tuner.workload import Workload

VERIFY_TOP = 8  # front points replayed at most (each ~0.1-1 s, up to two deployments each)


def _clients(point: Point) -> int:
    if isinstance(point, AggregatedPoint):
        return point.num_instances * point.concurrency_per_instance
    return point.metrics.concurrency


def replay_verified(perf: RooflineModel, fronts: Fronts, traffic: Workload, *, max_ttft_ms: float | None,
                    max_itl_ms: float | None, percentile: str, top: int = VERIFY_TOP) -> VerifiedChoice:
    """Replay the fronts' best `top` deployments (both modes) and keep the first within the SLA."""
    points: list[Point] = [*fronts.front, *fronts.aggregated]
    arrival = None
    if traffic.open_loop:
        points.sort(key=lambda p: (p.num_gpus, -p.total_tok_s_per_gpu))
        kind = "trace" if traffic.arrival == "trace" else "poisson"
        arrival = ArrivalProcess(kind, rate_rps=traffic.request_rates[0])
    else:
        points.sort(key=lambda p: -p.total_tok_s_per_gpu)
    candidates = []
    for p in points[:top]:
        # the operating deployment caps --max-num-seqs at the predicted batch; a burst past it queues in the
        # server, so the point's deployment with the serve option as given is tried next
        for deployment in dict.fromkeys((operating_deployment(p), p.deployment)):
            candidates.append(Candidate(deployment, p.total_tok_s_per_gpu, concurrency=_clients(p), label=p.mode))
    return verify_candidates(perf, candidates, traffic, sla=ReplaySla(max_ttft_ms=max_ttft_ms, max_itl_ms=max_itl_ms),
                             percentile=percentile, arrival=arrival,
                             num_requests=None if traffic.trace is not None else 600)
