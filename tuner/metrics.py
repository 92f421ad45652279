"""The one metrics schema every backend (simulated, vllm) reports, and the frontier reads."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ServingMetrics(BaseModel):
    """What one deployment did at one concurrency level, for one workload.

    Per-GPU figures divide by every GPU of the deployment (prefill and decode together), as the campaign did.
    tok_s_per_user is generated tokens/s seen by one user: 1000 / mean ITL, or, when the measured stream came
    back coalesced (no inter-token timing, `stream_coalesced`), output tokens / request latency, a lower bound.
    """

    model_config = ConfigDict(frozen=True)

    concurrency: int = Field(ge=1)
    num_gpus: int = Field(ge=1)
    isl: int = Field(ge=1)
    osl: int = Field(ge=1)
    total_tok_s: float = Field(ge=0, description="(input + output) tokens/s of the whole deployment")
    output_tok_s: float = Field(ge=0)
    total_tok_s_per_gpu: float = Field(ge=0)
    output_tok_s_per_gpu: float = Field(ge=0)
    tok_s_per_user: float = Field(ge=0, description="1000 / mean ITL in ms (a lower bound when stream_coalesced)")
    ttft_ms_mean: float = Field(ge=0)
    ttft_ms_p50: float = Field(ge=0)
    ttft_ms_p99: float = Field(ge=0)
    itl_ms_mean: float = Field(ge=0)
    itl_ms_p50: float = Field(ge=0)
    itl_ms_p99: float = Field(ge=0)
    request_throughput_rps: float = Field(ge=0)
    max_concurrency: float = Field(ge=0, description="requests the KV cache holds at once (whole deployment)")
    running_requests: float = Field(0, ge=0, description="requests actually running (the rest queue)")
    error_rate: float = Field(0.0, ge=0, le=1)
    stream_coalesced: bool = Field(False, description="tokens arrived in one chunk: speed and ITL are bounds")

    @classmethod
    def from_rates(cls, *, concurrency: int, num_gpus: int, isl: int, osl: int, request_rps: float,
                   ttft_ms: float, itl_ms: float, max_concurrency: float, running: float,
                   ttft_ms_p99: float | None = None, itl_ms_p99: float | None = None) -> ServingMetrics:
        """Build from a request rate and latencies (the simulator's view; p50 = mean there)."""
        total = request_rps * (isl + osl)
        output = request_rps * osl
        return cls(concurrency=concurrency, num_gpus=num_gpus, isl=isl, osl=osl, total_tok_s=total,
                   output_tok_s=output, total_tok_s_per_gpu=total / num_gpus, output_tok_s_per_gpu=output / num_gpus,
                   tok_s_per_user=1000.0 / itl_ms if itl_ms > 0 else 0.0, ttft_ms_mean=ttft_ms, ttft_ms_p50=ttft_ms,
                   ttft_ms_p99=ttft_ms_p99 if ttft_ms_p99 is not None else ttft_ms, itl_ms_mean=itl_ms,
                   itl_ms_p50=itl_ms, itl_ms_p99=itl_ms_p99 if itl_ms_p99 is not None else itl_ms,
                   request_throughput_rps=request_rps, max_concurrency=max_concurrency, running_requests=running)
