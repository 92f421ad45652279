"""The real backend: launch vLLM deployments, benchmark them with AIPerf, gate on GSM8K accuracy."""

from tuner.backends.vllm._accuracy import AccuracyResult, run_gsm8k
from tuner.backends.vllm._backend import (
    LAUNCHER,
    TINY_MODEL_SCRIPT,
    TrialTimings,
    VllmBackend,
    VllmBackendSettings,
    default_envs_dir,
)
from tuner.backends.vllm._plan import (
    InstancePlacement,
    LaunchPlan,
    PlanSettings,
    ProcessSpec,
    build_plan,
    parse_deployment,
    place_instances,
    uniform_hosts,
)

__all__ = [
    "LAUNCHER",
    "TINY_MODEL_SCRIPT",
    "AccuracyResult",
    "InstancePlacement",
    "LaunchPlan",
    "PlanSettings",
    "ProcessSpec",
    "TrialTimings",
    "VllmBackend",
    "VllmBackendSettings",
    "build_plan",
    "default_envs_dir",
    "parse_deployment",
    "place_instances",
    "run_gsm8k",
    "uniform_hosts",
]
