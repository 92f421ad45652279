"""A running deployment: how far the model is from what it measures (calibration check), and whether its traffic
moved far enough from what it was tuned for to ask for new advice (the deployment watch's library side)."""

from tuner.live._check import (
    SERVE_FLAGS,
    CalibrationCheck,
    DeploymentPrediction,
    Latencies,
    check_deployment,
    engine_from_flags,
    measured_point,
    predict_deployment,
    record_window,
)

__all__ = [
    "SERVE_FLAGS",
    "CalibrationCheck",
    "DeploymentPrediction",
    "Latencies",
    "check_deployment",
    "engine_from_flags",
    "measured_point",
    "predict_deployment",
    "record_window",
]
