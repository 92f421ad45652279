"""AIPerf: the argv for one concurrency level, and its summary JSON turned into the shared ServingMetrics.

Flags are the ones measured to work against vLLM (aiperf 0.13.0): streaming completions with fixed ISL/OSL,
`ignore_eos` so every request generates exactly OSL tokens, and `--use-server-token-count` (re-tokenizing a
random model's output miscounts). AIPerf must NOT run with HF_HUB_OFFLINE: it then sends a local --tokenizer
path to snapshot_download and fails.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from tuner.metrics import ServingMetrics

SUMMARY_FILE = "profile_export_aiperf.json"


class AiperfRun(BaseModel):
    """One AIPerf invocation: one concurrency level against one endpoint."""

    model_config = ConfigDict(frozen=True)

    aiperf_argv: tuple[str, ...] = ("aiperf",)
    model: str
    tokenizer: str
    url: str
    isl: int = Field(ge=1)
    osl: int = Field(ge=1)
    concurrency: int = Field(ge=1)
    request_count: int = Field(ge=1)
    warmup_request_count: int = Field(0, ge=0)
    seed: int = 0
    request_timeout_s: float | None = None
    extra_flags: tuple[str, ...] = ()

    def argv(self, artifact_dir: Path) -> list[str]:
        argv = [*self.aiperf_argv, "profile", "--model", self.model, "--tokenizer", self.tokenizer,
                "--url", self.url, "--endpoint-type", "completions", "--streaming",
                "--isl", str(self.isl), "--isl-stddev", "0", "--osl", str(self.osl),
                "--extra-inputs", "ignore_eos:true", "--use-server-token-count",
                "--concurrency", str(self.concurrency), "--request-count", str(self.request_count),
                "--warmup-request-count", str(self.warmup_request_count), "--random-seed", str(self.seed),
                "--ui", "none", "--no-gpu-telemetry", "--artifact-dir", str(artifact_dir)]
        if self.request_timeout_s:
            argv += ["--request-timeout-seconds", f"{self.request_timeout_s:g}"]
        return argv + list(self.extra_flags)


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


def per_user_speed(summary: AiperfSummary) -> PerUserSpeed:
    """1000 / mean ITL from a real stream. From a coalesced one, the bound the client did observe: output
    tokens over the whole request latency (prefill included, so never faster than the truth), and ITL as
    request latency / output tokens (never better than the truth, so an ITL limit is not passed by accident).
    Zero only when no token came back."""
    itl = summary.itl_ms
    if not summary.stream_coalesced:
        return PerUserSpeed(tok_s=1000.0 / itl["avg"], itl_ms_mean=itl["avg"], itl_ms_p50=itl["p50"],
                            itl_ms_p99=itl["p99"], coalesced=False)
    tokens = summary.output_tokens_mean
    latency = summary.request_latency_ms
    if tokens <= 0 or latency.get("avg", 0.0) <= 0:
        return PerUserSpeed(tok_s=0.0, itl_ms_mean=itl["avg"], itl_ms_p50=itl["p50"], itl_ms_p99=itl["p99"],
                            coalesced=True)
    bound = {k: max(itl[k], latency.get(k, latency["avg"]) / tokens) for k in ("avg", "p50", "p99")}
    return PerUserSpeed(tok_s=1000.0 * tokens / latency["avg"], itl_ms_mean=bound["avg"], itl_ms_p50=bound["p50"],
                        itl_ms_p99=bound["p99"], coalesced=True)


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


def to_serving_metrics(summary: AiperfSummary, *, concurrency: int, num_gpus: int, isl: int, osl: int,
                       max_concurrency: float, running_requests: float = 0.0) -> ServingMetrics:
    """The shared schema: per-GPU figures over every GPU of the deployment; tok/s per user from per_user_speed."""
    speed = per_user_speed(summary)
    return ServingMetrics(
        concurrency=concurrency, num_gpus=num_gpus, isl=isl, osl=osl,
        total_tok_s=summary.total_tok_s, output_tok_s=summary.output_tok_s,
        total_tok_s_per_gpu=summary.total_tok_s / num_gpus, output_tok_s_per_gpu=summary.output_tok_s / num_gpus,
        tok_s_per_user=speed.tok_s, stream_coalesced=speed.coalesced,
        ttft_ms_mean=summary.ttft_ms["avg"], ttft_ms_p50=summary.ttft_ms["p50"], ttft_ms_p99=summary.ttft_ms["p99"],
        itl_ms_mean=speed.itl_ms_mean, itl_ms_p50=speed.itl_ms_p50, itl_ms_p99=speed.itl_ms_p99,
        request_throughput_rps=summary.request_throughput_rps, max_concurrency=max(0.0, max_concurrency),
        running_requests=running_requests, error_rate=summary.error_rate)
