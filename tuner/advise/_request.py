"""What `advise` is asked: the model, the hardware, a GPU budget or a request rate, the traffic, the SLA and the
serving options. Errors name these fields (`gpus`, `sla.max_ttft_ms`, `serve.mode`); each face maps them to its own
names (the CLI to flags, the API to body fields)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from tuner.errors import ConfigError
from tuner.frontier import Percentile, check_sla
from tuner.models import ModelSpec
from tuner.workload import Workload

ServingMode = Literal["both", "disagg", "agg"]
SERVING_MODES: tuple[str, ...] = ("both", "disagg", "agg")
Arrival = Literal["poisson", "trace"]
MAX_MTP_DEPTH = 8


@dataclass(frozen=True)
class Sla:
    """The service level a deployment must hold: latency bounds read at `percentile`, and a per-user speed floor
    (it binds the ITL at 1000 / floor when tighter). None: no bound."""

    max_ttft_ms: float | None = None
    max_itl_ms: float | None = None
    min_tok_s_user: float | None = None
    percentile: Percentile = "p90"

    def __post_init__(self) -> None:
        check_sla(max_ttft_ms=self.max_ttft_ms, max_itl_ms=self.max_itl_ms, min_tok_s_user=self.min_tok_s_user,
                  percentile=self.percentile)

    def describe(self) -> str:
        """"TTFT <= 1000 ms, ITL <= 30 ms, >= 40 tok/s/user", or "no SLA"."""
        return ", ".join(part for part in (
            f"TTFT <= {self.max_ttft_ms:g} ms" if self.max_ttft_ms else "",
            f"ITL <= {self.max_itl_ms:g} ms" if self.max_itl_ms else "",
            f">= {self.min_tok_s_user:g} tok/s/user" if self.min_tok_s_user else "") if part) or "no SLA"


@dataclass(frozen=True)
class ServeOptions:
    """How the candidates are served: which modes compete, the decode MTP depths swept, the vLLM whose pairing
    rules apply, and the engine settings every candidate topology carries."""

    mode: ServingMode = "both"
    max_mtp: int = 3  # decode MTP depths 0..max_mtp are swept (models with MTP layers)
    vllm_version: str | None = None  # None: the newest version topotune's pairing table checks
    # Engine knobs every candidate carries, by Topology field name (tuner.topology.KNOBS: the one definition of a
    # knob); a knob not given reads its default.
    knobs: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in SERVING_MODES:
            raise ConfigError(f"unknown mode {self.mode!r}", field="serve.mode", fix="use both, disagg or agg")
        if not 0 <= self.max_mtp <= MAX_MTP_DEPTH:
            raise ConfigError(f"must be 0..{MAX_MTP_DEPTH}, got {self.max_mtp}", field="serve.max_mtp",
                              fix=f"give 0 (off) to {MAX_MTP_DEPTH}")

    def engine(self) -> dict[str, object]:
        """The engine settings as Topology fields."""
        return dict(self.knobs)


@dataclass(frozen=True)
class AdviseRequest:
    """"What should I deploy?": closed loop (`request_rate` None: the best tok/s/GPU at each per-user speed within
    `gpus`) or open loop (the fewest GPUs, up to `gpus`, that carry `request_rate` req/s under the SLA).

    `workload` is the traffic's shape (lengths, prefixes, a trace's summary); its load levels are ignored unless it
    is open loop at one rate of its own. `arrival` "trace" alone runs at the trace's own rate."""

    model: str | Path | ModelSpec  # a config.json / model folder, or a model already read (the service caches them)
    workload: Workload
    hardware: str = "gb300"
    hardware_file: str | Path | None = None
    gpus: int = 72
    request_rate: float | None = None
    arrival: Arrival | None = None
    sla: Sla = field(default_factory=Sla)
    serve: ServeOptions = field(default_factory=ServeOptions)
    # factors over the GPU's defaults (docs/perf-model.md), or a YAML/JSON file of them (read through the YAML guard)
    calibration: Mapping[str, float] | str | Path | None = None
    weights: str | None = None  # the model path the recommended commands load (default: `model`)
    # Replay the best deployments through vLLM's scheduler and let the replay decide the answer (tuner/replay).
    # None: whenever the SLA bounds something (a latency or a per-user floor); False: the steady-state model alone.
    replay_verify: bool | None = None

    def __post_init__(self) -> None:
        if not self.gpus >= 1:
            raise ConfigError(f"must be >= 1, got {self.gpus}", field="gpus", fix="give a positive number")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ConfigError(f"must be positive, got {self.request_rate:g}", field="request_rate",
                              fix="give the requests/s the deployment must carry, e.g. 2.5")
        if self.arrival is not None and self.arrival not in ("poisson", "trace"):
            raise ConfigError(f"unknown arrival {self.arrival!r}", field="arrival", fix="use poisson or trace")

    @property
    def replay_decides(self) -> bool:
        """Whether the replay decides the answer: asked for, or by default under an SLA."""
        if self.replay_verify is not None:
            return self.replay_verify
        sla = self.sla
        return any(v is not None for v in (sla.max_ttft_ms, sla.max_itl_ms, sla.min_tok_s_user))
