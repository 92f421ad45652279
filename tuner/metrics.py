"""The one metrics schema every backend (simulated, vllm) reports, and the frontier reads."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

#: The latency percentiles a sketch answers and an SLA may bound.
Percentile = Literal["p50", "p90", "p99"]
PERCENTILES: tuple[str, ...] = get_args(Percentile)

# Probabilities of the latency sketches a point carries (what an SLA's attainment is read from).
SKETCH_PROBABILITIES: tuple[float, ...] = (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65,
                                           0.7, 0.75, 0.8, 0.85, 0.9, 0.95, 0.99)


def level_load(offered_rps: float | None, concurrency: int) -> float:
    """The load a point was measured at, as one number: its offered rate (open loop), else its clients. What
    orders a trial's load levels and matches them to a workload's levels; it takes the two fields so a stored
    level (tuner.study's LoadLevel) is ordered without parsing its metrics."""
    return float(offered_rps) if offered_rps is not None else float(concurrency)


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
    # p90 and the sketches came with request mixes; points stored before them read p90 as their p99 (an upper
    # bound) and an empty sketch (attainment from p50/p90/p99).
    ttft_ms_p90: float | None = Field(None, ge=0)
    itl_ms_p90: float | None = Field(None, ge=0)
    ttft_ms_sketch: tuple[float, ...] = Field((), description="TTFT at SKETCH_PROBABILITIES (per request)")
    itl_ms_sketch: tuple[float, ...] = Field((), description="per-request mean ITL at SKETCH_PROBABILITIES")
    offered_rps: float | None = Field(None, ge=0, description="open loop: the request rate sent (None: closed loop)")
    prefix_hit_share: float = Field(0.0, ge=0, le=1, description="input tokens served from the prefix cache")
    sla_attainment: float = Field(1.0, ge=0, le=1, description="share of requests within the study's SLA")
    # A simulated trial's replay (tuner/replay, request by request through vLLM's scheduler) under the trial's SLA:
    # the share of its requests whose TTFT and ITL both met it (not read off independent sketches). None: not
    # replayed (a measured run, or no SLA).
    replayed_sla_attainment: float | None = Field(None, ge=0, le=1, description="share of the replayed requests "
                                                  "within the SLA (simulated trials)")

    @property
    def load(self) -> float:
        """The load it was measured at (level_load): what orders a trial's levels."""
        return level_load(self.offered_rps, self.concurrency)

    @property
    def goodput_tok_s_per_gpu(self) -> float:
        """Total tokens/s per GPU of the requests that meet the SLA (all of them when there is none)."""
        return self.total_tok_s_per_gpu * self.sla_attainment

    def within_sla(self, *, max_ttft_ms: float | None, max_itl_ms: float | None) -> ServingMetrics:
        """This point with its SLA attainment set (the study's bounds; None lifts a bound)."""
        return self.model_copy(update={"sla_attainment": self.share_within(max_ttft_ms=max_ttft_ms,
                                                                            max_itl_ms=max_itl_ms)})
    request_throughput_rps: float = Field(ge=0)
    max_concurrency: float = Field(ge=0, description="requests the KV cache holds at once (whole deployment)")
    running_requests: float = Field(0, ge=0, description="requests actually running (the rest queue)")
    error_rate: float = Field(0.0, ge=0, le=1)
    stream_coalesced: bool = Field(False, description="tokens arrived in one chunk: speed and ITL are bounds")

    def ttft_ms_at(self, percentile: str) -> float:
        return _at(percentile, self.ttft_ms_p50, self.ttft_ms_p90, self.ttft_ms_p99)

    def itl_ms_at(self, percentile: str) -> float:
        return _at(percentile, self.itl_ms_p50, self.itl_ms_p90, self.itl_ms_p99)

    def share_within(self, *, max_ttft_ms: float | None = None, max_itl_ms: float | None = None) -> float:
        """Share of requests whose TTFT and ITL both meet the bounds (the two taken as independent)."""
        share = 1.0
        if max_ttft_ms is not None:
            share *= _cdf(max_ttft_ms, self.ttft_ms_sketch, self.ttft_ms_p50, self.ttft_ms_p90, self.ttft_ms_p99)
        if max_itl_ms is not None and self.osl > 1:
            share *= _cdf(max_itl_ms, self.itl_ms_sketch, self.itl_ms_p50, self.itl_ms_p90, self.itl_ms_p99)
        return share

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


def _at(percentile: str, p50: float, p90: float | None, p99: float) -> float:
    if percentile == "p50":
        return p50
    if percentile == "p90":
        return p99 if p90 is None else p90
    if percentile == "p99":
        return p99
    raise ValueError(f"unknown percentile {percentile!r} (p50, p90 or p99)")


def _cdf(bound: float, sketch: Sequence[float], p50: float, p90: float | None, p99: float) -> float:
    """P(value <= bound), read off the sketch (else p50/p90/p99) by linear interpolation between its points."""
    if sketch:
        probs, values = SKETCH_PROBABILITIES, sketch
    else:
        probs, values = (0.5, 0.9, 0.99), (p50, p99 if p90 is None else p90, p99)
    if bound >= values[-1]:
        return 1.0  # the tail past the last point is read as met: the sketch's last point is p99
    if bound < values[0]:
        return 0.0
    for (p_lo, v_lo), (p_hi, v_hi) in zip(zip(probs, values, strict=True), zip(probs[1:], values[1:], strict=True),
                                          strict=True):
        if v_lo <= bound < v_hi:
            return p_lo + (p_hi - p_lo) * (bound - v_lo) / (v_hi - v_lo)
    return probs[-1]
