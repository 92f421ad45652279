"""A running deployment: how far the model is from what it measures (calibration check), and whether its traffic
moved far enough from what it was tuned for to ask for new advice (the deployment watch's library side)."""

from tuner.live._advice import WatchAdvice, WatchAdviceRequest, advise_traffic
from tuner.live._check import (
    SERVE_FLAGS,
    CalibrationCheck,
    DeploymentPrediction,
    check_deployment,
    engine_from_flags,
    measured_point,
    predict_deployment,
    record_window,
)
from tuner.live._watch import (
    Expected,
    Thresholds,
    TrafficProfile,
    WatchState,
    WatchTarget,
    WatchTick,
    drift_reasons,
    expected_gain,
    state_from_json,
    state_json,
    tick,
)

__all__ = [
    "SERVE_FLAGS",
    "CalibrationCheck",
    "DeploymentPrediction",
    "Expected",
    "Thresholds",
    "TrafficProfile",
    "WatchAdvice",
    "WatchAdviceRequest",
    "WatchState",
    "WatchTarget",
    "WatchTick",
    "advise_traffic",
    "check_deployment",
    "drift_reasons",
    "engine_from_flags",
    "expected_gain",
    "measured_point",
    "predict_deployment",
    "record_window",
    "state_from_json",
    "state_json",
    "tick",
]
