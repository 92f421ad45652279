"""Trial backends: one base class, one result schema, implementations in their own modules."""

from tuner.backends._base import Backend, HostAssignment, TrialRequest, TrialResult, TrialStatus

__all__ = ["Backend", "HostAssignment", "TrialRequest", "TrialResult", "TrialStatus", "make_backend"]


def make_backend(name: str, **options: object) -> Backend:
    """Backends by name; each imported only when chosen (vllm pulls in process management)."""
    from tuner.errors import ConfigError

    if name == "simulated":
        from tuner.backends._simulated import SimulatedBackend

        return SimulatedBackend(**options)  # type: ignore[arg-type]
    if name == "vllm":
        from tuner.backends.vllm import VllmBackend

        return VllmBackend(**options)  # type: ignore[arg-type]
    raise ConfigError(f"unknown backend {name!r}", field="--backend", fix="use simulated or vllm")
