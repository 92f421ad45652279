"""One calibration for a cluster from the trials of many models: bounded least squares in log space, held out.

tuner.perf.fit_calibration fits one model's sweep; a cluster's factors are shared by every model that ran on it,
so here the residuals of every stored run (each predicted with its own model) go into one fit. The fit is joint with
the cluster's per-layout step-time factors (tuner.cluster._layout): at each trial calibration the layout factors are
refitted to what is left (a cheap linear step), and the calibration is scored on the rest, so a layout's own
slowness is not pushed into a factor every layout shares, nor the other way round. Factors a role does not exercise
are left alone (prefill trials say nothing about the decode step), and every factor is pulled gently towards where
it started (a ridge term in log space), so a factor the trials cannot pin down stays at its documented default
instead of wandering to a bound.

A factor that measures a kernel (KERNEL_DEPENDENCE: GEMM and attention efficiencies) is fitted once per value of
what that kernel depends on (tuner.models.kernel_kind: weight and KV precision, expert GEMM backend, attention
kind), each value only from the runs of models that share it; the rest (network, per-step and per-request costs)
is one value fitted from every run. A model then takes the kernel factors of its own kind, or the documented
default where no model of its kind ran (SharedFit.for_kind).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from tuner.cluster._layout import LayoutFactors, LayoutObservation, fit_layout_factors, layout_key
from tuner.errors import TopotuneError
from tuner.hardware import GpuSpec
from tuner.metrics import ServingMetrics
from tuner.models import KernelKind, ModelSpec, kernel_kind
from tuner.perf import FITTABLE_FACTORS, Calibration, RooflineModel, factor_range, predict_traffic
from tuner.topology import Role, Topology
from tuner.workload import Workload

#: Factors each role's trials exercise (docs/perf-model.md): prefill moves compute and the request's fixed
#: costs; decode moves bandwidth, the per-step and per-request costs and MTP.
ROLE_FACTORS: dict[Role, tuple[str, ...]] = {
    Role.PREFILL: ("prefill_flop_efficiency", "attention_flop_efficiency", "request_overhead_ms",
                   "tokenize_us_per_token", "moe_gemm_efficiency", "alltoall_bw_efficiency",
                   "allreduce_bw_efficiency"),
    Role.DECODE: ("hbm_efficiency", "flop_efficiency", "kernel_latency_us", "step_overhead_ms", "request_step_us",
                  "mtp_acceptance", "alltoall_latency_us", "allreduce_latency_us", "expert_popularity_cv",
                  "kv_occupancy"),
}
#: What each kernel factor measured, as KernelKind fields: it transfers only between models that agree on them.
#: Factors not listed (collectives, per-step, per-request and per-token costs, scheduler behaviour) are the
#: cluster's and host's whatever the model, and carry to every model.
KERNEL_DEPENDENCE: dict[str, tuple[str, ...]] = {
    "hbm_efficiency": ("dense_weights", "expert_weights", "kv_cache"),  # weight and KV streaming kernels
    "flop_efficiency": ("dense_weights", "expert_weights"),  # decode GEMMs
    "prefill_flop_efficiency": ("dense_weights", "expert_weights", "attention"),  # chunked GEMMs (+GDN kernels)
    "attention_flop_efficiency": ("attention", "kv_cache"),
    "moe_gemm_efficiency": ("expert_weights",),
    "fp8_gemm_efficiency": ("dense_weights", "expert_weights"),
}
RIDGE_SD = 0.35  # log-sd of the pull towards the starting value (a factor moves x1.4 at 1 sd)
MAX_RUNS = 48  # runs per fit (spread over models): the fit stays ~1 s on one core
_BOUNDS = {"mtp_acceptance": (0.01, 0.99)}


@dataclass(frozen=True)
class FitSample:
    """One measured run with the model it ran: what the fit compares predictions with."""

    model: ModelSpec
    topology: Topology
    role: Role
    workload: Workload
    points: tuple[ServingMetrics, ...]

    @property
    def kind(self) -> KernelKind:
        return kernel_kind(self.model)


Group = tuple[str, ...]  # the values of a factor's KERNEL_DEPENDENCE fields (() for a shared factor)


def factor_group(factor: str, kind: KernelKind) -> Group:
    """The part of a kernel kind that one factor's value belongs to."""
    return tuple(getattr(kind, f) for f in KERNEL_DEPENDENCE.get(factor, ()))


def group_label(factor: str, group: Group) -> str:
    """How a factor's group reads: "shared" or e.g. "expert_weights=mxfp4"."""
    fields = KERNEL_DEPENDENCE.get(factor, ())
    return ", ".join(f"{f}={v}" for f, v in zip(fields, group, strict=True)) or "shared"


@dataclass(frozen=True)
class SharedFit:
    start: Calibration
    values: dict[tuple[str, Group], float]  # (factor, its group) -> fitted value
    factors: tuple[str, ...]
    runs_used: int
    error_before: float  # mean |log predicted/measured| on the runs it used, at the start calibration alone
    error_after: float  # the same with the fitted calibration and layout factors (what a study's prior predicts)
    layouts: LayoutFactors  # fitted on every sample (not only the runs_used) at the fitted calibration

    def for_kind(self, kind: KernelKind | None) -> Calibration:
        """The calibration a model of this kind takes: every shared factor fitted, each kernel factor fitted on
        its own group's runs, the start value where none of its group ran (kind None: shared factors only)."""
        update = {}
        for (name, group), value in self.values.items():
            if not group or (kind is not None and group == factor_group(name, kind)):
                update[name] = value
        return self.start.model_copy(update=update) if update else self.start

    @property
    def calibration(self) -> Calibration:
        """The shared factors fitted, every kernel factor at its start value."""
        return self.for_kind(None)


_EP_FACTORS = frozenset({"alltoall_bw_efficiency", "alltoall_latency_us", "expert_popularity_cv"})


def exercises(sample: FitSample, factor: str) -> bool:
    """Whether a run says anything about a factor: its role's factors, MTP acceptance only with MTP on, the
    all-to-all and expert imbalance only with EP on."""
    if factor not in ROLE_FACTORS.get(sample.role, ()):
        return False
    if factor == "mtp_acceptance":
        return sample.topology.mtp > 0
    return sample.topology.ep or factor not in _EP_FACTORS


def fittable_factors(samples: Sequence[FitSample], start: Calibration) -> tuple[str, ...]:
    """The factors at least one sample exercises, in ROLE_FACTORS order."""
    names = [f for role in (Role.PREFILL, Role.DECODE) for f in ROLE_FACTORS[role]]
    return tuple(f for f in names if f in FITTABLE_FACTORS and any(exercises(s, f) for s in samples))


def fitted_parameters(samples: Sequence[FitSample], names: Sequence[str]) -> list[tuple[str, Group]]:
    """One parameter per (factor, group) that some sample exercises: a shared factor once, a kernel factor once per
    value of what it depends on."""
    out: list[tuple[str, Group]] = []
    kinds = {id(s): s.kind for s in samples}
    for name in names:
        groups = dict.fromkeys(factor_group(name, kinds[id(s)]) for s in samples if exercises(s, name))
        out += [(name, g) for g in groups]
    return out


CalibrationOf = Callable[[FitSample], Calibration]


def _constant(calibration: Calibration) -> CalibrationOf:
    return lambda _sample: calibration


def per_kind(fit: SharedFit) -> CalibrationOf:
    """Each sample at its own kind's calibration (how the fit predicts it)."""
    cache: dict[KernelKind, Calibration] = {}

    def of(sample: FitSample) -> Calibration:
        kind = sample.kind
        if kind not in cache:
            cache[kind] = fit.for_kind(kind)
        return cache[kind]
    return of


@dataclass(frozen=True)
class _Rows:
    """log(predicted / measured) of the request rate and the role's latency (TTFT or ITL), every level, with the
    sample each row came from and its sign (+1 rate, -1 latency: a step-time factor f gives sign * log f)."""

    values: np.ndarray
    sample: np.ndarray
    sign: np.ndarray


def _rows(samples: Sequence[FitSample], gpu: GpuSpec, calibration: Calibration | CalibrationOf) -> _Rows:
    of = _constant(calibration) if isinstance(calibration, Calibration) else calibration
    values: list[float] = []
    index: list[int] = []
    perfs: dict[str, RooflineModel] = {}
    for j, s in enumerate(samples):
        perf = perfs.get(s.model.name)
        if perf is None:
            perf = perfs[s.model.name] = RooflineModel(s.model, gpu, of(s))
        try:
            predicted = predict_traffic(perf, s.topology, s.role, s.workload).points
        except TopotuneError:
            continue  # the memory model no longer fits it (another calibration's KV share): no information
        for p, m in zip(predicted, s.points, strict=False):
            latency_p, latency_m = ((p.itl_ms_mean, m.itl_ms_mean) if s.role is Role.DECODE
                                    else (p.ttft_ms_mean, m.ttft_ms_mean))
            if m.request_throughput_rps > 0 and latency_m > 0 and p.request_throughput_rps > 0 and latency_p > 0:
                values += [math.log(p.request_throughput_rps / m.request_throughput_rps),
                           math.log(latency_p / latency_m)]
                index += [j, j]
    return _Rows(np.array(values), np.array(index, dtype=int), np.tile([1.0, -1.0], len(values) // 2))


def log_ratios(samples: Sequence[FitSample], gpu: GpuSpec, calibration: Calibration | CalibrationOf) -> np.ndarray:
    """log(predicted / measured) of the request rate and the role's latency (TTFT or ITL), every level."""
    return _rows(samples, gpu, calibration).values


def _layout_fit(samples: Sequence[FitSample], rows: _Rows, weight: dict[str, float] | None = None) -> LayoutFactors:
    """weight: per model name, how much its runs count (default 1)."""
    observations = []
    for j in np.unique(rows.sample):
        mine = rows.sample == j
        s = samples[j]
        observations.append(LayoutObservation(layout_key(s.role, s.topology), s.topology, s.model.name,
                                              float(np.mean(rows.sign[mine] * rows.values[mine]))))
    return fit_layout_factors(observations, weight)


def _left(samples: Sequence[FitSample], rows: _Rows, layouts: LayoutFactors) -> np.ndarray:
    """What the layout factors leave of each row."""
    steps = np.array([layouts.log_step(samples[j].role, samples[j].topology) for j in rows.sample])
    return rows.values - rows.sign * steps if len(rows.values) else rows.values


def joint_error(samples: Sequence[FitSample], gpu: GpuSpec, calibration: Calibration | CalibrationOf,
                layouts: LayoutFactors | None = None) -> float:
    """Mean |log predicted/measured| once the layout factors apply (refitted on `samples` unless given)."""
    rows = _rows(samples, gpu, calibration)
    if not len(rows.values):
        return math.nan
    left = _left(samples, rows, layouts if layouts is not None else _layout_fit(samples, rows))
    return float(np.mean(np.abs(left)))


def prediction_error(samples: Sequence[FitSample], gpu: GpuSpec, calibration: Calibration | CalibrationOf) -> float:
    """Mean |log predicted/measured| over rate and latency of every level: 0.10 is ~10% off."""
    ratios = log_ratios(samples, gpu, calibration)
    return float(np.mean(np.abs(ratios))) if len(ratios) else math.nan


def spread(samples: Sequence[FitSample], limit: int = MAX_RUNS) -> list[FitSample]:
    """At most `limit` runs, taken round-robin over models so no model dominates the fit."""
    by_model: dict[str, list[FitSample]] = {}
    for s in samples:
        by_model.setdefault(s.model.name, []).append(s)
    out: list[FitSample] = []
    queues = [list(v) for v in by_model.values()]
    while len(out) < limit and any(queues):
        for q in queues:
            if q and len(out) < limit:
                out.append(q.pop(0))
    return out


def fit_shared(samples: Sequence[FitSample], gpu: GpuSpec, start: Calibration) -> SharedFit:
    """The calibration (shared factors, and kernel factors per group) and layout factors that best explain every
    sample (bounded, ridge towards `start`)."""
    from scipy.optimize import least_squares  # heavy: only when fitting

    used = spread(samples)
    names = fittable_factors(used, start)
    params = fitted_parameters(used, names)
    before = prediction_error(used, gpu, start)
    if not params or not used:
        return SharedFit(start, {}, (), len(used), before, before, _layout_fit(samples, _rows(samples, gpu, start)))
    lo = np.array([math.log(_bounds(n)[0]) for n, _ in params])
    hi = np.array([math.log(_bounds(n)[1]) for n, _ in params])
    x0 = np.array([math.log(_start(start, n)) for n, _ in params])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)

    def fitted(x: np.ndarray) -> SharedFit:
        values = {p: float(math.exp(v)) for p, v in zip(params, x, strict=True)}
        return SharedFit(start, values, names, len(used), before, math.nan, _EMPTY)

    def residuals(x: np.ndarray) -> np.ndarray:
        rows = _rows(used, gpu, per_kind(fitted(x)))
        data = _left(used, rows, _layout_fit(used, rows)) if len(rows.values) else rows.values
        ridge = (x - x0) / RIDGE_SD
        return np.concatenate([data, ridge])

    result = least_squares(residuals, x0, bounds=(lo, hi), diff_step=1e-3, max_nfev=12 * len(params))
    fit = fitted(result.x)
    # validated per kind (a value outside a field's range raises here, not in a study)
    for kind in {s.kind for s in used}:
        Calibration.model_validate(fit.for_kind(kind).model_dump())
    after, at_start = joint_error(used, gpu, per_kind(fit)), joint_error(used, gpu, start)
    if not after <= at_start:  # never worse than the start on the data it saw
        fit, after = SharedFit(start, {}, names, len(used), before, math.nan, _EMPTY), at_start
    of = per_kind(fit)
    return SharedFit(start, fit.values, names, len(used), before, after, _layout_fit(samples, _rows(samples, gpu, of)))


def layouts_for(fit: SharedFit, samples: Sequence[FitSample], gpu: GpuSpec, kind: KernelKind | None,
                other_kind_weight: float) -> LayoutFactors:
    """The fit's layout factors as a model of `kind` takes them: runs of models of another kind count
    `other_kind_weight` (what is left of their runs after the calibration also holds their kernels' own misfit)."""
    if kind is None or other_kind_weight == 1.0:
        return fit.layouts
    weight = {s.model.name: 1.0 if s.kind == kind else other_kind_weight for s in samples}
    return _layout_fit(samples, _rows(samples, gpu, per_kind(fit)), weight)


_EMPTY = LayoutFactors({}, {}, {}, {})


def _start(start: Calibration, name: str) -> float:
    return max(start.factor(name), 1e-6)


def _bounds(name: str) -> tuple[float, float]:
    """The field's own range, a zero lower bound raised (and an open upper one capped) so the log is finite."""
    if name in _BOUNDS:
        return _BOUNDS[name]
    low, high = factor_range(name)
    return max(low, 1e-3), min(high, 1e4)
