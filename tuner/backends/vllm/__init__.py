"""The real backend: launch vLLM deployments, benchmark them with AIPerf, gate on GSM8K accuracy."""

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
    "InstancePlacement",
    "LaunchPlan",
    "PlanSettings",
    "ProcessSpec",
    "build_plan",
    "parse_deployment",
    "place_instances",
    "uniform_hosts",
]
