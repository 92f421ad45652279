"""Fitting calibration factors to measured trials (least squares in log space): the model becomes a twin."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from tuner.errors import ConfigError, DoesNotFitError, TopologyError
from tuner.hardware import GpuSpec
from tuner.metrics import ServingMetrics
from tuner.models import ModelSpec
from tuner.perf._base import PerformanceModel
from tuner.perf._calibration import FITTABLE_FACTORS, Calibration, default_calibration
from tuner.perf._roofline import RooflineModel
from tuner.topology import Role, Topology

#: Factors fitted by default: each moves a different part of the curves (decode bandwidth, prefill compute,
#: the latency floor at low concurrency, the MTP gain), so a handful of sweep points pins them down.
DEFAULT_FIT_FACTORS: tuple[str, ...] = ("hbm_efficiency", "prefill_flop_efficiency", "kernel_latency_us",
                                        "mtp_acceptance")
_FRACTION_BOUNDS = (0.02, 1.0)
_ACCEPTANCE_BOUNDS = (0.01, 0.99)
_COST_BOUNDS = (1e-3, 1e4)  # microseconds / milliseconds


@dataclass(frozen=True)
class MeasuredPoint:
    """One measured (or reference) result: an instance in a role; isl, osl and concurrency are in `metrics`."""

    topology: Topology
    role: Role
    metrics: ServingMetrics


@dataclass(frozen=True)
class FitResult:
    """The fitted calibration and the mean relative error (throughput and latency) before and after."""

    calibration: Calibration
    error_before: float
    error_after: float
    factors: tuple[str, ...]
    num_points: int
    converged: bool


def _bounds(name: str) -> tuple[float, float]:
    if name == "mtp_acceptance":
        return _ACCEPTANCE_BOUNDS
    if name.endswith(("_us", "_ms")):
        return _COST_BOUNDS
    return _FRACTION_BOUNDS


def _ratios(perf: PerformanceModel, points: Sequence[MeasuredPoint]) -> list[float]:
    """predicted / measured for request rate, and ITL (decode) or TTFT (prefill), per point."""
    out = []
    for p in points:
        m = p.metrics
        pred = perf.predict(p.topology, p.role, isl=m.isl, osl=m.osl, concurrency=m.concurrency)
        out.append(pred.request_throughput_rps / m.request_throughput_rps)
        if p.role is Role.DECODE:
            out.append(pred.itl_ms_mean / m.itl_ms_mean)
        else:
            out.append(pred.ttft_ms_mean / m.ttft_ms_mean)
    return out


def mean_relative_error(perf: PerformanceModel, points: Sequence[MeasuredPoint]) -> float:
    """Mean |predicted / measured - 1| over throughput and latency of every point."""
    ratios = _ratios(perf, points)
    return sum(abs(r - 1.0) for r in ratios) / len(ratios)


def _validate(points: Sequence[MeasuredPoint], factors: Sequence[str]) -> None:
    if not points:
        raise ConfigError("no measured points", field="measured_points", fix="give at least one measured trial")
    unknown = [f for f in factors if f not in FITTABLE_FACTORS]
    if unknown or not factors:
        raise ConfigError(f"cannot fit {unknown or 'no factors'}", field="factors",
                          fix=f"choose among {', '.join(FITTABLE_FACTORS)}")
    for i, p in enumerate(points):
        m = p.metrics
        latency = m.itl_ms_mean if p.role is Role.DECODE else m.ttft_ms_mean
        if p.role is Role.BOTH or m.request_throughput_rps <= 0 or latency <= 0:
            raise ConfigError(f"point {i} ({p.topology.name}, {p.role.value}) has no usable rate and latency",
                              field=f"measured_points[{i}]",
                              fix="give prefill or decode points with positive request rate and ITL/TTFT")


def fit_calibration(model: ModelSpec, gpu: GpuSpec, measured_points: Sequence[MeasuredPoint],
                    initial: Calibration | None = None, *, factors: Sequence[str] = DEFAULT_FIT_FACTORS,
                    perf: PerformanceModel | None = None) -> FitResult:
    """Fit `factors` so predictions match the measurements (log-ratio least squares, bounded, log-space)."""
    from scipy.optimize import least_squares  # heavy: only when fitting

    _validate(measured_points, factors)
    start = initial or default_calibration(gpu.name)
    base = (perf or RooflineModel(model, gpu, start)).with_calibration(start)
    try:
        before = mean_relative_error(base, measured_points)
    except (DoesNotFitError, TopologyError) as exc:
        raise ConfigError(f"a measured topology cannot be modelled: {exc.user_message()}", field="measured_points",
                          fix="drop points whose topology does not fit this model and GPU") from exc
    names = tuple(factors)
    lo = [math.log(_bounds(n)[0]) for n in names]
    hi = [math.log(_bounds(n)[1]) for n in names]
    x0 = [min(max(math.log(max(start.factor(n), 1e-12)), a + 1e-9), b - 1e-9)
          for n, a, b in zip(names, lo, hi, strict=True)]

    def calibrated(x: Sequence[float]) -> Calibration:
        return start.model_copy(update={n: math.exp(v) for n, v in zip(names, x, strict=True)})

    def residuals(x: Sequence[float]) -> list[float]:
        return [math.log(r) for r in _ratios(base.with_calibration(calibrated(x)), measured_points)]

    result = least_squares(residuals, x0, bounds=(lo, hi), x_scale=1.0, diff_step=1e-4, max_nfev=200 * len(names))
    fitted = Calibration.model_validate(calibrated(result.x).model_dump())  # re-validate the bounds
    after = mean_relative_error(base.with_calibration(fitted), measured_points)
    if after > before:  # never hand back something worse than the start
        fitted, after = start, before
    return FitResult(calibration=fitted, error_before=before, error_after=after, factors=names,
                     num_points=len(measured_points), converged=bool(result.success))
