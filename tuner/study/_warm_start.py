"""Warm start: the simulator's predicted front of a phase, as params to enqueue before the sampler starts."""

from __future__ import annotations

from typing import Any

from tuner.frontier import hypervolume_2d, pareto_front
from tuner.hardware import GpuSpec
from tuner.memory import MemoryInputs, compute_memory
from tuner.models import ModelSpec
from tuner.perf import Calibration, RooflineModel, predict_traffic
from tuner.space import Phase, SearchSpace, phase_role
from tuner.study._objectives import phase_values
from tuner.topology import Topology


def predicted_points(space: SearchSpace, phase: Phase, model: ModelSpec, gpu: GpuSpec, *,
                     calibration: Calibration | None = None) -> list[tuple[Topology, tuple[float, float]]]:
    """Every valid, fitting config of the phase with its predicted values at every concurrency level
    (calibration: a cluster's learnt factors instead of the GPU's documented ones)."""
    workload = space.phase_workload(phase)
    perf = RooflineModel(model, gpu, calibration)
    out = []
    for topo in space.expand(phase, model):
        if not compute_memory(model, gpu, topo, MemoryInputs.for_workload(workload)).fits:
            continue
        for m in predict_traffic(perf, topo, phase_role(phase), workload).points:
            out.append((topo, phase_values(phase, space.constraints.judge(m))))
    return out


def predicted_front_params(space: SearchSpace, phase: Phase, model: ModelSpec, gpu: GpuSpec, *,
                           pair_with_tps: frozenset[int] = frozenset(),
                           calibration: Calibration | None = None) -> list[dict[str, Any]]:
    """Configs on the predicted front, spread along it (alternating ends inward) so a small budget covers it.

    pair_with_tps: for hybrid models a PD pair needs equal TP on both sides, so the best predicted config of
    each TP already on the other phase's front comes first (otherwise nothing may compose).
    """
    points = predicted_points(space, phase, model, gpu, calibration=calibration)
    front = pareto_front(points, x=lambda p: p[1][0], y=lambda p: p[1][1])
    paired: list[Topology] = []
    for tp in sorted(pair_with_tps):
        curves: dict[Topology, list[tuple[float, float]]] = {}
        for topo, values in points:
            if topo.tp == tp:
                curves.setdefault(topo, []).append(values)
        if curves:
            paired.append(max(curves, key=lambda t: hypervolume_2d(curves[t], (0.0, 0.0))))
    configs: list[Topology] = []
    for topo, _ in front:
        if topo not in configs:
            configs.append(topo)
    order = []
    lo, hi = 0, len(configs) - 1
    while lo <= hi:
        order.append(configs[hi])
        if lo != hi:
            order.append(configs[lo])
        lo, hi = lo + 1, hi - 1
    return [space.params_of(phase, t) for t in [*paired, *(t for t in order if t not in paired)]]
