"""Performance models of vLLM instances: one base class, a roofline implementation, calibration and fitting.

The fitting names load on first use (a frontier or a simulation never fits)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner._lazy import lazy_names
from tuner.perf._aggregated import AggregatedPoint, BurstRun
from tuner.perf._base import PerformanceModel
from tuner.perf._calibration import (
    FITTABLE_FACTORS,
    Calibration,
    default_calibration,
    factor_range,
)
from tuner.perf._roofline import InstanceState, LatencyParts, Occupancy, RooflineModel, flag_cap_per_rank
from tuner.perf._steps import DecodeStep, MixedStep, PrefillStep, accepted_tokens
from tuner.perf._sweep import (
    DECODE_LADDER,
    Curves,
    LevelLimits,
    RateCurves,
    candidate_topologies,
    sweep_curves,
    sweep_rate_curves,
)
from tuner.perf._traffic import SaturatedLevel, TrafficCurve, predict_traffic, prefix_hit_share
from tuner.perf._user_factors import CalibrationSource, calibrated

__all__ = [
    "DECODE_LADDER",
    "DEFAULT_FIT_FACTORS",
    "FITTABLE_FACTORS",
    "AggregatedPoint",
    "BurstRun",
    "Calibration",
    "CalibrationSource",
    "Curves",
    "DecodeStep",
    "FitResult",
    "InstanceState",
    "LatencyParts",
    "LevelLimits",
    "MeasuredPoint",
    "MixedStep",
    "Occupancy",
    "PerformanceModel",
    "PrefillStep",
    "RateCurves",
    "RooflineModel",
    "SaturatedLevel",
    "TrafficCurve",
    "accepted_tokens",
    "calibrated",
    "candidate_topologies",
    "default_calibration",
    "factor_range",
    "fit_calibration",
    "flag_cap_per_rank",
    "mean_relative_error",
    "predict_traffic",
    "prefix_hit_share",
    "sweep_curves",
    "sweep_rate_curves",
]

if TYPE_CHECKING:
    from tuner.perf._fit import DEFAULT_FIT_FACTORS, FitResult, MeasuredPoint, fit_calibration, mean_relative_error

_LAZY = ("DEFAULT_FIT_FACTORS", "FitResult", "MeasuredPoint", "fit_calibration", "mean_relative_error")


__getattr__ = lazy_names(__name__, dict.fromkeys(_LAZY, "_fit"))
