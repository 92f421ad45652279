"""Prefill and decode curves of every topology that fits, from a performance model (the frontier's input)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tuner.errors import DoesNotFitError
from tuner.metrics import ServingMetrics
from tuner.perf._base import PerformanceModel
from tuner.perf._roofline import RooflineModel
from tuner.perf._traffic import SATURATION, predict_traffic
from tuner.topology import Role, Topology, accepted_topologies
from tuner.workload import Workload

# Load levels a sweep predicts: steps of about sqrt(2), so neighbouring points of a front are close (powers of two
# alone left jumps of x3 in tok/s/GPU between neighbours).
DECODE_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072,
                 4096)
PREFILL_LADDER = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


@dataclass(frozen=True)
class LevelLimits:
    """An SLA as a sweep reads it, to stop early: along a ladder a (topology, role)'s latency only grows with the
    load, so the first level that breaks a bound ends its curve; the levels above it would only be composed into
    deployments the SLA refuses (tuner.frontier drops them anyway: the front and the recommendation are those of
    the full sweep, tests/perf/test_sweep_limits.py pins it).

    A prefill point is judged by its TTFT; a decode point by its ITL (the SLA's or the per-user floor's, the
    tighter) and its TTFT (the prefill side only adds to it); an aggregated point by both and its tok/s/user."""

    max_ttft_ms: float | None = None
    max_itl_ms: float | None = None
    min_tok_s_per_user: float | None = None
    percentile: str = "p90"

    @property
    def active(self) -> bool:
        return any(b is not None for b in (self.max_ttft_ms, self.max_itl_ms, self.min_tok_s_per_user))

    def breaks(self, role: Role, m: ServingMetrics) -> bool:
        """Whether no deployment built on this point can meet the limits."""
        if self.max_ttft_ms is not None and m.ttft_ms_at(self.percentile) > self.max_ttft_ms:
            return True
        if role is Role.PREFILL:
            return False
        itl = m.itl_ms_at(self.percentile)
        if role is Role.DECODE:
            floor = 1000.0 / self.min_tok_s_per_user if self.min_tok_s_per_user else None
            bounds = [b for b in (self.max_itl_ms, floor) if b is not None]
            return bool(bounds) and itl > min(bounds)
        return ((self.max_itl_ms is not None and itl > self.max_itl_ms)
                or (self.min_tok_s_per_user is not None and m.tok_s_per_user < self.min_tok_s_per_user))


@dataclass(frozen=True)
class Curves:
    """(Topology, ServingMetrics) points per role; `skipped` says why a topology was left out."""

    prefill: list[tuple[Topology, ServingMetrics]] = field(default_factory=list)
    decode: list[tuple[Topology, ServingMetrics]] = field(default_factory=list)
    aggregated: list[tuple[Topology, ServingMetrics]] = field(default_factory=list)  # role both
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def num_points(self) -> int:
        return len(self.prefill) + len(self.decode) + len(self.aggregated)


def candidate_topologies(perf: PerformanceModel, num_gpus: int, *, max_gpus_per_instance: int | None = None,
                         mtp_depths: Sequence[int] = (0,), **engine: object) -> list[Topology]:
    """The performance model's candidates: tuner.topology.accepted_topologies for its model (memory is checked
    later)."""
    return accepted_topologies(perf.model, num_gpus, mtp_depths=mtp_depths,
                               max_gpus_per_instance=max_gpus_per_instance, **engine)


def sweep_curves(perf: PerformanceModel, topologies: Sequence[Topology], *, isl: int, osl: int,
                 prefill_mtp_depths: Sequence[int] = (0,), decode_ladder: Sequence[int] = DECODE_LADDER,
                 prefill_ladder: Sequence[int] = PREFILL_LADDER,
                 aggregated_mtp_depths: Sequence[int] = (),
                 on_topology: Callable[[Topology], None] | None = None, workload: Workload | None = None,
                 limits: LevelLimits | None = None) -> Curves:
    """Predict every topology as PD prefill (only at `prefill_mtp_depths`) and decode, and as an aggregated
    instance at `aggregated_mtp_depths` (none by default); skip those that do not fit.

    Levels past the instance's capacity only add queueing (same rate and ITL, longer TTFT), so the ladder stops
    at the capacity itself. With a `workload` (a RooflineModel's), each level is predicted for its length mix and
    prefix reuse, with latency percentiles; `isl`/`osl` are then its typical lengths. With `limits`, a ladder
    also stops at its first level that breaks them (LevelLimits).
    """
    until = limits if limits is not None and limits.active else None
    curves = Curves()
    for topo in topologies:
        if on_topology is not None:
            on_topology(topo)
        for role in _roles(topo, prefill_mtp_depths, aggregated_mtp_depths):
            target = _bucket(curves, role)
            ladder = prefill_ladder if role is Role.PREFILL else decode_ladder
            try:
                cap = perf.capacity(topo, role, isl=isl, osl=osl)
            except DoesNotFitError as exc:
                curves.skipped.append((f"{topo.label()} {role.value}", exc.message))
                continue
            levels = [c for c in ladder if c < cap] + ([cap] if cap <= ladder[-1] else [])
            placed = topo.model_copy(update={"role": role})
            stop = None if until is None else functools.partial(until.breaks, role)
            if workload is not None and isinstance(perf, RooflineModel):
                points = predict_traffic(perf, placed, role, workload.model_copy(
                    update={"concurrency": tuple(levels), "arrival": "closed", "request_rates": ()}),
                    until=stop).points
            elif stop is None:
                points = perf.predict_curve(placed, role, isl=isl, osl=osl, concurrencies=levels)
            else:
                points = []
                for c in levels:
                    point = perf.predict(placed, role, isl=isl, osl=osl, concurrency=c)
                    if stop(point):
                        break
                    points.append(point)
            target.extend((placed, metrics) for metrics in points)
    return curves


@dataclass(frozen=True)
class RateCurves:
    """Open loop: every (topology, instance count) that carries one offered rate, per role. Each entry is
    (topology, instances, one instance's metrics at offered_rps / instances); `instances_needed` is how many
    instances of a (topology, role) carry the rate by one instance's capacity (its prefix cache alone), so a budget
    too small can say how many GPUs would do."""

    offered_rps: float
    prefill: list[tuple[Topology, int, ServingMetrics]] = field(default_factory=list)
    decode: list[tuple[Topology, int, ServingMetrics]] = field(default_factory=list)
    aggregated: list[tuple[Topology, int, ServingMetrics]] = field(default_factory=list)
    instances_needed: dict[tuple[Topology, Role], int] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def num_points(self) -> int:
        return len(self.prefill) + len(self.decode) + len(self.aggregated)


def sweep_rate_curves(perf: RooflineModel, topologies: Sequence[Topology], workload: Workload, *, max_gpus: int,
                      prefill_mtp_depths: Sequence[int] = (0,), aggregated_mtp_depths: Sequence[int] = (),
                      on_topology: Callable[[Topology], None] | None = None) -> RateCurves:
    """An open-loop workload's one rate R shared by n instances of each topology (n = 1 .. what the GPU budget
    holds, each instance offered R / n behind a router; its prefix cache pooled over the n as the router allows):
    the counts that leave an instance saturated are left out, since its queue would grow without bound."""
    if not workload.open_loop or len(workload.request_rates) != 1:
        raise ValueError("sweep_rate_curves takes an open-loop workload with exactly one request rate")
    rate = workload.request_rates[0]
    curves = RateCurves(offered_rps=rate)
    for topo in topologies:
        if on_topology is not None:
            on_topology(topo)
        for role in _roles(topo, prefill_mtp_depths, aggregated_mtp_depths):
            target = _bucket(curves, role)
            placed = topo.model_copy(update={"role": role})
            # a PD side leaves at least one GPU to the other side
            most = (max_gpus - (0 if role is Role.BOTH else 1)) // topo.num_gpus
            try:
                perf.capacity(topo, role, isl=workload.isl, osl=1 if role is Role.PREFILL else workload.osl)
            except DoesNotFitError as exc:
                curves.skipped.append((f"{topo.label()} {role.value}", exc.message))
                continue
            rates_seen: dict[tuple[int, float], float] = {}  # the counts' searches probe the same client counts
            for n in range(1, most + 1):
                share = workload.model_copy(update={"request_rates": (rate / n,)})
                traffic = predict_traffic(perf, placed, role, share, replicas=n, rates_seen=rates_seen)
                if n == 1:
                    curves.instances_needed[(placed, role)] = (
                        math.ceil(rate / (SATURATION * traffic.saturated[0].capacity_rps) + 1e-9)
                        if traffic.saturated and traffic.saturated[0].capacity_rps > 0 else 1)
                target.extend((placed, n, m) for m in traffic.points)
    return curves


def _roles(topo: Topology, prefill_mtp_depths: Sequence[int], aggregated_mtp_depths: Sequence[int]) -> list[Role]:
    """The roles a topology is swept in: decode always; prefill and aggregated at their MTP depths."""
    return ([Role.DECODE] + ([Role.PREFILL] if topo.mtp in prefill_mtp_depths else [])
            + ([Role.BOTH] if topo.mtp in aggregated_mtp_depths else []))


def _bucket(curves: Curves | RateCurves, role: Role) -> list:
    """The list a role's points go to (both curve kinds name them alike)."""
    return {Role.DECODE: curves.decode, Role.PREFILL: curves.prefill, Role.BOTH: curves.aggregated}[role]
