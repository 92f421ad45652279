"""Aggregated serving: one vLLM instance runs prefill and decode together with chunked prefill.

vLLM's scheduler (V1) fills each step's token budget (`max_num_batched_tokens`) with the running requests'
decode tokens first, then with chunks of waiting prompts. In steady state with `r` requests per DP rank, let
`x` be the requests that start per step. Each spends `n_dec = (osl - 1) / a` steps decoding (a = accepted
tokens per step with MTP; the prefill's last chunk yields the first token) and `n_chunk = isl / chunk` steps
prefilling, so `r = x (n_dec + n_chunk)` (Little's law in steps), `d = x n_dec` requests decode in a step and
`x isl` prompt tokens are prefilled per step, never more than the budget left after the decode tokens. A step
carries a chunk with probability `f = x isl / chunk`; the mean step is `f T(d, chunk) + (1 - f) T(d, 0)`, and
every decoding request waits for it: the ITL includes the prefill work, which a PD decode instance never sees.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tuner.perf._steps import MixedStep

StepFn = Callable[[float, float], MixedStep]  # (decode requests per rank, chunk tokens per rank) -> step


@dataclass(frozen=True, slots=True)
class AggregatedPoint:
    """The steady state of one DP rank of an aggregated instance."""

    running_per_rank: float  # requests holding KV on the rank (decoding, prefilling)
    decode_requests: float  # decoding in a step
    starts_per_step: float  # x: requests admitted (and finished) per step
    chunk_tokens: float  # prompt tokens of a step that carries prefill
    chunk_share: float  # f: share of steps that carry prefill
    prefill_steps: float  # steps one prompt takes to prefill
    decode_steps: float  # steps one request decodes for
    mean_step_ms: float
    chunk_step_ms: float  # a step with a prefill chunk

    @property
    def requests_per_s(self) -> float:
        return self.starts_per_step / (self.mean_step_ms / 1e3)

    @property
    def service_ms(self) -> float:
        """One request's time on the GPU: its prefill chunks, then its decode steps."""
        return self.prefill_steps * self.chunk_step_ms + self.decode_steps * self.mean_step_ms


def solve_aggregated(step: StepFn, *, requests_per_rank: float, isl: int, osl: int, accepted: float,
                     tokens_per_request: int, token_budget: int, iterations: int = 6) -> AggregatedPoint:
    """Fixed point of the scheduler's steady state (a few damped iterations; cheap and monotone in practice)."""
    r = float(requests_per_rank)
    n_dec = max(osl - 1, 0) / accepted
    d = r * n_dec / (n_dec + 1.0)
    x = chunk = 0.0
    n_chunk = 1.0
    for _ in range(iterations):
        free = max(1.0, token_budget - d * tokens_per_request)
        chunk = min(float(isl), free)
        n_chunk = isl / chunk
        x = min(r / (n_dec + n_chunk), free / isl)  # the budget caps how fast prompts enter
        d = 0.5 * (d + x * n_dec)
    d = x * n_dec
    prefill_tokens = x * isl
    chunk = max(chunk, prefill_tokens)  # short prompts: several fit one step
    share = prefill_tokens / chunk if chunk > 0 else 0.0
    with_chunk = step(d, chunk).step_ms
    plain = step(d, 0.0).step_ms if share < 1.0 and d > 0 else with_chunk
    mean = share * with_chunk + (1.0 - share) * plain
    return AggregatedPoint(running_per_rank=r, decode_requests=d, starts_per_step=x, chunk_tokens=chunk,
                           chunk_share=share, prefill_steps=n_chunk, decode_steps=n_dec, mean_step_ms=mean,
                           chunk_step_ms=with_chunk)
