"""The gaps between consecutive streamed chunks of a request, pooled over the measured requests: what
`vllm bench serve` reports as ITL (mean, median, p99), beside the per-request ITL (AIPerf's) the report keeps.

How vLLM's benchmark measures it (vLLM 0.32, vllm/benchmarks/lib/endpoint_request_func.py,
`async_request_openai_completions` and `..._chat_completions`): one timestamp per SSE `data:` event that carries
`choices` (the usage-only event and [DONE] take none); the first sets TTFT, each later one appends its gap to the
previous to `output.itl`. vllm/benchmarks/serve.py `calculate_metrics` pools every request's list (`itls +=
output.itl`) and takes np.mean / np.median / np.percentile over it, while TPOT is per request, (latency - ttft) /
(output_len - 1). So a request of n chunks gives n - 1 gaps: a long request weighs more, and a step that carries
another request's prefill chunk is one gap among many, where the per-request ITL averages it into every token.

What the server streams (vLLM 0.32 vllm/v1/engine/output_processor.py `RequestState.make_request_output`): with
stream_interval 1, one event per engine step that gives the request new tokens, however many (MTP's accepted
drafts arrive with the sampled token in one event); with stream_interval S > 1, the first token at once, then an
event once S tokens are unsent, and the last tokens when the request finishes.

So the replay counts, per engine, each step's duration once for every measured request that got a token in it and
in the step before (`runs`: a closed-form stretch of k steps is one entry, its step times linear), and the other
gaps one by one (`single`: a request that a step skipped, as when a prefill chunk ahead of it took the token budget,
or that was preempted and recomputed). For S = 1 that is exact. For S > 1 it is approximate: a request's gap is
taken as ceil(S / accepted tokens per step) consecutive steps ending at each step, the requests' phases spread
evenly, and a one-by-one gap as itself plus that many average steps less one; the shorter last chunk is not counted.
"""

from __future__ import annotations

import math

import numpy as np

from tuner.replay._report import Percentiles


class TokenGaps:
    """One engine's chunk gaps of measured requests, as weighted step durations (see the module doc)."""

    __slots__ = ("runs", "single", "steps_per_chunk")

    def __init__(self, stream_interval: int = 1, accepted: float = 1.0) -> None:
        self.steps_per_chunk = 1 if stream_interval <= 1 else max(1, math.ceil(stream_interval / accepted - 1e-9))
        # (first step ms, growth per step ms, first step index, steps, gaps per step): the steps' times are
        # first + growth * i for i in [index, index + steps)
        self.runs: list[tuple[float, float, int, int, int]] = []
        self.single: list[float] = []

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(gap ms, how many gaps of that length) over the engine's steps, expanded."""
        if not self.runs and not self.single:
            return np.zeros(0), np.zeros(0)
        runs = np.array(self.runs, dtype=float).reshape(-1, 5)
        steps = runs[:, 3].astype(np.int64)
        total = int(steps.sum())
        starts = np.repeat(np.cumsum(steps) - steps, steps)
        index = np.arange(total) - starts + np.repeat(runs[:, 2], steps)
        durations = np.repeat(runs[:, 0], steps) + np.repeat(runs[:, 1], steps) * index
        weights = np.repeat(runs[:, 4], steps)
        single = np.asarray(self.single, dtype=float)
        m = self.steps_per_chunk
        if m == 1:
            return np.concatenate([durations, single]), np.concatenate([weights, np.ones(len(single))])
        summed = np.cumsum(durations)
        window = summed - np.concatenate([np.zeros(m), summed[:-m]])[:total]  # the m steps ending at each
        mean = float(durations @ weights / weights.sum()) if weights.sum() > 0 else 0.0
        return (np.concatenate([window, single + (m - 1) * mean]),
                np.concatenate([weights / m, np.full(len(single), 1.0 / m)]))


def token_gap_percentiles(engines: list[TokenGaps]) -> Percentiles:
    """The pooled chunk gaps of every engine (vllm bench serve's ITL mean / p50 / p90 / p99)."""
    parts = [g.arrays() for g in engines]
    return Percentiles.weighted(np.concatenate([v for v, _ in parts]), np.concatenate([w for _, w in parts]))
