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


@dataclass(frozen=True, slots=True)
class BurstRun:
    """`prompts` requests sent at once to one DP rank (`vllm bench serve --request-rate inf`), start to finish.

    Prompts are admitted over `admission_steps` (at the steady state's rate while some wait for KV space, else as
    fast as the token budget allows); once the queue is empty the last requests decode alone: `flat_steps` with
    every request decoding (all admitted before the first finished), then `tail_steps` while they finish one
    after another (the decoding count falls linearly to 0). Those decode-only steps are short, so a burst
    lasts longer than its steady state and its mean TPOT is lower than the steady step.
    """

    prompts: float
    admission_steps: float
    admission_step_ms: float
    admission_decoding: float  # mean requests decoding during admission
    flat_steps: float
    flat_step_ms: float
    tail_steps: float
    tail_step_ms: float
    tail_peak: float  # requests decoding when the tail starts
    decode_steps: float  # steps one request decodes for
    prefill_ms: float  # one prompt's own prefill steps

    @property
    def duration_ms(self) -> float:
        return (self.admission_steps * self.admission_step_ms + self.flat_steps * self.flat_step_ms
                + self.tail_steps * self.tail_step_ms)

    @property
    def tpot_ms(self) -> float:
        """Mean over requests of the steps they decode in (each step weighted by the requests decoding in it)."""
        weighted = (self.admission_decoding * self.admission_steps * self.admission_step_ms
                    + self.prompts * self.flat_steps * self.flat_step_ms
                    + self.tail_peak * self.tail_steps / 2 * self.tail_step_ms)
        tokens = self.prompts * self.decode_steps
        return weighted / tokens if tokens > 0 else self.admission_step_ms

    @property
    def ttft_ms(self) -> float:
        """Prompts wait on average half the admission phase, then prefill."""
        return self.admission_steps / 2 * self.admission_step_ms + self.prefill_ms


def solve_burst(step: StepFn, point: AggregatedPoint, *, prompts: float, isl: int, token_budget: int,
                tokens_per_request: int = 1) -> BurstRun:
    """The finite run of `prompts` requests on one DP rank, from its steady state `point` (two more steps)."""
    n_dec = point.decode_steps
    if prompts > point.running_per_rank + 1e-9:  # a queue for KV space: prompts enter as requests finish
        rate, adm_ms = point.starts_per_step, point.mean_step_ms
    else:  # every prompt fits at once: they enter as fast as the budget left by the decoding ones allows
        decoding = min(point.decode_requests, prompts / 2) * tokens_per_request
        rate, adm_ms = max(1.0, token_budget - decoding) / isl, point.chunk_step_ms
    admission = prompts / rate
    if admission >= n_dec:
        flat, tail, peak = 0.0, n_dec, rate * n_dec
        decoding = rate * (admission * n_dec - n_dec * n_dec / 2) / admission
    else:
        flat, tail, peak = n_dec - admission, admission, prompts
        decoding = prompts / 2
    flat_ms = step(prompts, 0.0).step_ms if flat > 0 else 0.0
    tail_ms = step(peak / 2, 0.0).step_ms if tail > 0 and peak > 0 else 0.0
    return BurstRun(prompts=prompts, admission_steps=admission, admission_step_ms=adm_ms,
                    admission_decoding=decoding, flat_steps=flat, flat_step_ms=flat_ms, tail_steps=tail,
                    tail_step_ms=tail_ms, tail_peak=peak, decode_steps=n_dec,
                    prefill_ms=point.prefill_steps * point.chunk_step_ms)
