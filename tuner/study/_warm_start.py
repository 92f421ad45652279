"""Warm start: the simulator's predicted front of a phase, as params enqueued (once) before the sampler starts."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna

from tuner.frontier import hypervolume_2d, pareto_front
from tuner.hardware import GpuSpec
from tuner.memory import MemoryInputs, compute_memory
from tuner.models import ModelSpec
from tuner.perf import Calibration, RooflineModel, predict_traffic
from tuner.space import Phase, SearchSpace, phase_role
from tuner.study._objectives import phase_values
from tuner.study._options import TuneOptions
from tuner.study._trial_record import StudyFlag, TrialAttrs, set_study_flag, study_flag
from tuner.topology import Topology


def predicted_points(space: SearchSpace, phase: Phase, model: ModelSpec, gpu: GpuSpec, *,
                     calibration: Calibration | None = None, skip: Callable[[Topology], bool] | None = None
                     ) -> list[tuple[Topology, tuple[float, float]]]:
    """Every valid, fitting config of the phase with its predicted values at every concurrency level
    (calibration: a cluster's learnt factors instead of the GPU's documented ones; skip: configs left out, the
    cluster's known risks)."""
    workload = space.phase_workload(phase)
    perf = RooflineModel(model, gpu, calibration)
    out = []
    for topo in space.expand(phase, model):
        if skip is not None and skip(topo):
            continue
        if not compute_memory(model, gpu, topo, MemoryInputs.for_workload(workload)).fits:
            continue
        for m in predict_traffic(perf, topo, phase_role(phase), workload).points:
            out.append((topo, phase_values(phase, space.constraints.judge(m))))
    return out


def predicted_front_params(space: SearchSpace, phase: Phase, model: ModelSpec, gpu: GpuSpec, *,
                           pair_with_tps: frozenset[int] = frozenset(),
                           calibration: Calibration | None = None,
                           skip: Callable[[Topology], bool] | None = None) -> list[dict[str, Any]]:
    """Configs on the predicted front, spread along it (alternating ends inward) so a small budget covers it.

    pair_with_tps: where vLLM refuses some PD pairs of different TPs (a hybrid model's TP-dependent block size,
    tuner.study._campaign.pairing_limits_tp), the best predicted config of each TP already on the other phase's
    front comes first: an equal TP pairs (otherwise nothing may compose). skip: configs never enqueued (a known
    crash on this cluster).
    """
    points = predicted_points(space, phase, model, gpu, calibration=calibration, skip=skip)
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


def enqueue_warm_start(study: optuna.Study, options: TuneOptions, sampler_name: str,
                       front_params: Callable[[], list[dict[str, Any]]] | None,
                       pair_with_tps: frozenset[int]) -> None:
    """Enqueue the simulator's predicted front, once per study (not again on resume)."""
    if options.warm_start and front_params and not study_flag(study, StudyFlag.WARM_STARTED):
        budget = options.warm_start_trials or max(1, options.trials // 4)
        if sampler_name == "guided":  # it starts from the predicted front itself: enqueue PD pairs only
            budget = min(budget, len(pair_with_tps))
        for params in front_params()[:budget]:
            study.enqueue_trial(params, user_attrs=TrialAttrs(warm_start="simulator").user_attrs())
        set_study_flag(study, StudyFlag.WARM_STARTED)
