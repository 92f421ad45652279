"""The replay as the judge of what the analytic model proposes: verify candidates, decide the SLA choice and the
fewest GPUs that carry a rate.

The analytic model screens thousands of deployments in milliseconds and proposes a few; each is replayed with
the real stream (its lengths, prefixes and bursts) and kept only if the replay shows it meeting the SLA at the
asked percentile and, open loop, its queue not growing. `advise()` calls `verify_candidates` on its best points.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.deployment import Deployment
from tuner.errors import InfeasibleError
from tuner.perf import RooflineModel
from tuner.replay._arrivals import ArrivalProcess
from tuner.replay._replay import ReplayPlan, replay
from tuner.replay._report import ReplayReport, Sla
from tuner.router import RouterPolicy
from tuner.workload import Workload

DEFAULT_VERIFY_REQUESTS = 600


@dataclass(frozen=True)
class Candidate:
    """A deployment the analytic model proposes, with what it predicted (to rank and to report beside)."""

    deployment: Deployment
    predicted_tok_s_per_gpu: float = 0.0
    concurrency: int | None = None  # closed loop: the clients it was predicted at
    label: str = ""


@dataclass(frozen=True)
class Verified:
    candidate: Candidate
    report: ReplayReport
    meets_sla: bool
    reason: str  # why not, or "meets the SLA"


@dataclass(frozen=True)
class VerifiedChoice:
    """The first candidate (in the order given) the replay shows meeting the SLA, and every check made."""

    choice: Verified | None
    checked: tuple[Verified, ...]

    def as_json(self) -> dict[str, object]:
        def row(v: Verified) -> dict[str, object]:
            r = v.report
            return {"deployment": r.deployment, "num_gpus": r.num_gpus, "label": v.candidate.label,
                    "max_num_seqs": [g.topology.max_num_seqs for g in v.candidate.deployment.groups],
                    "predicted_tok_s_per_gpu": round(v.candidate.predicted_tok_s_per_gpu, 1),
                    "replayed_tok_s_per_gpu": round(r.total_tok_s_per_gpu, 1), "ttft_ms_p50": round(r.ttft_ms.p50, 1),
                    "ttft_ms_p90": round(r.ttft_ms.p90, 1), "ttft_ms_p99": round(r.ttft_ms.p99, 1),
                    "itl_ms_p50": round(r.itl_ms.p50, 2), "itl_ms_p90": round(r.itl_ms.p90, 2),
                    "sla_attainment": round(r.sla_attainment, 4), "queue_grows": r.queue.grows,
                    "meets_sla": v.meets_sla, "reason": v.reason}

        return {"choice": None if self.choice is None else row(self.choice),
                "checked": [row(v) for v in self.checked]}


def _judge(report: ReplayReport, sla: Sla, percentile: str, open_loop: bool) -> tuple[bool, str]:
    if open_loop and report.queue.grows:
        return False, report.queue.describe()
    ttft, itl = report.ttft_ms.at(percentile), report.itl_ms.at(percentile)
    if sla.max_ttft_ms is not None and ttft > sla.max_ttft_ms:
        return False, f"TTFT {percentile} {ttft:,.0f} ms > {sla.max_ttft_ms:g} ms"
    if sla.max_itl_ms is not None and itl > sla.max_itl_ms:
        return False, f"ITL {percentile} {itl:.1f} ms > {sla.max_itl_ms:g} ms"
    return True, "meets the SLA"


def verify_candidates(perf: RooflineModel, candidates: Sequence[Candidate], workload: Workload, *,
                      sla: Sla, percentile: str = "p90", arrival: ArrivalProcess | None = None,
                      router: RouterPolicy = RouterPolicy.CACHE_AWARE,
                      num_requests: int | None = DEFAULT_VERIFY_REQUESTS,
                      warmup_share: float = 0.1, stop_at_first: bool = True) -> VerifiedChoice:
    """Replay each candidate (open loop: `arrival`; closed loop: at the candidate's own concurrency) and keep the
    first that meets the SLA at `percentile`. A trace is replayed whole (its own length) when `num_requests` is
    None; a candidate whose replay stops past the horizon is a candidate that does not carry the load."""
    checked: list[Verified] = []
    for c in candidates:
        process = arrival or ArrivalProcess("closed", concurrency=max(1, c.concurrency or 1))
        count, warmup = num_requests, warmup_share
        if count is not None and not process.open_loop:
            count = max(count, 3 * process.concurrency)  # every client sends a few requests
            # every client's first request is warm-up: they all leave at once, a wave no steady state has
            warmup = max(warmup, min(0.5, process.concurrency / count))
        plan = ReplayPlan(deployment=c.deployment, workload=workload, arrival=process, router=router,
                          num_requests=count, warmup_share=warmup, sla=sla)
        try:
            report = replay(perf, plan)
        except InfeasibleError:
            continue
        ok, reason = _judge(report, sla, percentile, process.open_loop)
        verified = Verified(c, report, ok, reason)
        checked.append(verified)
        if ok and stop_at_first:
            return VerifiedChoice(verified, tuple(checked))
    choice = next((v for v in checked if v.meets_sla), None)
    return VerifiedChoice(choice, tuple(checked))


def _scaled(deployment: Deployment, scale: int) -> Deployment:
    groups = tuple(g.model_copy(update={"count": g.count * scale}) for g in deployment.groups)
    return deployment.model_copy(update={"groups": groups})


def fewest_instances_for_rate(perf: RooflineModel, deployment: Deployment, workload: Workload, *, rate_rps: float,
                              sla: Sla, percentile: str = "p90", max_gpus: int, arrival_kind: str = "poisson",
                              router: RouterPolicy = RouterPolicy.CACHE_AWARE,
                              num_requests: int | None = DEFAULT_VERIFY_REQUESTS,
                              start_scale: int = 1, floor_scale: int = 0) -> VerifiedChoice:
    """Scale a deployment's instance counts (each group by the same factor, PD keeping its ratio) within the GPU
    budget and return the smallest the replay shows carrying `rate_rps` within the SLA.

    From `start_scale` (an estimate; 1 scans from one copy) it grows by half until a scale passes, then bisects
    between the largest failing and the smallest passing scale (more instances never carry less): about
    2 log2(scales) replays, not one per scale. `floor_scale`: the largest scale already known to fail (a start at
    the budget's scale then costs one replay when even that fails). A replay stopped past its horizon fails."""
    arrival = ArrivalProcess(arrival_kind, rate_rps=rate_rps)  # type: ignore[arg-type]
    top = max_gpus // max(1, deployment.num_gpus)
    checked: list[Verified] = []
    passed: dict[int, Verified] = {}

    def meets(scale: int) -> bool:
        one = verify_candidates(perf, [Candidate(_scaled(deployment, scale), label=f"x{scale}")], workload, sla=sla,
                                percentile=percentile, arrival=arrival, router=router, num_requests=num_requests)
        checked.extend(one.checked)
        if one.choice is not None:
            passed[scale] = one.choice
        return one.choice is not None

    low, high = max(0, floor_scale), None  # the largest scale known to fail, the smallest known to pass
    scale = min(max(low + 1, start_scale), top)
    while high is None and low < top:
        if meets(scale):
            high = scale
        else:
            low = scale
            scale = min(top, max(scale + 1, math.ceil(scale * 1.5)))
    while high is not None and high - low > 1:
        mid = (low + high) // 2
        if meets(mid):
            high = mid
        else:
            low = mid
    return VerifiedChoice(passed[high] if high is not None else None, tuple(checked))
