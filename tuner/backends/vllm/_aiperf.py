"""AIPerf: the argv for one concurrency level, and its summary JSON turned into the shared ServingMetrics.

Flags are the ones measured to work against vLLM (aiperf 0.13.0): streaming completions with fixed ISL/OSL,
`ignore_eos` so every request generates exactly OSL tokens, and `--use-server-token-count` (re-tokenizing a
random model's output miscounts). AIPerf must NOT run with HF_HUB_OFFLINE: it then sends a local --tokenizer
path to snapshot_download and fails.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
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
        input_tokens_mean=isl_mean, benchmark_duration_s=float(_metric(data, "benchmark_duration").get("avg", 0.0)))


def to_serving_metrics(summary: AiperfSummary, *, concurrency: int, num_gpus: int, isl: int, osl: int,
                       max_concurrency: float, running_requests: float = 0.0) -> ServingMetrics:
    """The shared schema: per-GPU figures over every GPU of the deployment; tok/s per user = 1000 / mean ITL."""
    itl = summary.itl_ms["avg"]
    return ServingMetrics(
        concurrency=concurrency, num_gpus=num_gpus, isl=isl, osl=osl,
        total_tok_s=summary.total_tok_s, output_tok_s=summary.output_tok_s,
        total_tok_s_per_gpu=summary.total_tok_s / num_gpus, output_tok_s_per_gpu=summary.output_tok_s / num_gpus,
        tok_s_per_user=1000.0 / itl if itl > 0 else 0.0,
        ttft_ms_mean=summary.ttft_ms["avg"], ttft_ms_p50=summary.ttft_ms["p50"], ttft_ms_p99=summary.ttft_ms["p99"],
        itl_ms_mean=itl, itl_ms_p50=summary.itl_ms["p50"], itl_ms_p99=summary.itl_ms["p99"],
        request_throughput_rps=summary.request_throughput_rps, max_concurrency=max(0.0, max_concurrency),
        running_requests=running_requests, error_rate=summary.error_rate)
