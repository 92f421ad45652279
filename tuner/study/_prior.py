"""What the simulator says before any trial: every launchable config of a phase, encoded, with its predicted curve.

The guided sampler (tuner/study/_guided.py) searches this finite set: the memory model already tells which
configs can start, so proposing anything else wastes an ask. Predictions use the tuner's own performance model
with its documented calibration; the sampler learns how far the cluster is from it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tuner.hardware import GpuSpec
from tuner.memory import MemoryInputs, compute_memory
from tuner.metrics import ServingMetrics
from tuner.models import ModelSpec
from tuner.perf import Calibration, RooflineModel, predict_traffic
from tuner.space import Phase, SearchSpace
from tuner.study._objectives import phase_values
from tuner.study._records import is_feasible, point_constraints
from tuner.topology import Topology
from tuner.workload import Workload

#: Knobs describing the parallel layout (a cluster's deviations from the model mostly follow these);
#: the rest are engine knobs. The residual model gives each group its own length scale.
LAYOUT_KNOBS = ("tp", "dp", "ep", "mtp", "num_redundant_experts")
EP_SIZE_FEATURE = "ep_size"  # derived layout feature: log2 of the EP group's size, 0 without EP


def params_key(params: dict[str, Any]) -> tuple:
    return tuple(sorted((k, v) for k, v in params.items() if k != "concurrency"))


@dataclass(frozen=True)
class SimulatorPrior:
    """Candidates (launchable configs) of one phase with ordinal features and predicted objectives per level.

    features: (configs, knobs) in [0, 1], each knob's position in its ordered list of choices (tp 1 < 2 < 4 ...),
      knobs with a single choice left out, then (where EP is a knob) the EP group's size, derived; layout: which
      feature columns are layout knobs.
    predicted: (configs, levels, 2) objectives at each concurrency level of the workload; feasible: (configs,
      levels) the predicted point meets the space's latency limits.
    group: (configs,) the parallel layout of each config (configs sharing every layout knob share an id): the
      residual model gives each layout its own random effect.
    """

    phase: Phase
    names: tuple[str, ...]
    choices: dict[str, list]
    candidates: list[dict[str, Any]]
    features: np.ndarray
    layout: np.ndarray
    levels: tuple[float, ...]  # the workload's load levels: clients (closed loop) or requests/s (open loop)
    predicted: np.ndarray
    feasible: np.ndarray
    group: np.ndarray

    @classmethod
    def build(cls, space: SearchSpace, phase: Phase, model: ModelSpec, gpu: GpuSpec, *,
              calibration: Calibration | None = None, offset: Callable[[Topology], tuple[float, float]] | None = None,
              skip: Callable[[Topology], bool] | None = None) -> SimulatorPrior:
        """calibration: the model's factors (default: the GPU's documented ones; a cluster's learnt ones when
        tuner.cluster knows it); offset: a prior log-factor per objective of a config (the cluster's per-layout
        residual, bounded), which the residual model then corrects like any other prediction error; skip: configs
        left out (layouts and flags known to crash on this cluster)."""
        workload = space.phase_workload(phase)
        choices = space.param_choices(phase)
        perf = RooflineModel(model, gpu, calibration)
        candidates, predicted, feasible = [], [], []
        for topo in space.expand(phase, model):
            if not compute_memory(model, gpu, topo, MemoryInputs.for_workload(workload)).fits:
                continue
            if skip is not None and skip(topo):
                continue
            curve = _at_levels(predict_traffic(perf, topo, topo.role, workload).points, workload)
            dx, dy = offset(topo) if offset is not None else (0.0, 0.0)
            candidates.append(_params_of(topo, choices))
            # a saturated open-loop level has no point: infeasible, and no objective worth a trial
            predicted.append([_shifted(phase_values(phase, space.constraints.judge(m)), dx, dy) if m else [0.0, 0.0]
                              for m in curve])
            feasible.append([m is not None and is_feasible(point_constraints(space.constraints.judge(m),
                                                                             space.constraints, None))
                             for m in curve])
        varied = [k for k, v in choices.items() if len(v) > 1]
        layouts: dict[tuple, int] = {}
        group = [layouts.setdefault(tuple(c[k] for k in LAYOUT_KNOBS if k in c), len(layouts)) for c in candidates]
        features = np.array([[_position(choices[k], c[k]) for k in varied] for c in candidates], dtype=float)
        features = features.reshape(len(candidates), len(varied))
        names, layout = list(varied), [k in LAYOUT_KNOBS for k in varied]
        if "ep" in varied:
            # the EP group's size (log2 of tp x dp with EP, 0 without): all-to-all and expert load imbalance grow
            # with it (docs/perf-model.md), so a deficit measured on one EP size carries to that size, not to
            # every layout of the same dp (decode, held-out truths: docs/benchmarks/sample-efficiency.md)
            size = np.array([np.log2(c.get("tp", 1) * c.get("dp", 1)) if c["ep"] else 0.0 for c in candidates])
            features = np.hstack([features, (size / max(1.0, float(size.max(initial=0.0))))[:, None]])
            names.append(EP_SIZE_FEATURE)
            layout.append(True)
        return cls(phase=phase, names=tuple(names), choices=choices, candidates=candidates, features=features,
                   layout=np.array(layout), levels=workload.levels,
                   predicted=np.maximum(np.array(predicted, dtype=float), 1e-9), feasible=np.array(feasible),
                   group=np.array(group, dtype=int))

    def index(self) -> dict[tuple, int]:
        return {params_key(c): i for i, c in enumerate(self.candidates)}


def _at_levels(points: Sequence[ServingMetrics], workload: Workload) -> list[ServingMetrics | None]:
    """The points in the order of the workload's levels, None where a level came back saturated."""
    by_level = {m.load: m for m in points}
    return [by_level.get(level) for level in workload.levels]


def _shifted(values: tuple[float, float], dx: float, dy: float) -> tuple[float, float]:
    """Objectives moved by a prior log-factor each (the cluster's per-layout residual)."""
    return values[0] * float(np.exp(dx)), values[1] * float(np.exp(dy))


def _params_of(topo: Topology, choices: dict[str, list]) -> dict[str, Any]:
    """The knob values of a topology, each one of its choices (a value the topology forces, such as EP off on one
    GPU, maps to the nearest choice, which the space maps back to the same topology)."""
    out = {}
    for name, options in choices.items():
        value = getattr(topo, name)
        out[name] = value if value in options else options[_nearest(options, value)]
    return out


def _nearest(options: list, value: Any) -> int:
    if isinstance(value, str) or any(isinstance(o, str) for o in options):
        return 0
    return min(range(len(options)), key=lambda j: abs(float(options[j]) - float(value)))


def _position(options: list, value: Any) -> float:
    i = options.index(value) if value in options else _nearest(options, value)
    return i / (len(options) - 1)
