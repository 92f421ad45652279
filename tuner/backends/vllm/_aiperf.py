"""AIPerf: the argv for one load level, and its summary JSON and per-request records turned into ServingMetrics.

Flags are the ones measured to work against vLLM (aiperf 0.13.0): streaming completions, `ignore_eos` so every
request generates exactly its output length, and `--use-server-token-count` (re-tokenizing a random model's
output miscounts). The traffic is AIPerf's own synthetic prompts (fixed lengths, or normal ones through
--isl-stddev/--osl-stddev) or a mooncake JSONL the backend writes (_replay.py). AIPerf must NOT run with
HF_HUB_OFFLINE and a local --tokenizer path: it then sends the path to snapshot_download and fails; its
hash-id prompt decoding forces that mode in its worker processes, so a replay names the tokenizer through a
private hub cache instead (tokenizer_hub_alias).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.metrics import SKETCH_PROBABILITIES, ServingMetrics

SUMMARY_FILE = "profile_export_aiperf.json"
RECORDS_FILE = "profile_export.jsonl"  # one line per request (--export-level records)
_HUB_REVISION = "0" * 40


class AiperfRun(BaseModel):
    """One AIPerf invocation: one load level against one endpoint.

    The load is exactly one of: `concurrency` clients (closed loop), `request_rate` with Poisson arrivals, or
    `fixed_schedule` (the replay file's timestamps). The prompts are AIPerf's synthetic ones (isl/osl and their
    stddevs) unless `input_file` names a mooncake JSONL (its lengths and hash ids rule; isl/osl are ignored).
    """

    model_config = ConfigDict(frozen=True)

    aiperf_argv: tuple[str, ...] = ("aiperf",)
    model: str
    tokenizer: str
    url: str
    isl: int = Field(ge=1)
    osl: int = Field(ge=1)
    isl_stddev: float = Field(0.0, ge=0)
    osl_stddev: float = Field(0.0, ge=0)
    input_file: str | None = None
    block_tokens: int | None = Field(None, ge=1, description="--isl-block-size: tokens per hash id")
    concurrency: int | None = Field(None, ge=1)
    request_rate: float | None = Field(None, gt=0)
    fixed_schedule: bool = False
    request_count: int = Field(ge=1)
    warmup_request_count: int = Field(0, ge=0)
    seed: int = 0
    request_timeout_s: float | None = None
    extra_flags: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _one_load(self) -> AiperfRun:
        loads = (self.concurrency is not None) + (self.request_rate is not None) + self.fixed_schedule
        if loads != 1:
            raise ValueError("give exactly one of concurrency, request_rate or fixed_schedule")
        if self.fixed_schedule and self.input_file is None:
            raise ValueError("fixed_schedule replays an input_file's timestamps")
        if self.input_file is not None and self.warmup_request_count:
            # a trace is sampled in order across phases: warm-up would take its first requests (and their
            # prefixes) and the measured phase would send them again at its end
            raise ValueError("a replayed file takes no AIPerf warm-up: warm the server up before")
        return self

    def argv(self, artifact_dir: Path) -> list[str]:
        argv = [*self.aiperf_argv, "profile", "--model", self.model, "--tokenizer", self.tokenizer,
                "--url", self.url, "--endpoint-type", "completions", "--streaming"]
        if self.input_file is not None:
            argv += ["--input-file", self.input_file, "--custom-dataset-type", "mooncake_trace"]
            if self.block_tokens:
                argv += ["--isl-block-size", str(self.block_tokens)]
        else:
            argv += ["--isl", str(self.isl), "--isl-stddev", f"{self.isl_stddev:g}", "--osl", str(self.osl)]
            if self.osl_stddev:
                argv += ["--osl-stddev", f"{self.osl_stddev:g}"]
        argv += ["--extra-inputs", "ignore_eos:true", "--use-server-token-count"]
        if self.concurrency is not None:
            argv += ["--concurrency", str(self.concurrency)]
        elif self.request_rate is not None:
            argv += ["--request-rate", f"{self.request_rate:g}", "--arrival-pattern", "poisson"]
        else:
            argv += ["--fixed-schedule"]
        if self.input_file is not None and not self.fixed_schedule:
            argv += ["--no-fixed-schedule"]  # keep the chosen load even if the file carries timestamps
        argv += ["--request-count", str(self.request_count)]
        if self.input_file is None:
            # one prompt per request: a smaller pool repeats the warm-up's prompts (prefix-cache hits)
            argv += ["--warmup-request-count", str(self.warmup_request_count),
                     "--num-dataset-entries", str(self.request_count + self.warmup_request_count)]
        # --no-server-metrics: AIPerf would scrape the measured server's /metrics all along and export them, which
        # nothing reads (the backend takes its counters itself), and wait ~2 s at the end for a last scrape
        argv += ["--random-seed", str(self.seed), "--ui", "none", "--no-gpu-telemetry", "--no-server-metrics",
                 "--export-level", "records", "--artifact-dir", str(artifact_dir)]
        if self.request_timeout_s:
            argv += ["--request-timeout-seconds", f"{self.request_timeout_s:g}"]
        return argv + list(self.extra_flags)


def tokenizer_hub_alias(tokenizer_dir: Path, cache_dir: Path) -> str:
    """A hub repo id for a local tokenizer, linked into the hub cache at `cache_dir` (run AIPerf with
    HF_HUB_CACHE=cache_dir and HF_HUB_OFFLINE=1).

    AIPerf 0.13.0 decodes hash-id prompts in worker processes that force HF_HUB_OFFLINE and resolve the tokenizer
    with snapshot_download(local_files_only=True), which refuses a local path (dataset/generator/
    parallel_decode.py): ten or more replayed requests fail with BrokenProcessPool. A cached repo resolves."""
    tokenizer_dir = tokenizer_dir.resolve()
    if not tokenizer_dir.is_dir():
        return str(tokenizer_dir)  # a hub id already: AIPerf resolves it itself
    digest = hashlib.sha256(str(tokenizer_dir).encode()).hexdigest()[:12]
    repo = f"topotune/tokenizer-{digest}"
    root = cache_dir / f"models--topotune--tokenizer-{digest}"
    snapshot = root / "snapshots" / _HUB_REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(_HUB_REVISION)
    for item in tokenizer_dir.iterdir():
        link = snapshot / item.name
        if item.suffix in (".safetensors", ".bin", ".pt", ".gguf") or link.is_symlink() or link.exists():
            continue  # the weights are not needed to tokenize
        link.symlink_to(item)
    return repo


class AiperfError(Exception):
    """The summary is missing or unreadable (AIPerf writes none when every request failed)."""


@dataclass(frozen=True)
class AiperfSummary:
    """The figures topotune reads from profile_export_aiperf.json (latencies in ms)."""

    request_throughput_rps: float
    output_tok_s: float
    total_tok_s: float
    ttft_ms: dict[str, float]
    itl_ms: dict[str, float]
    completed: int
    error_rate: float  # fraction in [0, 1]
    error_summary: tuple[str, ...]
    input_tokens_mean: float
    benchmark_duration_s: float
    # for the per-user speed when the stream came back in one chunk (see per_user_speed)
    request_latency_ms: dict[str, float] = field(default_factory=dict)
    output_tokens_mean: float = 0.0
    chunks_per_request_p50: float | None = None  # None: this AIPerf does not report http_req_chunks_received

    @property
    def stream_coalesced(self) -> bool:
        """The client saw no token-by-token stream: ITL 0 (every token in the first chunk) or the median
        request in one chunk. A loaded machine does this: the server generates token by token, the reader
        gets them all at once, so time_to_first_token == request_latency and ITL carries no information."""
        if self.itl_ms["avg"] <= 0:
            return True
        return self.chunks_per_request_p50 is not None and self.chunks_per_request_p50 <= 1


@dataclass(frozen=True)
class PerUserSpeed:
    """Generated tokens/s one user sees at a level, and the ITL figures consistent with it."""

    tok_s: float
    itl_ms_mean: float
    itl_ms_p50: float
    itl_ms_p99: float
    coalesced: bool
    itl_ms_p90: float = 0.0


def per_user_speed(summary: AiperfSummary) -> PerUserSpeed:
    """1000 / mean ITL from a real stream. From a coalesced one, the bound the client did observe: output
    tokens over the whole request latency (prefill included, so never faster than the truth), and ITL as
    request latency / output tokens (never better than the truth, so an ITL limit is not passed by accident).
    Zero only when no token came back."""
    itl = summary.itl_ms
    if not summary.stream_coalesced:
        return PerUserSpeed(tok_s=1000.0 / itl["avg"], itl_ms_mean=itl["avg"], itl_ms_p50=itl["p50"],
                            itl_ms_p99=itl["p99"], coalesced=False, itl_ms_p90=itl.get("p90", itl["p99"]))
    tokens = summary.output_tokens_mean
    latency = summary.request_latency_ms
    if tokens <= 0 or latency.get("avg", 0.0) <= 0:
        return PerUserSpeed(tok_s=0.0, itl_ms_mean=itl["avg"], itl_ms_p50=itl["p50"], itl_ms_p99=itl["p99"],
                            coalesced=True, itl_ms_p90=itl.get("p90", itl["p99"]))
    bound = {k: max(itl.get(k, itl["p99"]), latency.get(k, latency["avg"]) / tokens)
             for k in ("avg", "p50", "p90", "p99")}
    return PerUserSpeed(tok_s=1000.0 * tokens / latency["avg"], itl_ms_mean=bound["avg"], itl_ms_p50=bound["p50"],
                        itl_ms_p99=bound["p99"], coalesced=True, itl_ms_p90=bound["p90"])


def _metric(data: dict, key: str) -> dict:
    value = data.get(key)
    return value if isinstance(value, dict) else {}


def _errors(summary: object) -> tuple[str, ...]:
    if not isinstance(summary, list):
        return ()
    out = []
    for entry in summary:
        if isinstance(entry, dict):
            detail = entry.get("error_details") or entry
            count = entry.get("count", "")
            out.append(f"{count} x {json.dumps(detail, default=str)[:300]}".strip())
        else:
            out.append(str(entry)[:300])
    return tuple(out)


def read_summary(path: Path) -> AiperfSummary:
    """Parse AIPerf's summary; `path` is the file or the artifact dir holding it."""
    file = path / SUMMARY_FILE if path.is_dir() else path
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError as exc:
        raise AiperfError(f"no {SUMMARY_FILE} in {file.parent} (AIPerf writes none when every request fails)") \
            from exc
    except json.JSONDecodeError as exc:
        raise AiperfError(f"{file} is not valid JSON: {exc}") from exc
    rps = float(_metric(data, "request_throughput").get("avg", 0.0))
    output = float(_metric(data, "output_token_throughput").get("avg", 0.0))
    isl_mean = float(_metric(data, "input_sequence_length").get("avg", 0.0))
    total = _metric(data, "total_token_throughput").get("avg")
    completed = int(_metric(data, "completed_request_count").get("avg", _metric(data, "request_count").get("avg", 0)))
    errors = _errors(data.get("error_summary"))
    err_metric = _metric(data, "request_error_rate")
    if err_metric:
        rate = float(err_metric.get("avg", 0.0))
        rate = rate / 100.0 if err_metric.get("unit") == "%" else rate
    else:
        failed = int(_metric(data, "error_request_count").get("avg", 0))
        rate = failed / (failed + completed) if failed + completed else 1.0
    pct = ("avg", "p50", "p90", "p99")
    return AiperfSummary(
        request_throughput_rps=rps, output_tok_s=output,
        total_tok_s=float(total) if total is not None else output + rps * isl_mean,
        ttft_ms={k: float(_metric(data, "time_to_first_token").get(k, 0.0)) for k in pct},
        itl_ms={k: float(_metric(data, "inter_token_latency").get(k, 0.0)) for k in pct},
        completed=completed, error_rate=min(1.0, max(0.0, rate)), error_summary=errors,
        input_tokens_mean=isl_mean, benchmark_duration_s=float(_metric(data, "benchmark_duration").get("avg", 0.0)),
        request_latency_ms={k: float(_metric(data, "request_latency").get(k, 0.0)) for k in pct},
        output_tokens_mean=float(_metric(data, "output_sequence_length").get("avg", 0.0)),
        chunks_per_request_p50=_optional_float(_metric(data, "http_req_chunks_received").get("p50")))


def _optional_float(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True)
class RequestRecords:
    """The measured phase's requests from AIPerf's per-request export (warm-up and failed requests left out)."""

    path: Path
    ttft_ms: np.ndarray
    itl_ms: np.ndarray  # each request's mean inter-token latency (requests with two tokens or more)
    latency_ms: np.ndarray  # of the requests itl_ms holds, in the same order
    output_tokens: np.ndarray  # likewise
    failed: int

    @property
    def completed(self) -> int:
        return len(self.ttft_ms)


def _value(metrics: dict, key: str) -> float | None:
    entry = metrics.get(key)
    value = entry.get("value") if isinstance(entry, dict) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def read_records(path: Path) -> RequestRecords | None:
    """Parse profile_export.jsonl (`path`: the file or the artifact dir); None when AIPerf wrote none. A line
    that is not a record (truncated by a killed run) is skipped, not fatal: the summary stays the fallback."""
    file = path / RECORDS_FILE if path.is_dir() else path
    if not file.is_file():
        return None
    ttft: list[float] = []
    itl: list[float] = []
    latency: list[float] = []
    tokens: list[float] = []
    failed = 0
    with file.open("rb") as handle:
        for raw in handle:
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if not isinstance(row, dict):
                continue
            meta = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
            if meta.get("benchmark_phase", "profiling") != "profiling":
                continue
            if row.get("error") or meta.get("was_cancelled"):
                failed += 1
                continue
            metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
            first = _value(metrics, "time_to_first_token")
            if first is None:
                failed += 1
                continue
            ttft.append(first)
            gap, total, count = (_value(metrics, "inter_token_latency"), _value(metrics, "request_latency"),
                                 _value(metrics, "output_sequence_length"))
            if gap is not None and total is not None and count is not None and count >= 2:
                itl.append(gap)
                latency.append(total)
                tokens.append(count)
    return RequestRecords(path=file, ttft_ms=np.asarray(ttft), itl_ms=np.asarray(itl),
                          latency_ms=np.asarray(latency), output_tokens=np.asarray(tokens), failed=failed)


_QUANTILES = (0.5, 0.9, 0.99)


def _percentiles(samples: np.ndarray) -> tuple[dict[float, float], tuple[float, ...]]:
    """p50/p90/p99 and the sketch at SKETCH_PROBABILITIES (numpy's linear quantiles, as the simulator's)."""
    probs = np.array([*_QUANTILES, *SKETCH_PROBABILITIES])
    values = np.quantile(samples, probs).tolist()
    return dict(zip(_QUANTILES, values[:3], strict=True)), tuple(values[3:])


def to_serving_metrics(summary: AiperfSummary, *, concurrency: int, num_gpus: int, isl: int, osl: int,
                       max_concurrency: float, running_requests: float = 0.0, records: RequestRecords | None = None,
                       offered_rps: float | None = None, prefix_hit_share: float = 0.0) -> ServingMetrics:
    """The shared schema: per-GPU figures over every GPU of the deployment; tok/s per user from per_user_speed.

    Percentiles and sketches come from the per-request records when AIPerf wrote them (the SLA's attainment is
    read from the sketch), else from the summary (no sketch). A coalesced stream's ITL samples are the bound
    per_user_speed uses, request by request: latency / output tokens."""
    speed = per_user_speed(summary)
    ttft = {0.5: summary.ttft_ms["p50"], 0.9: summary.ttft_ms.get("p90", summary.ttft_ms["p99"]),
            0.99: summary.ttft_ms["p99"]}
    itl = {0.5: speed.itl_ms_p50, 0.9: speed.itl_ms_p90, 0.99: speed.itl_ms_p99}
    ttft_sketch: tuple[float, ...] = ()
    itl_sketch: tuple[float, ...] = ()
    if records is not None and records.completed:
        ttft, ttft_sketch = _percentiles(records.ttft_ms)
        if len(records.itl_ms):
            samples = records.itl_ms
            if speed.coalesced:
                samples = np.maximum(samples, records.latency_ms / records.output_tokens)
            itl, itl_sketch = _percentiles(samples)
    return ServingMetrics(
        concurrency=concurrency, num_gpus=num_gpus, isl=isl, osl=osl,
        total_tok_s=summary.total_tok_s, output_tok_s=summary.output_tok_s,
        total_tok_s_per_gpu=summary.total_tok_s / num_gpus, output_tok_s_per_gpu=summary.output_tok_s / num_gpus,
        tok_s_per_user=speed.tok_s, stream_coalesced=speed.coalesced,
        ttft_ms_mean=summary.ttft_ms["avg"], ttft_ms_p50=ttft[0.5], ttft_ms_p90=ttft[0.9], ttft_ms_p99=ttft[0.99],
        itl_ms_mean=speed.itl_ms_mean, itl_ms_p50=itl[0.5], itl_ms_p90=itl[0.9], itl_ms_p99=itl[0.99],
        ttft_ms_sketch=ttft_sketch, itl_ms_sketch=itl_sketch, offered_rps=offered_rps,
        prefix_hit_share=min(1.0, max(0.0, prefix_hit_share)),
        request_throughput_rps=summary.request_throughput_rps, max_concurrency=max(0.0, max_concurrency),
        running_requests=running_requests, error_rate=summary.error_rate)
