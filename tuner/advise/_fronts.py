"""Both serving modes' fronts from the performance model: closed loop (each topology's concurrency ladder) or
open loop (every instance count that carries one offered rate), composed under the limits; when nothing is left,
the error says which limit removed everything and what would be enough."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from tuner.deployment import Deployment, InstanceGroup, at_decode_depths
from tuner.errors import InfeasibleError
from tuner.frontier import (
    AggregatedPoint,
    ComposedPoint,
    Constraints,
    Winner,
    combined_front,
    compose_aggregated,
    compose_disaggregated,
    compose_rate_aggregated,
    compose_rate_disaggregated,
    pareto_front,
    which_wins,
)
from tuner.models import ModelSpec
from tuner.perf import Curves, LevelLimits, RateCurves, RooflineModel, sweep_curves, sweep_rate_curves
from tuner.topology import Role, Topology
from tuner.workload import Workload


class SweepProgress(Protocol):
    """Told how many topologies the sweep predicts, then each as it is (a terminal's progress bar); `restart` when
    the sweep runs again."""

    def start(self, total: int) -> None: ...

    def advance(self, topo: Topology) -> None: ...

    def restart(self) -> None: ...


class NoProgress:
    def start(self, total: int) -> None:
        pass

    def advance(self, topo: Topology) -> None:
        pass

    def restart(self) -> None:
        pass


@dataclass(frozen=True)
class Fronts:
    """Every composed PD deployment, the PD front, the aggregated front and which mode wins where."""

    points: list[ComposedPoint]
    front: list[ComposedPoint]
    aggregated: list[AggregatedPoint]
    winners: list[Winner]


def swept_mtp_depths(spec: ModelSpec, serving: str, depths: tuple[int, ...]
                     ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prefill, aggregated) MTP depths a sweep predicts: a hybrid model's prefill at every depth, another's once at
    0 (at_decode_depths relabels it); none for a mode left out by the serving mode."""
    prefill = (depths if spec.is_hybrid else (0,)) if serving != "agg" else ()
    return prefill, depths if serving != "disagg" else ()


def closed_loop_fronts(perf: RooflineModel, topologies: list[Topology], traffic: Workload, constraints: Constraints,
                       serving: str, depths: tuple[int, ...], progress: SweepProgress) -> tuple[Curves, Fronts]:
    """The concurrency ladder of every topology, composed."""
    spec, c = perf.model, constraints

    prefill_depths, aggregated_depths = swept_mtp_depths(spec, serving, depths)

    def sweep(limits: LevelLimits | None) -> Curves:
        curves = sweep_curves(perf, topologies, isl=traffic.isl, osl=traffic.osl, prefill_mtp_depths=prefill_depths,
                              aggregated_mtp_depths=aggregated_depths, on_topology=progress.advance,
                              workload=traffic, limits=limits)
        return curves if spec.is_hybrid else replace(curves, prefill=at_decode_depths(curves.prefill, depths))

    # Under an SLA each ladder stops at its first level past a bound (same fronts, a fraction of the points);
    # when nothing meets the SLA the full sweep runs again, so the error names what the full one would.
    limits = LevelLimits(max_ttft_ms=c.max_ttft_ms, max_itl_ms=c.max_itl_ms, min_tok_s_per_user=c.min_tok_s_per_user,
                         percentile=c.percentile)
    curves = sweep(limits)
    try:
        return curves, _fronts(curves, constraints, serving)
    except InfeasibleError:
        if not limits.active:
            raise
    progress.restart()
    curves = sweep(None)
    return curves, _fronts(curves, constraints, serving)


def _fronts(curves: Curves, constraints: Constraints, serving: str) -> Fronts:
    """Both modes' fronts; a mode that nothing satisfies is left empty when the other one has points."""
    points: list[ComposedPoint] = []
    aggregated: list[AggregatedPoint] = []
    failure: InfeasibleError | None = None
    if serving in ("both", "disagg"):
        try:
            points = compose_disaggregated(curves.prefill, curves.decode, constraints)
        except InfeasibleError as exc:
            failure = exc
    if serving in ("both", "agg"):
        aggregated = compose_aggregated(curves.aggregated, constraints)
    if not points and not aggregated:
        raise failure or InfeasibleError("no aggregated deployment meets the limits", field="sla.max_itl_ms",
                                         fix="raise the TTFT/ITL limits or allow more GPUs")
    front = combined_front(points)
    agg_front = pareto_front(aggregated, x="total_tok_s_per_gpu", y="tok_s_per_user")
    return Fronts(points, front, agg_front, which_wins(front, agg_front))


def rate_fronts(perf: RooflineModel, topologies: list[Topology], traffic: Workload, constraints: Constraints,
                serving: str, depths: tuple[int, ...], progress: SweepProgress,
                hint: ReplayHint | None = None) -> tuple[RateCurves, Fronts]:
    """Open loop: every instance count of every topology that carries the rate, composed; when none does, an
    error that says how many GPUs would, and when none meets the SLA, the best latency that can be had."""
    spec, c = perf.model, constraints
    prefill_depths, aggregated_depths = swept_mtp_depths(spec, serving, depths)
    curves = sweep_rate_curves(perf, topologies, traffic, max_gpus=c.max_gpus, prefill_mtp_depths=prefill_depths,
                               aggregated_mtp_depths=aggregated_depths, on_topology=progress.advance)
    if not spec.is_hybrid:
        curves = replace(curves, prefill=at_decode_depths(curves.prefill, depths))

    def compose(limits: Constraints) -> tuple[list[ComposedPoint], list[AggregatedPoint]]:
        rate = curves.offered_rps
        points = (compose_rate_disaggregated(curves.prefill, curves.decode, limits, offered_rps=rate)
                  if serving != "agg" else [])
        aggregated = (compose_rate_aggregated(curves.aggregated, limits, offered_rps=rate)
                      if serving != "disagg" else [])
        return points, aggregated

    points, aggregated = compose(c)
    if not points and not aggregated:
        raise rate_failure(curves, c, serving, *compose(Constraints(max_gpus=c.max_gpus, percentile=c.percentile,
                                                                    pairing=c.pairing)), hint=hint)
    front = combined_front(points)
    agg_front = pareto_front(aggregated, x="total_tok_s_per_gpu", y="tok_s_per_user")
    return curves, Fronts(points, front, agg_front, which_wins(front, agg_front))


def fewest_deployments(curves: RateCurves, serving: str) -> list[Deployment]:
    """The deployments whose instances carry the rate by the steady-state model, fewest GPUs first: each aggregated
    topology's instances, and one prefill and one decode topology's (each side's fewest)."""
    def fewest(role: Role) -> list[InstanceGroup]:
        return sorted((InstanceGroup(role=r, topology=t, count=n) for (t, r), n in curves.instances_needed.items()
                       if r is role), key=lambda g: g.num_gpus)

    options = [Deployment(groups=(g,)) for g in fewest(Role.BOTH)] if serving != "disagg" else []
    prefill, decode = fewest(Role.PREFILL), fewest(Role.DECODE)
    if serving != "agg" and prefill and decode:
        options.append(Deployment(groups=(prefill[0], decode[0])))
    return sorted(options, key=lambda d: d.num_gpus)


# The replay's "about N GPUs" (tuner/advise/_verify.py): the fewest GPUs, scaling the deployments given past the
# budget, it shows carrying the rate within the SLA, with that deployment's name; None: none up to its bound.
ReplayHint = Callable[[list[Deployment], int], tuple[int, str] | None]


def _needs_more_gpus(c: Constraints, rate: float, needed: list[Deployment], hint: ReplayHint | None
                     ) -> InfeasibleError:
    """Every deployment within the budget saturates: how many GPUs would carry the rate, from the replay when it
    decides (a count it shows carrying the rate within the SLA), else from the steady-state model."""
    head = (f"no deployment of up to {c.max_gpus} GPUs carries {rate:g} req/s: every one saturates (its queue "
            "and TTFT grow without bound)")
    if hint is None:
        gpus = needed[0].num_gpus
        return InfeasibleError(f"{head}; about {gpus} GPUs would carry it", field="gpus",
                               fix=f"allow at least {gpus} GPUs (`gpus` {gpus}) or offer a lower `request_rate`")
    replayed = hint(needed, c.max_gpus)
    if replayed is None:
        return InfeasibleError(f"{head}; replayed, {needed[0].name} and the other fewest-GPU deployments scaled up "
                               "do not carry it within the limits either", field="gpus",
                               fix="offer a lower `request_rate` or relax the limits")
    gpus, name = replayed
    return InfeasibleError(f"{head}; the replay shows {name} on {gpus} GPUs carrying it within the limits",
                           field="gpus", fix=f"allow at least {gpus} GPUs (`gpus` {gpus}) or offer a lower "
                                             "`request_rate`")


def rate_failure(curves: RateCurves, c: Constraints, serving: str, carried: list[ComposedPoint],
                 carried_agg: list[AggregatedPoint], hint: ReplayHint | None = None) -> InfeasibleError:
    """Why nothing is left at the offered rate: no deployment carries it in the budget (and how many GPUs
    would), or every one that does breaks the SLA (and the best latency one reaches)."""
    rate = curves.offered_rps
    if not carried and not carried_agg:
        needed = fewest_deployments(curves, serving)
        if needed and needed[0].num_gpus > c.max_gpus:
            return _needs_more_gpus(c, rate, needed, hint)
        return InfeasibleError(f"no deployment of up to {c.max_gpus} GPUs carries {rate:g} req/s", field="gpus",
                               fix="allow more GPUs (`gpus`) or offer a lower `request_rate`")
    pct = c.percentile
    every = [*carried, *carried_agg]
    best_ttft = min(p.ttft_ms for p in every)
    best_itl = min(p.itl_ms for p in every)
    where = f"at {rate:g} req/s within {c.max_gpus} GPUs"
    if c.max_ttft_ms is not None and best_ttft > c.max_ttft_ms:
        return InfeasibleError(f"no deployment meets TTFT <= {c.max_ttft_ms:g} ms ({pct}) {where}; the best TTFT is "
                               f"{best_ttft:,.0f} ms", field="sla.max_ttft_ms",
                               fix=f"raise the TTFT limit to at least {math.ceil(best_ttft)} ms, or allow more GPUs")
    bound = c.max_itl_for_users_ms
    if bound is not None and best_itl > bound:
        field = "sla.min_tok_s_user" if c.max_itl_ms is None or bound < c.max_itl_ms else "sla.max_itl_ms"
        return InfeasibleError(f"no deployment meets ITL <= {bound:g} ms ({pct}) {where}; the best ITL is "
                               f"{best_itl:.1f} ms ({1000 / best_itl:.1f} tok/s/user)", field=field,
                               fix=f"relax `{field}` (the best deployment gives {best_itl:.1f} ms)")
    return InfeasibleError(f"no deployment meets the TTFT and ITL limits together ({pct}) {where} (the best TTFT "
                           f"is {best_ttft:,.0f} ms, the best ITL {best_itl:.1f} ms, on different deployments)",
                           field="sla.max_ttft_ms",
                           fix="relax `sla.max_ttft_ms` or `sla.max_itl_ms`, or allow more GPUs")

