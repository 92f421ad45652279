"""`replay_stream(ReplayRequest) -> ReplayAnswer`: a user's request stream through one deployment, as one library
call. `topotune replay` and the service (`POST /v1/replay`) only build the request and render the answer; errors
name the request's fields (`request_rate`, `deployment`, `calibration.x`), which each face maps to its own names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

from tuner.deployment import parse_deployment
from tuner.errors import ConfigError
from tuner.hardware import get_gpu
from tuner.models import ModelSpec, load_model
from tuner.perf import CalibrationSource, RooflineModel, calibrated
from tuner.replay._arrivals import ArrivalProcess, Sessions
from tuner.replay._replay import ReplayPlan, replay
from tuner.replay._report import ReplayReport, Sla
from tuner.topology import KNOBS
from tuner.workload import Workload

Arrival = Literal["poisson", "gamma", "trace"]
ARRIVALS: tuple[str, ...] = get_args(Arrival)


@dataclass(frozen=True)
class ReplayRequest:
    """One replay: the deployment ("2P:TP4,1D:TP8", "2x:TP8", "TP8") with the engine `knobs` every instance carries
    (Topology field names), the traffic and how it is sent: `concurrency` clients (closed loop), `request_rate`
    req/s (open loop: Poisson, or gamma at `burstiness_cv`, or the trace's timestamps rescaled), or neither with a
    timestamped trace (its own arrivals)."""

    model: str | Path | ModelSpec
    workload: Workload
    deployment: str = "TP8"
    hardware: str = "gb300"
    hardware_file: str | Path | None = None
    calibration: CalibrationSource | None = None
    knobs: Mapping[str, Any] = field(default_factory=dict)
    request_rate: float | None = None
    concurrency: int | None = None
    arrival: Arrival | None = None
    burstiness_cv: float = 1.0
    router: str = "cache_aware"
    turns: int | None = None  # multi-turn sessions of a distribution
    think_ms: float = 1000.0
    num_requests: int | None = None
    warmup_share: float = 0.0
    max_ttft_ms: float | None = None  # the SLA of goodput
    max_itl_ms: float | None = None
    long_prefill_token_threshold: int = 0
    max_horizon_s: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.request_rate is not None:
            raise ConfigError("give a request rate or a concurrency, not both", field="concurrency",
                              fix="open loop at `request_rate`, or a closed loop of `concurrency` clients")
        if self.arrival is not None and self.arrival not in ARRIVALS:
            raise ConfigError(f"unknown arrival {self.arrival!r}", field="arrival", fix="use poisson, gamma or trace")
        if self.request_rate is not None and not self.request_rate > 0:
            raise ConfigError(f"must be positive, got {self.request_rate:g}", field="request_rate",
                              fix="give requests/s, e.g. 2.5")
        engine_knobs = [name for name, knob in KNOBS.items() if not knob.layout]
        for name in self.knobs:
            if name not in engine_knobs:
                raise ConfigError(f"unknown engine knob {name!r}" + (" (the layout is the deployment's)"
                                  if name in KNOBS else ""), field=f"knobs.{name}",
                                  fix=f"use one of {', '.join(engine_knobs)}")
        for name in ("max_ttft_ms", "max_itl_ms"):
            bound = getattr(self, name)
            if bound is not None and not bound > 0:
                raise ConfigError(f"must be positive, got {bound:g}", field=name, fix="give milliseconds, e.g. 500")

    def arrival_process(self) -> ArrivalProcess:
        """How the clients send: a closed loop, an open loop at the rate, or the trace's own timestamps."""
        if self.concurrency is not None:
            return ArrivalProcess("closed", concurrency=self.concurrency)
        if self.request_rate is not None:
            kind = self.arrival or ("gamma" if self.burstiness_cv != 1.0 else "poisson")
            return ArrivalProcess(kind, rate_rps=self.request_rate, cv=self.burstiness_cv)
        trace = self.workload.trace
        if self.arrival in (None, "trace") and trace is not None and trace.arrival_rps is not None:
            return ArrivalProcess("trace")
        raise ConfigError("no load given", field="request_rate",
                          fix="give `request_rate` R (requests/s) or `concurrency` C (clients); a trace with "
                              "timestamps replays at its own rate")


@dataclass(frozen=True)
class ReplayAnswer:
    """What the replay measured, with what it ran on."""

    model: str
    gpu: str
    workload: str  # the traffic, described
    report: ReplayReport

    def as_json(self) -> dict[str, Any]:
        return {"model": self.model, "gpu": self.gpu, "workload": self.workload, **self.report.as_json()}


def replay_stream(request: ReplayRequest) -> ReplayAnswer:
    """Replay the request's stream through its deployment, event by event."""
    process = request.arrival_process()
    spec = request.model if isinstance(request.model, ModelSpec) else load_model(request.model)
    gpu = get_gpu(request.hardware, request.hardware_file)
    deployed = parse_deployment(request.deployment, **dict(request.knobs))
    for group in deployed.groups:
        group.topology.check(spec)
    perf = RooflineModel(spec, gpu, calibrated(gpu.name, request.calibration))
    sessions = Sessions(turns=request.turns, think_ms=request.think_ms) if request.turns is not None else None
    plan = ReplayPlan(deployment=deployed, workload=request.workload, arrival=process,
                      router=request.router, num_requests=request.num_requests,  # type: ignore[arg-type]
                      warmup_share=request.warmup_share,
                      sessions=sessions,
                      sla=Sla(max_ttft_ms=request.max_ttft_ms, max_itl_ms=request.max_itl_ms), seed=request.seed,
                      long_prefill_token_threshold=request.long_prefill_token_threshold,
                      max_horizon_s=request.max_horizon_s)
    return ReplayAnswer(spec.name, gpu.name, request.workload.describe(load=False), replay(perf, plan))
