"""The real backend: launch vLLM deployments, benchmark them with AIPerf, gate on GSM8K accuracy.

The names load on first use (PEP 562): `topotune frontier` and the recipes read the pairing rules and the
launch plan without importing the backend that runs trials (AIPerf, processes, accuracy)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner._lazy import lazy_names

if TYPE_CHECKING:
    from tuner.backends.vllm._accuracy import (
        AccuracyResult,
        run_gsm8k,
    )
    from tuner.backends.vllm._backend import (
        LAUNCHER,
        PORT_BLOCK,
        TINY_MODEL_SCRIPT,
        TrialTimings,
        VllmBackend,
        VllmBackendSettings,
        VllmTrial,
        default_envs_dir,
    )
    from tuner.backends.vllm._pairing import (
        PairingContext,
        PairingRefusal,
        check_pd_pairing,
        pairing_predicate,
        pairing_refusal,
        side_blocks,
    )
    from tuner.backends.vllm._plan import (
        InstancePlacement,
        LaunchPlan,
        PlanSettings,
        ProcessSpec,
        build_plan,
        check_host_split,
        keep_names,
        model_or_none,
        pack_hosts,
        place_instances,
        plan_settings,
        point_plan_settings,
        resolve_address,
        topology_flags,
        uniform_hosts,
    )
    from tuner.backends.vllm._versions import (
        DISTRIBUTION_VERSION_CODE,
        NEWEST_CHECKED,
        LaunchRules,
        VllmVersion,
        detect_version,
        launch_rules,
        python_of,
    )

_HOMES: dict[str, str] = {
    "AccuracyResult": "_accuracy",
    "DISTRIBUTION_VERSION_CODE": "_versions",
    "InstancePlacement": "_plan",
    "LAUNCHER": "_backend",
    "LaunchPlan": "_plan",
    "LaunchRules": "_versions",
    "NEWEST_CHECKED": "_versions",
    "PORT_BLOCK": "_backend",
    "PairingContext": "_pairing",
    "PairingRefusal": "_pairing",
    "PlanSettings": "_plan",
    "ProcessSpec": "_plan",
    "TINY_MODEL_SCRIPT": "_backend",
    "TrialTimings": "_backend",
    "VllmBackend": "_backend",
    "VllmBackendSettings": "_backend",
    "VllmTrial": "_backend",
    "VllmVersion": "_versions",
    "build_plan": "_plan",
    "check_host_split": "_plan",
    "check_pd_pairing": "_pairing",
    "default_envs_dir": "_backend",
    "detect_version": "_versions",
    "keep_names": "_plan",
    "launch_rules": "_versions",
    "model_or_none": "_plan",
    "pack_hosts": "_plan",
    "plan_settings": "_plan",
    "point_plan_settings": "_plan",
    "pairing_predicate": "_pairing",
    "pairing_refusal": "_pairing",
    "place_instances": "_plan",
    "python_of": "_versions",
    "resolve_address": "_plan",
    "run_gsm8k": "_accuracy",
    "side_blocks": "_pairing",
    "topology_flags": "_plan",
    "uniform_hosts": "_plan",
}

__all__ = [
    "DISTRIBUTION_VERSION_CODE",
    "LAUNCHER",
    "NEWEST_CHECKED",
    "PORT_BLOCK",
    "TINY_MODEL_SCRIPT",
    "AccuracyResult",
    "InstancePlacement",
    "LaunchPlan",
    "LaunchRules",
    "PairingContext",
    "PairingRefusal",
    "PlanSettings",
    "ProcessSpec",
    "TrialTimings",
    "VllmBackend",
    "VllmBackendSettings",
    "VllmTrial",
    "VllmVersion",
    "build_plan",
    "check_host_split",
    "check_pd_pairing",
    "default_envs_dir",
    "detect_version",
    "keep_names",
    "launch_rules",
    "model_or_none",
    "pack_hosts",
    "pairing_predicate",
    "pairing_refusal",
    "place_instances",
    "plan_settings",
    "point_plan_settings",
    "python_of",
    "resolve_address",
    "run_gsm8k",
    "side_blocks",
    "topology_flags",
    "uniform_hosts",
]


__getattr__ = lazy_names(__name__, _HOMES)
