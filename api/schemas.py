"""Request and response bodies: XCreate in, XPublic out. Units are in the field names."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from api.models import ModelStatus, StudyStatus
from tuner.replay import Arrival as ReplayArrival
from tuner.space import StudyConstraints

PhaseName = Literal["prefill", "decode", "aggregated"]
SamplerName = Literal["auto", "guided", "gp", "tpe", "nsga2", "random"]  # auto = guided (tuner.study)
ExportFormat = Literal["vllm", "compose", "kubernetes", "dynamo", "srt-slurm"]
MAX_INLINE_SPACE_CHARS = 200_000
MAX_TRIAL_DELAY_S = 600.0
MAX_TRACE_UPLOAD_CHARS = 1_000_000  # under the body limit (api/limits.py): a window of a few thousand requests
MAX_SIMULATED_WALL_S = 86_400.0  # trials x trial_delay_s: one request may not hold a runner thread for days


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _no_nul(value: str | None) -> str | None:
    if value is not None and "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


class ConstraintsIn(StudyConstraints):
    """The space's StudyConstraints, finite numbers only (JSON's 1e400 arrives as inf and would read as unbounded)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class StudyCreate(_In):
    """A study request. Give the space as a file (space_path) or inline (space: YAML/JSON text or an object);
    with neither, the service's default space is used."""

    model_path: str = Field(min_length=1, max_length=4096, description="model folder or config.json, under an "
                            "allowed root; relative paths are taken from the models directory")
    space_path: str | None = Field(None, min_length=1, max_length=4096,
                                   description="search-space YAML under an allowed root")
    space: str | dict[str, Any] | None = Field(None, description="inline search space (YAML/JSON text or object)")
    backend: Literal["simulated", "vllm"] = "simulated"
    trials: int = Field(10, ge=1, le=1000, description="launched trials per phase")
    sampler: SamplerName = "auto"
    seed: int = Field(0, ge=0, le=2**31 - 1)
    warm_start: bool = True
    retry_risks: bool = Field(False, description="launch configs that crashed on this cluster for another model "
                              "(its known risks, /ui/clusters); by default no sampler launches them")
    phases: list[PhaseName] | None = Field(None, min_length=1, max_length=3, description="default: every phase")
    workload: dict[str, Any] | None = Field(None, description="a workload block replacing the space's (isl/osl, "
                                            "input_tokens/output_tokens distributions, prefix, or a trace under an "
                                            "allowed root); the phases' own fixed lengths stay")
    constraints: ConstraintsIn | None = Field(None, description="SLA bounds replacing the space's, field by field: "
                                            "max_ttft_ms, max_itl_ms, percentile, min_accuracy (null: unbounded)")
    noise: float = Field(0.0, ge=0.0, lt=1.0, description="simulated backend: seeded relative noise per deployment")
    trial_delay_s: float = Field(0.0, ge=0.0, le=MAX_TRIAL_DELAY_S, description="simulated backend: wall time "
                                 "per trial (trials x trial_delay_s at most a day)")

    @field_validator("model_path", "space_path")
    @classmethod
    def _paths(cls, value: str | None) -> str | None:
        return _no_nul(value)

    @field_validator("space")
    @classmethod
    def _space(cls, value: str | dict[str, Any] | None, info: ValidationInfo) -> str | dict[str, Any] | None:
        if value is not None and info.data.get("space_path") is not None:
            raise ValueError("give space_path or space, not both")
        if isinstance(value, str):
            _no_nul(value)
            if len(value) > MAX_INLINE_SPACE_CHARS:
                raise ValueError(f"inline spaces are limited to {MAX_INLINE_SPACE_CHARS} characters")
        return value

    @field_validator("noise", "trial_delay_s")
    @classmethod
    def _simulated_only(cls, value: float, info: ValidationInfo) -> float:
        if value and info.data.get("backend", "simulated") != "simulated":
            raise ValueError("applies to the simulated backend only")
        if info.field_name == "trial_delay_s" and value * info.data.get("trials", 1) > MAX_SIMULATED_WALL_S:
            raise ValueError(f"trials x trial_delay_s is more than {MAX_SIMULATED_WALL_S:.0f} s of simulated "
                             "wall time; lower one of them")
        return value


class ModelCreate(_In):
    path: str = Field(min_length=1, max_length=4096, description="model folder (with config.json) under an "
                      "allowed root; relative paths are taken from the models directory")
    auto_tune: bool = Field(True, description="start a study on the default space when the model fits")

    @field_validator("path")
    @classmethod
    def _path(cls, value: str) -> str:
        return _no_nul(value) or value


class Links(BaseModel):
    self_url: str
    ui_url: str
    pareto_url: str


class StudyPublic(BaseModel):
    id: int
    campaign: str = Field(description="prefix of the Optuna phase studies (see the dashboard)")
    status: StudyStatus
    model_name: str
    model_path: str
    space_name: str
    backend: str
    trials_per_phase: int
    sampler: str
    seed: int
    error: str | None
    resumes: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    links: Links


class StudyList(BaseModel):
    items: list[StudyPublic]
    total: int


class Failure(BaseModel):
    trial_number: int
    status: str
    reason: str
    params: dict[str, Any]


class PhaseProgress(BaseModel):
    study_name: str
    dashboard_url: str | None
    launched: int
    budget: int
    counts: dict[str, int] = Field(description="trials by outcome: ok, infeasible, oom, failed, running, ...")
    failures: list[Failure]


class EventPublic(BaseModel):
    at: datetime
    kind: str
    phase: str | None
    trial_number: int | None
    message: str


class StudyDetail(StudyPublic):
    launched: int
    budget: int
    progress_fraction: float = Field(ge=0, le=1)
    phases: dict[str, PhaseProgress]
    constraints: dict[str, Any]
    recent_events: list[EventPublic]


class LevelPublic(BaseModel):
    """One load level a trial measured."""

    level: str = Field(description='the load: "c16" (16 clients) or "6 rps" (an open-loop rate)')
    concurrency: int | None
    offered_rps: float | None
    values: list[float] | None
    feasible: bool
    told: bool = Field(description="the level the trial was told to Optuna with (its values, the sampler's)")
    stored_as: int = Field(description="the Optuna trial holding this level: the trial itself (a study stored "
                                       "before levels were kept in their trial: the level's own trial)")


class TrialPublic(BaseModel):
    """One trial: one tried configuration, with every load level it measured."""

    phase: PhaseName
    trial_number: int
    state: str = Field(description="Optuna state: COMPLETE, FAIL, RUNNING, ...")
    status: str | None = Field(description="outcome: ok, infeasible, oom, crashed, duplicate, cancelled, ...")
    kind: str | None = Field(description="sampled (a launch), screened, duplicate, reverify")
    params: dict[str, Any]
    values: list[float] | None
    constraints: dict[str, float]
    feasible: bool
    reason: str | None
    duration_s: float | None
    concurrency: int | None = Field(description="the level the sampler was told (values are that level's)")
    levels: list[LevelPublic] = Field(default_factory=list, description="every load level measured, by load")


class TrialPage(BaseModel):
    items: list[TrialPublic]
    total: int
    offset: int
    limit: int


class FrontPoint(BaseModel):
    trial_number: int = Field(description="the trial (tried configuration) this point is a load level of")
    level: str = Field(description='the load it was measured at: "c16" or "6 rps"')
    stored_as: int = Field(description="the Optuna trial holding the point: its trial (a study stored before levels "
                                       "were kept in their trial: the level's own trial)")
    deployment: str
    topology: str
    concurrency: int
    params: dict[str, Any]
    objective_values: list[float]
    total_tok_s_per_gpu: float
    tok_s_per_user: float
    ttft_ms_p50: float
    itl_ms_p50: float
    constraints: dict[str, float]


class PhaseFront(BaseModel):
    study_name: str
    objectives: list[str]
    points_total: int
    points_feasible: int
    front: list[FrontPoint]


class ComposedFrontPoint(BaseModel):
    point: int = Field(description="the `point` of /export")
    deployment: str
    num_gpus: int
    total_tok_s_per_gpu: float
    tok_s_per_user: float
    ttft_ms: float
    itl_ms: float
    export_url: str


class ParetoPublic(BaseModel):
    study_id: int
    campaign: str
    status: StudyStatus
    trials_stored: int
    constraints: dict[str, Any]
    phases: dict[str, PhaseFront]
    composed_front: list[ComposedFrontPoint]
    composition_error: str | None
    exportable_points: int = Field(description="points accepted by /export (composed front, else phase fronts)")


class ModelPublic(BaseModel):
    id: int
    path: str
    name: str
    source: str
    status: ModelStatus
    reason: str | None
    study_id: int | None
    created_at: datetime


class ModelList(BaseModel):
    items: list[ModelPublic]
    total: int


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    database: str
    schema_revision: str | None
    runner_threads_alive: int
    studies_active: int
    watcher: str


class CancelResult(BaseModel):
    id: int
    status: StudyStatus


class ReverifyCreate(BaseModel):
    """POST /v1/studies/{id}/reverify: re-measure the study's front on what the cluster runs now."""

    model_config = ConfigDict(extra="forbid")

    budget: int = Field(8, ge=1, le=200, description="configs re-measured; the exported recipes' configs first")
    repeats: int = Field(3, ge=1, le=20, description="runs per config (the noise test's sample)")
    reopen: bool = Field(True, description="re-measure / enqueue the neighbours of configs that changed")
    noise_floor: float = Field(0.03, gt=0, lt=1, description="least log-sd of one run's throughput")
    alpha: float = Field(0.01, gt=0, lt=0.5, description="two-sided significance of a reported change")
    emulate_vllm: str | None = Field(None, max_length=64, pattern=r"^v?\d+\.\d+(\.\d+)?\S*$",
                                     description="simulated studies only: answer as this vLLM version (an "
                                                 "emulated upgrade)")
    reason: str = Field("requested", max_length=200, description="why (the watcher names the change it saw)")


class ReverifyAccepted(BaseModel):
    id: int
    status: Literal["reverifying"] = "reverifying"
    status_url: str


class ReverifyReports(BaseModel):
    id: int
    running: bool
    error: str | None = None
    reports: list[dict[str, Any]] = Field(description="every re-verification, oldest first (ReverifyReport JSON)")


class SlaIn(_In):
    """The service level a deployment must hold (null: no bound); latencies are read at `percentile`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    max_ttft_ms: float | None = Field(None, gt=0, description="TTFT bound (prefill + decode-side wait)")
    max_itl_ms: float | None = Field(None, gt=0, description="inter-token latency bound")
    min_tok_s_user: float | None = Field(None, gt=0, description="per-user speed floor (tokens/s each user sees)")
    percentile: Literal["p50", "p90", "p99"] = "p90"


class AdviceCreate(_In):
    """POST /v1/advice: what to deploy for this traffic and SLA, from the performance model (no trial runs)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model_path: str = Field(min_length=1, max_length=4096, description="model folder or config.json, under an "
                            "allowed root; relative paths are taken from the models directory")
    hardware: str = Field("gb300", min_length=1, max_length=64, description="GPU from the catalog")
    gpus: int = Field(72, ge=1, le=4096, description="GPU budget of the whole deployment (prefill + decode)")
    request_rate: float | None = Field(None, gt=0, le=1e6, description="open loop: the requests/s the deployment "
                                       "must carry (the answer is the fewest GPUs that do, up to `gpus`)")
    arrival: Literal["poisson", "trace"] | None = Field(None, description="open-loop arrivals; `trace` alone runs "
                                                        "at the workload trace's own rate")
    workload: dict[str, Any] | None = Field(None, description="a search space's workload block: isl/osl, "
                                            "input_tokens/output_tokens distributions, prefix, or a trace under an "
                                            "allowed root (default: isl 8192, osl 1024)")
    trace_jsonl: str | None = Field(None, max_length=MAX_TRACE_UPLOAD_CHARS, description="an uploaded trace: the "
                                    "mooncake JSONL itself (timestamp, input_length, output_length, hash_ids per "
                                    "line), within the request body's limit; replaces the workload's lengths")
    sla: SlaIn = Field(default_factory=SlaIn)
    mode: Literal["both", "disagg", "agg"] = Field("both", description="which serving modes compete")
    max_mtp: int = Field(3, ge=0, le=8, description="decode MTP depths 0..N are swept (models with MTP layers)")
    calibration: dict[str, Any] | None = Field(
        None, max_length=64, description="calibration factors over the GPU's defaults, factor: value "
        "(docs/perf-model.md; what `topotune frontier --calibration FILE` reads from a file), each checked by the "
        "library")
    replay_verify: bool | None = Field(None, description="the replay (vLLM's scheduler, request by request) decides "
                                       "the answer; default (null): whenever the SLA bounds something; false: the "
                                       "steady-state model alone")

    @field_validator("model_path", "trace_jsonl")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        return _no_nul(value)


MAX_SERVICE_REPLAY_REQUESTS = 20_000  # one request's answer (per-request records) stays a few MB and seconds


class ReplayCreate(_In):
    """POST /v1/replay: a request stream through one deployment, as vLLM's scheduler runs it (`topotune replay`)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model_path: str = Field(min_length=1, max_length=4096, description="model folder or config.json, under an "
                            "allowed root; relative paths are taken from the models directory")
    hardware: str = Field("gb300", min_length=1, max_length=64, description="GPU from the catalog")
    deployment: str = Field("TP8", min_length=1, max_length=256, description='"2P:TP4,1D:TP8" (PD), "2x:TP8" '
                            '(replicas) or "TP8" (one instance)')
    knobs: dict[str, Any] = Field(default_factory=dict, max_length=32, description="engine knobs every instance "
                                  "carries, by name (max_num_seqs, max_num_batched_tokens, gpu_memory_utilization...)")
    workload: dict[str, Any] | None = Field(None, description="a search space's workload block (as /v1/advice's); "
                                            "default: isl 8192, osl 1024")
    trace_jsonl: str | None = Field(None, max_length=MAX_TRACE_UPLOAD_CHARS, description="an uploaded mooncake "
                                    "trace (as /v1/advice's); with no rate nor concurrency it replays at its own "
                                    "timestamps")
    request_rate: float | None = Field(None, gt=0, le=1e6, description="open loop: requests/s for the deployment")
    concurrency: int | None = Field(None, ge=1, le=100_000, description="closed loop: clients, each sending its "
                                    "next request when its answer ends")
    arrival: ReplayArrival | None = Field(None, description="open-loop arrivals (gamma: "
                                                                 "bursty, at `burstiness_cv`)")
    burstiness_cv: float = Field(1.0, description="gamma arrivals: inter-arrival CV (1 = Poisson)")
    router: str = Field("cache_aware", max_length=32, description="cache_aware, round_robin or least_loaded")
    turns: int | None = Field(None, description="multi-turn sessions of a distribution: turns each")
    think_ms: float = Field(1000.0, description="sessions: pause between an answer and the next turn")
    num_requests: int | None = Field(None, ge=1, le=MAX_SERVICE_REPLAY_REQUESTS, description="requests replayed "
                                     "(a trace: its first N, at most the service's bound; a distribution: 1,000)")
    warmup_share: float = Field(0.0, description="share of the requests replayed before measuring")
    max_ttft_ms: float | None = Field(None, gt=0, description="SLA of goodput: TTFT bound")
    max_itl_ms: float | None = Field(None, gt=0, description="SLA of goodput: ITL bound")
    long_prefill_token_threshold: int = Field(0, ge=0, description="vLLM --long-prefill-token-threshold")
    max_horizon_s: float | None = Field(None, gt=0, le=1e7, description="stop past this simulated time")
    seed: int = Field(0, ge=0, le=2**31 - 1)
    calibration: dict[str, Any] | None = Field(None, max_length=64, description="calibration factors over the GPU's "
                                               "defaults (as /v1/advice's)")

    @field_validator("model_path", "trace_jsonl")
    @classmethod
    def _text(cls, value: str | None) -> str | None:
        return _no_nul(value)


class AdvicePublic(BaseModel):
    """The advice: `recommendation` is the object `topotune frontier --json` prints (same keys), `front` and
    `aggregated_front` both fronts (throughput end first), `commands` the winner's `vllm serve` lines."""

    model: str
    gpu: str
    gpus: int
    isl: int
    osl: int
    mode: str
    workload: str
    offered_rps: float | None = None
    arrival: str | None = None
    offered_tok_s: float | None = None
    constraints: dict[str, Any]
    recommendation: dict[str, Any]
    reason: str
    setting: str = Field(description="what was asked, in one line (model, budget, traffic, offered rate)")
    operating_deployment: str | None
    commands: str | None
    front: list[dict[str, Any]]
    aggregated_front: list[dict[str, Any]]
    winners: list[dict[str, Any]]
    num_topologies: int
    num_instance_points: int
    num_deployments: int
    elapsed_s: float
    calibration: dict[str, Any]
    replay_verification: dict[str, Any] | None = Field(None, description="what the replay checked and kept, when it "
                                                       "decided (recommendation.decided_by 'replay')")
# -- deployment watches (#48) ----------------------------------------------------------------------------------------
class ThresholdsIn(_In):
    """When a watch asks for new advice (tuner.live.Thresholds; unset fields keep their defaults)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    rate_rel: float = Field(0.25, gt=0, le=100, description="|rate / baseline - 1| that counts as a change")
    length_rel: float = Field(0.25, gt=0, le=100, description="|length p50 or p90 / baseline - 1|")
    prefix_abs: float = Field(0.15, gt=0, le=1, description="|prefix-cache hit share - baseline|")
    min_attainment: float = Field(0.9, ge=0, le=1, description="measured share within the SLA below which to act")
    confirm_windows: int = Field(2, ge=1, le=100, description="consecutive windows a change must hold")


class WatchCreate(_In):
    """A running deployment to watch: its servers' /metrics URLs, what it runs, the SLA and the GPU budget the
    advice may use, and how often to look."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=256)
    urls: list[str] = Field(min_length=1, max_length=64, description="every server's /metrics URL (http or https)")
    deployment: str = Field(min_length=1, max_length=512, description="what runs: TP8, 2x:TP4, 1P:TP4,1D:TEP8, ...")
    serve_flags: str = Field("", max_length=4096, description="the vllm serve flags it runs with")
    model_path: str = Field(min_length=1, max_length=4096, description="model folder or config.json under an "
                            "allowed root (what the advice models)")
    hardware: str = Field("gb300", min_length=1, max_length=64, description="GPU from the catalog")
    max_gpus: int = Field(ge=1, le=100_000, description="GPU budget the advice may use")
    max_ttft_ms: float | None = Field(None, gt=0, le=3_600_000)
    max_itl_ms: float | None = Field(None, gt=0, le=3_600_000)
    percentile: Literal["p50", "p90", "p99"] = "p90"
    period_s: float = Field(600.0, ge=1.0, le=86_400.0, description="the window: time between two scrapes")
    thresholds: ThresholdsIn = Field(default_factory=ThresholdsIn)
    enabled: bool = True

    @field_validator("name", "deployment", "serve_flags", "model_path", "hardware")
    @classmethod
    def _text(cls, value: str) -> str:
        return _no_nul(value) or value


class WatchUpdate(_In):
    """Fields to change (the rest stay): e.g. the deployment once the advice was applied, or pause it."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str | None = Field(None, min_length=1, max_length=256)
    urls: list[str] | None = Field(None, min_length=1, max_length=64)
    deployment: str | None = Field(None, min_length=1, max_length=512)
    serve_flags: str | None = Field(None, max_length=4096)
    max_gpus: int | None = Field(None, ge=1, le=100_000)
    max_ttft_ms: float | None = Field(None, gt=0, le=3_600_000)
    max_itl_ms: float | None = Field(None, gt=0, le=3_600_000)
    percentile: Literal["p50", "p90", "p99"] | None = None
    period_s: float | None = Field(None, ge=1.0, le=86_400.0)
    thresholds: ThresholdsIn | None = None
    enabled: bool | None = None


class WatchEventPublic(BaseModel):
    id: int
    at: datetime
    kind: str
    window_s: float | None
    message: str
    detail: dict[str, Any]


class WatchPublic(BaseModel):
    id: int
    name: str
    urls: list[str]
    deployment: str
    serve_flags: str
    model_path: str
    hardware: str
    max_gpus: int
    max_ttft_ms: float | None
    max_itl_ms: float | None
    percentile: str
    period_s: float
    thresholds: dict[str, Any]
    enabled: bool
    baseline: dict[str, Any] | None
    last_checked_at: datetime | None
    last_error: str | None
    created_at: datetime
    latest_advice: WatchEventPublic | None = None


class WatchList(BaseModel):
    watches: list[WatchPublic]
