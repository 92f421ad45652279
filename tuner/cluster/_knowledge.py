"""What the tuner knows about a cluster from every study run on it: its calibration, per-layout offsets, crashes.

`learn` turns the stored runs (tuner.cluster._store) into a ClusterKnowledge: the simulator's bounded factors
refitted on every model's trials (tuner.cluster._fit), scored held out (leave one model out: each model's runs
predicted by a fit on the others, so the figure says what a new model can expect), jointly with a step-time factor
per parallel layout (the effects no model predicts: collective algorithms, rank placement; tuner.cluster._layout),
and the layout+flag combinations that crashed at launch. A new study's simulator prior and guided sampler start from it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tuner.backends.vllm import VllmVersion
from tuner.cluster._fit import (
    KERNEL_DEPENDENCE,
    FitSample,
    SharedFit,
    exercises,
    factor_group,
    fit_shared,
    group_label,
    joint_error,
    layouts_for,
    per_kind,
    prediction_error,
    spread,
)
from tuner.cluster._key import UNKNOWN, ClusterKey
from tuner.cluster._layout import LayoutFactors, LayoutKey, LayoutTrend, layout_key
from tuner.cluster._store import ClusterStore, StoredFailure, StoredRun
from tuner.errors import ConfigError, TopotuneError
from tuner.hardware import GpuSpec
from tuner.models import KernelKind, ModelSpec, load_model
from tuner.perf import Calibration, default_calibration
from tuner.topology import KNOBS, Role, Topology

#: How much a run of a model of another kernel kind counts in the per-layout offsets a new model takes (its
#: layout-dependent misfit of kernel factors is not the cluster's layout effect).
OTHER_KIND_LAYOUT_WEIGHT = 0.5
MAX_OFFSET = 0.5  # |log| cap of a transferred per-layout offset (x1.65): a prior, never a verdict
#: The fields of a launch that decide whether it starts on a cluster (layout and engine flags, not the model): the
#: knobs marked a risk in Topology. Every knob is one but stream_interval (the API server's output buffering: it
#: allocates nothing and starts nothing); max_cudagraph_capture_size is one (the graphs captured at start-up and
#: their memory).
RISK_FIELDS = tuple(name for name, knob in KNOBS.items() if knob.risk)


def risk_key(topo: Topology) -> tuple:
    return tuple(getattr(topo, f) for f in RISK_FIELDS)


@dataclass(frozen=True)
class LayoutOffset:
    """log(measured / predicted) of the two objectives on one parallel layout beyond its role's trend: minus its own
    part of the step-time factor (the same for both: a slower step lowers throughput and user speed alike)."""

    log_throughput: float
    log_user_speed: float
    models: int
    runs: int


@dataclass(frozen=True)
class KnownRisk:
    """A layout and its flags that failed to start on this cluster: which models it failed for, and how."""

    topology: Topology
    models: tuple[str, ...]
    status: str
    reason: str

    def note(self) -> str:
        return f"known risk on this cluster: {self.status} for {', '.join(self.models)}"


@dataclass(frozen=True)
class FactorEvidence:
    """What moved one factor: the runs of the fit that exercise it (tuner.cluster._fit.exercises), of how many
    models; for a kernel factor only those of the new model's kernel kind (`group` says which part of it)."""

    runs: int
    models: int
    group: str = "shared"


@dataclass(frozen=True)
class KernelFactor:
    """A kernel factor's value fitted for one group of kernel kinds (tuner.cluster._fit.KERNEL_DEPENDENCE): it
    transfers only to models of that group."""

    factor: str
    group: str  # e.g. "expert_weights=mxfp4"
    default: float
    learnt: float
    runs: int
    models: tuple[str, ...]


@dataclass(frozen=True)
class HeldOut:
    """The fit scored on runs it did not use (leave one model out): mean |log predicted/measured|."""

    method: str
    error_default: float  # the documented calibration on the same runs
    error_fitted: float
    models: int


@dataclass(frozen=True)
class ClusterKnowledge:
    key: ClusterKey
    default: Calibration
    calibration: Calibration
    factors: tuple[str, ...]  # those the fit could move
    runs: int
    models: tuple[str, ...]
    error_before: float  # in-sample, default calibration
    error_after: float  # in-sample, fitted
    layout_offsets: dict[LayoutKey, LayoutOffset] = field(default_factory=dict)
    risks: dict[tuple, KnownRisk] = field(default_factory=dict)
    failures: int = 0
    held_out: HeldOut | None = None
    trends: dict[str, LayoutTrend] = field(default_factory=dict)  # per role: the smooth part of the offsets
    evidence: dict[str, FactorEvidence] = field(default_factory=dict)  # per fitted factor
    kind: KernelKind | None = None  # the kernel kind the calibration is for (None: shared factors only)
    kernel_factors: tuple[KernelFactor, ...] = ()  # every kernel factor per group of kinds, whichever `kind` is
    guards: tuple[dict[str, Any], ...] = ()  # the transfer guard's verdicts on this cluster (GuardVerdict.as_json)
    offset_weight: float = 1.0  # how far the per-layout offsets apply (tuner.cluster._crosscheck: 0 to 1)
    pretrial: tuple[dict[str, Any], ...] = ()  # the cross-check's weight per transferred part (PartCheck.as_json)

    @property
    def empty(self) -> bool:
        return self.runs == 0 and not self.risks

    def moved(self) -> dict[str, tuple[float, float]]:
        """Each fitted factor: (default, learnt); without a kernel kind only the shared factors (the kernel ones
        are per group of kinds: kernel_factors)."""
        out = {}
        for name in self.factors:
            if self.kind is None and name in KERNEL_DEPENDENCE:
                continue
            before, after = getattr(self.default, name), getattr(self.calibration, name)
            out[name] = (float(self.default.prefill_flop_efficiency if before is None else before),
                         float(self.calibration.prefill_flop_efficiency if after is None else after))
        return out

    def offset(self, role: Role, topo: Topology) -> tuple[float, float]:
        """The prior log-factor of each objective on this layout: the role's trend over layout features plus
        the layout's own fitted part (0 where no model ran it), capped at MAX_OFFSET."""
        trend = self.trends.get(role.value)
        total = trend.at(topo) if trend is not None else np.zeros(2)
        found = self.layout_offsets.get(layout_key(role, topo))
        if found is not None:
            total = total + np.array([found.log_throughput, found.log_user_speed])
        x, y = np.clip(self.offset_weight * total, -MAX_OFFSET, MAX_OFFSET)
        return float(x), float(y)

    def risk(self, topo: Topology) -> KnownRisk | None:
        return self.risks.get(risk_key(topo))

    def as_json(self) -> dict[str, Any]:
        return {
            "cluster": self.key.name, "gpu_class": self.key.gpu_class, "interconnect": self.key.interconnect,
            "vllm_version": self.key.vllm_version, "kernel_family": self.key.kernel_family,
            "kernel_kind": None if self.kind is None else self.kind.label(),
            "runs": self.runs, "models": list(self.models), "launch_failures": self.failures,
            "factors": {n: {"default": a, "learnt": b, "moved_pct": 100.0 * (b / a - 1.0) if a else None,
                            "runs": self.evidence[n].runs if n in self.evidence else None,
                            "models": self.evidence[n].models if n in self.evidence else None,
                            "transfers_to": self.evidence[n].group if n in self.evidence else None}
                        for n, (a, b) in self.moved().items()},
            "error_in_sample": {"default": _finite(self.error_before), "fitted": _finite(self.error_after)},
            "held_out": None if self.held_out is None else {
                "method": self.held_out.method, "models": self.held_out.models,
                "error_default": _finite(self.held_out.error_default),
                "error_fitted": _finite(self.held_out.error_fitted)},
            "kernel_factors": [{"factor": f.factor, "transfers_to": f.group, "default": f.default,
                                "learnt": f.learnt, "runs": f.runs, "models": list(f.models)}
                               for f in self.kernel_factors],
            "guards": list(self.guards),
            "pretrial_checks": list(self.pretrial),
            "layout_offsets": [{"role": k[0], "tp": k[1], "dp": k[2], "ep": k[3], "mtp": k[4],
                                "log_throughput": v.log_throughput, "log_user_speed": v.log_user_speed,
                                "models": v.models, "runs": v.runs} for k, v in sorted(self.layout_offsets.items())],
            "known_risks": [{"topology": r.topology.label(), "models": list(r.models), "status": r.status,
                             "reason": r.reason} for r in self.risks.values()],
        }


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else x


ModelLoader = Callable[[StoredRun], ModelSpec]


def _load(run: StoredRun) -> ModelSpec:
    return load_model(run.model_path)


def samples_of(runs: Sequence[StoredRun], load: ModelLoader = _load) -> list[FitSample]:
    """Runs whose model can still be read (a moved checkpoint drops its runs, not the whole store)."""
    models: dict[str, ModelSpec | None] = {}
    out = []
    for r in runs:
        if r.role is Role.BOTH or not r.points:
            continue  # an aggregated instance mixes both roles' factors: not fitted yet
        if r.model_path not in models:
            try:
                models[r.model_path] = load(r)
            except (TopotuneError, OSError):
                models[r.model_path] = None
        model = models[r.model_path]
        if model is not None:
            out.append(FitSample(model, r.topology, r.role, r.workload, r.points))
    return out


def learn(key: ClusterKey, gpu: GpuSpec, runs: Sequence[StoredRun], failures: Sequence[StoredFailure] = (), *,
          held_out: bool = False, load: ModelLoader = _load, start: Calibration | None = None,
          kind: KernelKind | None = None) -> ClusterKnowledge:
    """Fit the cluster's calibration on every run, then the per-layout offsets left over; `held_out` also scores
    the procedure leaving each model out (one more fit per model: for `topotune calibrate`, not a study start).
    kind: the kernel kind of the model that will use it (tuner.models.kernel_kind): its kernel factors come from
    models of its kind only (the documented default where none ran); None: every kernel factor at the default."""
    default = start or default_calibration(gpu.name)
    learnt = learn_samples(key, gpu, samples_of(runs, load), default, kind, held_out=held_out)
    return dataclasses.replace(learnt, risks=_risks(failures), failures=len(failures))


def learn_samples(key: ClusterKey, gpu: GpuSpec, samples: Sequence[FitSample], default: Calibration,
                  kind: KernelKind | None, *, held_out: bool = False) -> ClusterKnowledge:
    """learn, from runs already read (no launch failures): what tuner.cluster._crosscheck refits per fold."""
    models = tuple(dict.fromkeys(s.model.name for s in samples))
    if not samples:
        return ClusterKnowledge(key, default, default, (), 0, models, math.nan, math.nan, {}, {}, 0)
    fit = fit_shared(samples, gpu, default)
    offsets, trends = _offsets(layouts_for(fit, samples, gpu, kind, OTHER_KIND_LAYOUT_WEIGHT))
    scored = _held_out(samples, gpu, default) if held_out and len(models) > 1 else None
    return ClusterKnowledge(key, default, fit.for_kind(kind), fit.factors, len(samples), models, fit.error_before,
                            fit.error_after, offsets, {}, 0, scored, trends,
                            factor_evidence(samples, fit.factors, kind), kind, kernel_factors(fit, samples))


def kernel_factors(fit: SharedFit, samples: Sequence[FitSample]) -> tuple[KernelFactor, ...]:
    """Each kernel factor the fit moved per group, with the runs and models of that group behind it."""
    used = spread(samples)
    out = []
    for (name, group), value in fit.values.items():
        if not group:
            continue
        mine = [s for s in used if exercises(s, name) and factor_group(name, s.kind) == group]
        out.append(KernelFactor(name, group_label(name, group), fit.start.factor(name), value, len(mine),
                                tuple(dict.fromkeys(s.model.name for s in mine))))
    return tuple(out)


def factor_evidence(samples: Sequence[FitSample], factors: Sequence[str],
                    kind: KernelKind | None = None) -> dict[str, FactorEvidence]:
    """Per factor: the runs the fit used (tuner.cluster._fit.spread) that exercise it, and their models; for a
    kernel factor only the runs of `kind`'s group (none without a kind: it stays at the default)."""
    used = spread(samples)
    out = {}
    for name in factors:
        runs = [s for s in used if exercises(s, name)]
        group = "shared"
        if name in KERNEL_DEPENDENCE:
            mine = factor_group(name, kind) if kind is not None else None
            runs = [s for s in runs if mine is not None and factor_group(name, s.kind) == mine]
            group = group_label(name, mine) if mine is not None else "none (no kernel kind given)"
        out[name] = FactorEvidence(len(runs), len({s.model.name for s in runs}), group)
    return out


def _held_out(samples: Sequence[FitSample], gpu: GpuSpec, default: Calibration) -> HeldOut:
    """Leave one model out: fit on the other models' runs, score on the left-out model's (then average); the
    fitted side is what its study's prior would predict, the learnt layout factors included."""
    errors_default, errors_fitted = [], []
    names = list(dict.fromkeys(s.model.name for s in samples))
    for name in names:
        train = [s for s in samples if s.model.name != name]
        test = [s for s in samples if s.model.name == name]
        fit = fit_shared(train, gpu, default)
        kind = test[0].kind
        errors_default.append(prediction_error(test, gpu, default))
        errors_fitted.append(joint_error(test, gpu, per_kind(fit),
                                         layouts_for(fit, train, gpu, kind, OTHER_KIND_LAYOUT_WEIGHT)))
    return HeldOut("leave-one-model-out", float(np.nanmean(errors_default)), float(np.nanmean(errors_fitted)),
                   len(names))


def _offsets(layouts: LayoutFactors) -> tuple[dict[LayoutKey, LayoutOffset], dict[str, LayoutTrend]]:
    """The fitted log step-time factors as the prior's log-factors of the two objectives (a step exp(s) slower
    divides both by exp(s))."""
    trends = {role: LayoutTrend(-np.column_stack([beta, beta])) for role, beta in layouts.trend.items()}
    offsets = {k: LayoutOffset(-v, -v, layouts.models[k], layouts.runs[k]) for k, v in layouts.own.items()}
    return offsets, trends


def _risks(failures: Sequence[StoredFailure]) -> dict[tuple, KnownRisk]:
    grouped: dict[tuple, list[StoredFailure]] = {}
    for f in failures:
        if f.transferable:
            grouped.setdefault(risk_key(f.topology), []).append(f)
    return {k: KnownRisk(v[0].topology, tuple(dict.fromkeys(f.model_name for f in v)), v[0].status.value,
                         v[-1].reason) for k, v in grouped.items()}


@dataclass(frozen=True)
class RiskMatch:
    """A planned instance whose layout and flags crashed on a matching cluster key."""

    key: ClusterKey
    topology: Topology  # as planned
    risk: KnownRisk

    def warning(self) -> str:
        return (f"warning: {self.topology.role.value} {self.topology.label()} is a known risk on cluster "
                f"{self.key.name} (vLLM {self.key.vllm_version}): {self.risk.status} for "
                f"{', '.join(self.risk.models)} (last: {self.risk.reason.strip()[:200] or 'no reason recorded'})")


def planned_risks(store: ClusterStore, topologies: Sequence[Topology], *, gpu_class: str,
                  vllm_version: str | None = None, cluster: str | None = None) -> list[RiskMatch]:
    """Which planned instances repeat a known crash: on every key of this GPU class (and cluster name, when
    given) whose vLLM is the planned one or was not pinned by its studies (recorded as unknown)."""
    out = []
    for key in store.clusters():
        if key.gpu_class != gpu_class or (cluster is not None and key.name != cluster):
            continue
        if vllm_version is not None and key.vllm_version != UNKNOWN and not _same_vllm(key.vllm_version, vllm_version):
            continue
        risks = _risks(store.read_failures(key))
        for topo in dict.fromkeys(topologies):
            found = risks.get(risk_key(topo))
            if found is not None:
                out.append(RiskMatch(key, topo, found))
    return out


def _same_vllm(recorded: str, planned: str) -> bool:
    """One vLLM release as the version table reads it (tuner.backends.vllm's VllmVersion: 0.26.1rc1 is 0.26.1);
    a recorded version that does not read as one matches only itself."""
    try:
        return VllmVersion.parse(recorded) == VllmVersion.parse(planned, field_name="vllm_version")
    except ConfigError:
        return recorded.lstrip("v") == planned.lstrip("v")


def load_knowledge(store: ClusterStore, key: ClusterKey, gpu: GpuSpec, *, held_out: bool = False,
                   load: ModelLoader = _load, kind: KernelKind | None = None) -> ClusterKnowledge:
    learnt = learn(key, gpu, store.read_runs(key), store.read_failures(key), held_out=held_out, load=load, kind=kind)
    return dataclasses.replace(learnt, guards=tuple(store.read_guards(key)))
