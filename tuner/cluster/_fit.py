"""One calibration for a cluster from the trials of many models: bounded least squares in log space, held out.

tuner.perf.fit_calibration fits one model's sweep; a cluster's factors are shared by every model that ran on it,
so here the residuals of every stored run (each predicted with its own model) go into one fit. The fit is joint with
the cluster's per-layout step-time factors (tuner.cluster._layout): at each trial calibration the layout factors are
refitted to what is left (a cheap linear step), and the calibration is scored on the rest, so a layout's own
slowness is not pushed into a factor every layout shares, nor the other way round. Factors a role does not exercise
are left alone (prefill trials say nothing about the decode step), and every factor is pulled gently towards where
it started (a ridge term in log space), so a factor the trials cannot pin down stays at its documented default
instead of wandering to a bound.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner.cluster._layout import LayoutFactors, LayoutObservation, fit_layout_factors, layout_key
from tuner.errors import TopotuneError
from tuner.hardware import GpuSpec
from tuner.metrics import ServingMetrics
from tuner.models import ModelSpec
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


@dataclass(frozen=True)
class SharedFit:
    calibration: Calibration
    factors: tuple[str, ...]
    runs_used: int
    error_before: float  # mean |log predicted/measured| on the runs it used, at the start calibration alone
    error_after: float  # the same with the fitted calibration and layout factors (what a study's prior predicts)
    layouts: LayoutFactors  # fitted on every sample (not only the runs_used) at the fitted calibration


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


@dataclass(frozen=True)
class _Rows:
    """log(predicted / measured) of the request rate and the role's latency (TTFT or ITL), every level, with the
    sample each row came from and its sign (+1 rate, -1 latency: a step-time factor f gives sign * log f)."""

    values: np.ndarray
    sample: np.ndarray
    sign: np.ndarray


def _rows(samples: Sequence[FitSample], gpu: GpuSpec, calibration: Calibration) -> _Rows:
    values: list[float] = []
    index: list[int] = []
    perfs: dict[str, RooflineModel] = {}
    for j, s in enumerate(samples):
        perf = perfs.get(s.model.name)
        if perf is None:
            perf = perfs[s.model.name] = RooflineModel(s.model, gpu, calibration)
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


def log_ratios(samples: Sequence[FitSample], gpu: GpuSpec, calibration: Calibration) -> np.ndarray:
    """log(predicted / measured) of the request rate and the role's latency (TTFT or ITL), every level."""
    return _rows(samples, gpu, calibration).values


def _layout_fit(samples: Sequence[FitSample], rows: _Rows) -> LayoutFactors:
    observations = []
    for j in np.unique(rows.sample):
        mine = rows.sample == j
        s = samples[j]
        observations.append(LayoutObservation(layout_key(s.role, s.topology), s.topology, s.model.name,
                                              float(np.mean(rows.sign[mine] * rows.values[mine]))))
    return fit_layout_factors(observations)


def _left(samples: Sequence[FitSample], rows: _Rows, layouts: LayoutFactors) -> np.ndarray:
    """What the layout factors leave of each row."""
    steps = np.array([layouts.log_step(samples[j].role, samples[j].topology) for j in rows.sample])
    return rows.values - rows.sign * steps if len(rows.values) else rows.values


def joint_error(samples: Sequence[FitSample], gpu: GpuSpec, calibration: Calibration,
                layouts: LayoutFactors | None = None) -> float:
    """Mean |log predicted/measured| once the layout factors apply (refitted on `samples` unless given)."""
    rows = _rows(samples, gpu, calibration)
    if not len(rows.values):
        return math.nan
    left = _left(samples, rows, layouts if layouts is not None else _layout_fit(samples, rows))
    return float(np.mean(np.abs(left)))


def prediction_error(samples: Sequence[FitSample], gpu: GpuSpec, calibration: Calibration) -> float:
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
    """The calibration and layout factors that best explain every sample (bounded, ridge towards `start`)."""
    from scipy.optimize import least_squares  # heavy: only when fitting

    used = spread(samples)
    names = fittable_factors(used, start)
    before = prediction_error(used, gpu, start)
    if not names or not used:
        return SharedFit(start, (), len(used), before, before, _layout_fit(samples, _rows(samples, gpu, start)))
    lo = np.array([math.log(_bounds(n)[0]) for n in names])
    hi = np.array([math.log(_bounds(n)[1]) for n in names])
    x0 = np.array([math.log(_start(start, n)) for n in names])
    x0 = np.clip(x0, lo + 1e-9, hi - 1e-9)

    def calibrated(x: np.ndarray) -> Calibration:
        return start.model_copy(update={n: float(math.exp(v)) for n, v in zip(names, x, strict=True)})

    def residuals(x: np.ndarray) -> np.ndarray:
        rows = _rows(used, gpu, calibrated(x))
        data = _left(used, rows, _layout_fit(used, rows)) if len(rows.values) else rows.values
        ridge = (x - x0) / RIDGE_SD
        return np.concatenate([data, ridge])

    result = least_squares(residuals, x0, bounds=(lo, hi), diff_step=1e-3, max_nfev=12 * len(names))
    fitted = Calibration.model_validate(calibrated(result.x).model_dump())
    after, at_start = joint_error(used, gpu, fitted), joint_error(used, gpu, start)
    if not after <= at_start:  # never worse than the start on the data it saw
        fitted, after = start, at_start
    return SharedFit(fitted, names, len(used), before, after, _layout_fit(samples, _rows(samples, gpu, fitted)))


def _start(start: Calibration, name: str) -> float:
    return max(start.factor(name), 1e-6)


def _bounds(name: str) -> tuple[float, float]:
    """The field's own range, a zero lower bound raised (and an open upper one capped) so the log is finite."""
    if name in _BOUNDS:
        return _BOUNDS[name]
    low, high = factor_range(name)
    return max(low, 1e-3), min(high, 1e4)
