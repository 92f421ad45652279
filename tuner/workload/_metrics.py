"""A running vLLM's traffic, read from its Prometheus metrics: the counters' and histograms' increase over a window.

vLLM exports (v1/metrics/loggers.py, PrometheusStatLogger.__init__ and .record, labels model_name and engine):
- per finished request: `vllm:request_prompt_tokens` and `vllm:request_generation_tokens` (histograms, buckets
  1-2-5 x 10^k up to --max-model-len: v1/metrics/buckets.py build_1_2_5_buckets, unless
  --custom-histogram-buckets '{"request_tokens": [...]}' gives finer ones), `vllm:request_success_total` (by
  finished_reason) and `vllm:request_time_per_output_token_seconds` (its mean ITL);
- per token or step: `vllm:time_to_first_token_seconds`, `vllm:inter_token_latency_seconds` (every interval between
  two tokens of a request), `vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total` (tokens looked up and
  found when a request is scheduled), `vllm:num_preemptions_total`.

Everything here is pure: a scrape's text becomes `VllmCounters` (summed over engines, i.e. DP ranks, and over
servers), two scrapes become the window's increase, and `live_traffic` turns an increase into a Workload (the
lengths at the buckets' resolution, the request rate, the prefix-cache hit share) and the latencies measured in the
window. What the histograms cannot tell (arrival times, prefix structure) is in docs/workloads.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields

from prometheus_client.parser import text_string_to_metric_families

from tuner.errors import ConfigError
from tuner.workload._lengths import HistogramLengths
from tuner.workload._workload import PrefixSharing, Workload

# Histogram families this module reads (the name before _bucket/_sum/_count) and counters (before _total).
PROMPT_TOKENS = "vllm:request_prompt_tokens"
GENERATION_TOKENS = "vllm:request_generation_tokens"
TTFT_SECONDS = "vllm:time_to_first_token_seconds"
ITL_SECONDS = "vllm:inter_token_latency_seconds"
REQUEST_ITL_SECONDS = "vllm:request_time_per_output_token_seconds"
HISTOGRAMS = (PROMPT_TOKENS, GENERATION_TOKENS, TTFT_SECONDS, ITL_SECONDS, REQUEST_ITL_SECONDS)
REQUEST_SUCCESS = "vllm:request_success"
PREFIX_QUERIES = "vllm:prefix_cache_queries"
PREFIX_HITS = "vllm:prefix_cache_hits"
PREEMPTIONS = "vllm:num_preemptions"
COUNTERS = (REQUEST_SUCCESS, PREFIX_QUERIES, PREFIX_HITS, PREEMPTIONS)
# Gauges of the requests inside the engine at the last step (scheduler stats): a window's arrivals are the requests
# that finished in it plus the change in these.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
IN_FLIGHT = (RUNNING, WAITING)
#: finished_reason values that are not a served answer (vLLM's FinishReason: stop, length, abort, error, ...)
FAILED_REASONS = frozenset({"abort", "error"})
PERCENTILES = (0.5, 0.9, 0.99)


class MetricsError(ConfigError):
    """A metrics source that cannot give a workload: unreachable, not vLLM, reset, or no requests in the window."""


@dataclass(frozen=True)
class Histogram:
    """A Prometheus histogram: cumulative counts at ascending upper bounds (the last is +Inf), its sum and count."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]
    total: float
    count: float

    @classmethod
    def empty(cls, bounds: tuple[float, ...]) -> Histogram:
        return cls(bounds, (0.0,) * len(bounds), 0.0, 0.0)

    def plus(self, other: Histogram, *, source: str, name: str) -> Histogram:
        """Two servers' (or engines') histograms together; they must share buckets."""
        if self.bounds != other.bounds:
            raise MetricsError(f"{name} has different buckets on different servers or engines", field=source,
                               fix="give servers with the same --custom-histogram-buckets, or read them one at a time")
        return Histogram(self.bounds, tuple(a + b for a, b in zip(self.cumulative, other.cumulative, strict=True)),
                         self.total + other.total, self.count + other.count)

    def minus(self, earlier: Histogram, *, source: str, name: str) -> Histogram:
        """The increase since `earlier`; a bucket that went down means the server restarted in between."""
        if self.bounds != earlier.bounds:
            raise MetricsError(f"{name} changed its buckets between the two scrapes (the server restarted)",
                               field=source, fix="take a window that starts after the restart")
        counts = tuple(a - b for a, b in zip(self.cumulative, earlier.cumulative, strict=True))
        if min(counts, default=0.0) < 0 or self.count < earlier.count:
            raise _reset(source, name)
        return Histogram(self.bounds, counts, max(0.0, self.total - earlier.total), self.count - earlier.count)

    @property
    def bins(self) -> list[tuple[float, float, float]]:
        """(lower, upper, count) per bucket; the +Inf bucket's upper end is twice its lower one (a guess)."""
        out = []
        lower, below = 0.0, 0.0
        for bound, cum in zip(self.bounds, self.cumulative, strict=True):
            upper = bound if math.isfinite(bound) else max(2.0 * lower, 1.0)
            out.append((lower, upper, max(0.0, cum - below)))
            lower, below = upper, cum
        return out

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count > 0 else 0.0

    def share_at_most(self, value: float) -> float:
        """The share of observations <= value (linear inside a bucket, the inverse of `quantile`)."""
        if self.cumulative[-1] <= 0:
            return math.nan
        lower, below = 0.0, 0.0
        for bound, cum in zip(self.bounds, self.cumulative, strict=True):
            if value <= bound:
                inside = 0.0 if not math.isfinite(bound) else (value - lower) / (bound - lower)
                return (below + max(0.0, inside) * (cum - below)) / self.cumulative[-1]
            lower, below = bound, cum
        return 1.0

    def quantile(self, q: float) -> float:
        """Prometheus's histogram_quantile: linear inside the bucket the rank falls in (the +Inf bucket answers its
        lower bound, as Prometheus does)."""
        if self.count <= 0:
            return math.nan
        rank = q * self.cumulative[-1]
        lower, below = 0.0, 0.0
        for bound, cum in zip(self.bounds, self.cumulative, strict=True):
            if cum >= rank and cum > below:
                if not math.isfinite(bound):
                    return lower
                return lower + (bound - lower) * (rank - below) / (cum - below)
            lower, below = bound, cum
        return lower


def _reset(source: str, name: str) -> MetricsError:
    return MetricsError(f"{name} went down between the two scrapes: the server restarted (or a counter reset) inside "
                        "the window", field=source,
                        fix="scrape again for a window after the restart, or use --from-prometheus (increase() "
                            "handles resets)")


@dataclass(frozen=True)
class VllmCounters:
    """vLLM's traffic series at one time (a scrape) or their increase over a window, summed over engines and
    servers. Token histograms in tokens, latency histograms in seconds."""

    prompt_tokens: Histogram
    generation_tokens: Histogram
    ttft_s: Histogram
    itl_s: Histogram
    request_itl_s: Histogram | None  # per request mean ITL (vLLM >= 0.8); None when the server has no such series
    finished: float  # requests finished (every reason)
    failed: float  # of which aborted or errored
    prefix_queries: float
    prefix_hits: float
    preemptions: float
    in_flight: float = 0.0  # running + waiting (a gauge: in an increase, its change over the window)
    models: tuple[str, ...] = ()

    def plus(self, other: VllmCounters, *, source: str) -> VllmCounters:
        return _combine(self, other, lambda a, b, name: a.plus(b, source=source, name=name),
                        lambda a, b, _name: a + b)

    def minus(self, earlier: VllmCounters, *, source: str) -> VllmCounters:
        """The window's increase; a counter that went down is a reset (an error naming the source)."""
        def counter(a: float, b: float, name: str) -> float:
            if a < b and name != _SERIES_OF["in_flight"]:  # a gauge may go down
                raise _reset(source, name)
            return a - b

        return _combine(self, earlier, lambda a, b, name: a.minus(b, source=source, name=name), counter)


_SERIES_OF = {"prompt_tokens": PROMPT_TOKENS, "generation_tokens": GENERATION_TOKENS, "ttft_s": TTFT_SECONDS,
              "itl_s": ITL_SECONDS, "request_itl_s": REQUEST_ITL_SECONDS, "finished": f"{REQUEST_SUCCESS}_total",
              "failed": f"{REQUEST_SUCCESS}_total", "prefix_queries": f"{PREFIX_QUERIES}_total",
              "prefix_hits": f"{PREFIX_HITS}_total", "preemptions": f"{PREEMPTIONS}_total",
              "in_flight": f"{RUNNING} + {WAITING}"}


def _combine(a: VllmCounters, b: VllmCounters, hist: Callable[[Histogram, Histogram, str], Histogram],
             num: Callable[[float, float, str], float]) -> VllmCounters:
    """Field by field: histograms with `hist`, counters with `num` (each told the series' name for its errors);
    an optional histogram only one side has is dropped."""
    out: dict[str, object] = {}
    for f in fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if f.name == "models":
            out[f.name] = tuple(sorted({*x, *y}))
        elif isinstance(x, Histogram) and isinstance(y, Histogram):
            out[f.name] = hist(x, y, _SERIES_OF[f.name])
        elif isinstance(x, Histogram) or isinstance(y, Histogram):
            out[f.name] = None
        else:
            out[f.name] = num(x, y, _SERIES_OF[f.name])
    return VllmCounters(**out)  # type: ignore[arg-type]


def parse_exposition(text: str, source: str) -> VllmCounters:
    """One scrape of a vLLM server's /metrics (Prometheus text format), summed over its engines and models.

    A text without vLLM's request series is not a vLLM server (an error naming `source` and the fix)."""
    buckets: dict[str, dict[float, float]] = {name: {} for name in HISTOGRAMS}
    sums: dict[str, float] = dict.fromkeys(HISTOGRAMS, 0.0)
    counts: dict[str, float] = dict.fromkeys(HISTOGRAMS, 0.0)
    seen: set[str] = set()
    counters: dict[str, float] = dict.fromkeys(COUNTERS, 0.0)
    failed = 0.0
    in_flight = 0.0
    models: set[str] = set()
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError):  # the body is not echoed: a watch may point anywhere
        raise MetricsError("the endpoint does not answer Prometheus text format", field=source,
                           fix="give a vLLM server's /metrics URL, e.g. http://host:8000/metrics") from None
    for family in families:
        name = family.name
        if name in buckets:
            seen.add(name)
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    le = float(sample.labels.get("le", "nan"))
                    buckets[name][le] = buckets[name].get(le, 0.0) + sample.value
                elif sample.name.endswith("_sum"):
                    sums[name] += sample.value
                elif sample.name.endswith("_count"):
                    counts[name] += sample.value
                if "model_name" in sample.labels:
                    models.add(sample.labels["model_name"])
        elif name in IN_FLIGHT:
            in_flight += sum(sample.value for sample in family.samples if sample.name == name)
        elif name.removesuffix("_total") in counters:  # `# TYPE x_total counter` or a family with no TYPE line
            name = name.removesuffix("_total")
            seen.add(name)
            for sample in family.samples:
                if sample.name != f"{name}_total":
                    continue  # the _created gauge
                counters[name] += sample.value
                if name == REQUEST_SUCCESS and sample.labels.get("finished_reason") in FAILED_REASONS:
                    failed += sample.value
    missing = [n for n in (PROMPT_TOKENS, GENERATION_TOKENS, TTFT_SECONDS, ITL_SECONDS, REQUEST_SUCCESS)
               if n not in seen]
    if missing:
        what = "no vLLM metrics" if len(missing) == 5 else f"no {', '.join(missing)}"
        raise MetricsError(f"the endpoint answers but exposes {what}", field=source,
                           fix="give the /metrics URL of a vLLM server (vllm serve exports it on its API port, "
                               "e.g. http://host:8000/metrics), started without --disable-log-stats")

    def histogram(name: str) -> Histogram | None:
        if name not in seen:
            return None
        les = sorted(buckets[name])
        if not les or not math.isinf(les[-1]) or any(math.isnan(x) for x in les):
            raise MetricsError(f"{name} has no +Inf bucket", field=source, fix="give a vLLM server's /metrics URL")
        return Histogram(tuple(les), tuple(buckets[name][le] for le in les), sums[name], counts[name])

    hists = {n: histogram(n) for n in HISTOGRAMS}
    return VllmCounters(prompt_tokens=hists[PROMPT_TOKENS], generation_tokens=hists[GENERATION_TOKENS],  # type: ignore[arg-type]
                        ttft_s=hists[TTFT_SECONDS], itl_s=hists[ITL_SECONDS],  # type: ignore[arg-type]
                        request_itl_s=hists[REQUEST_ITL_SECONDS], finished=counters[REQUEST_SUCCESS], failed=failed,
                        prefix_queries=counters[PREFIX_QUERIES], prefix_hits=counters[PREFIX_HITS],
                        preemptions=counters[PREEMPTIONS], in_flight=in_flight, models=tuple(sorted(models)))


def sum_counters(parts: Iterable[tuple[str, VllmCounters]]) -> VllmCounters:
    """Several servers' counters (or increases) together: one deployment behind a router."""
    out: VllmCounters | None = None
    for source, counters in parts:
        out = counters if out is None else out.plus(counters, source=source)
    if out is None:
        raise MetricsError("no metrics source given", field="--from-metrics", fix="give at least one URL")
    return out


# -- from an increase to a workload ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LatencySummary:
    """Mean and percentiles (ms): of a latency histogram's increase (linear inside buckets, as Prometheus reads,
    with its sample count), or a prediction's (no samples)."""

    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    samples: float | None = None

    @classmethod
    def of(cls, h: Histogram) -> LatencySummary:
        return cls(mean_ms=1000 * h.mean, p50_ms=1000 * h.quantile(0.5), p90_ms=1000 * h.quantile(0.9),
                   p99_ms=1000 * h.quantile(0.99), samples=h.count)

    def at(self, percentile: str) -> float:
        return {"p50": self.p50_ms, "p90": self.p90_ms, "p99": self.p99_ms}[percentile]

    def as_json(self) -> dict[str, float]:
        out = {"mean": round(self.mean_ms, 3), "p50": round(self.p50_ms, 3), "p90": round(self.p90_ms, 3),
               "p99": round(self.p99_ms, 3)}
        return out if self.samples is None else {**out, "samples": round(self.samples, 1)}


@dataclass(frozen=True)
class LiveTraffic:
    """A window of a running deployment: the workload it served and the latencies it gave."""

    sources: tuple[str, ...]
    window_s: float
    requests: float  # finished in the window (every reason)
    failed: float
    arrival_rps: float  # (finished + the change in running and waiting) / window: the requests that arrived
    prefix_hit_share: float  # prefix-cache hits / queries, in tokens
    preemptions: float
    workload: Workload
    ttft: LatencySummary
    itl: LatencySummary  # every inter-token interval (vllm:inter_token_latency_seconds)
    request_itl: LatencySummary | None  # per request mean ITL (what topotune predicts and AIPerf reports)
    models: tuple[str, ...] = field(default=())
    bucket_resolution: dict[str, list[float]] = field(default_factory=dict)
    increase: VllmCounters | None = None  # the series' increase the window was read from

    def share_within(self, *, max_ttft_ms: float | None, max_itl_ms: float | None) -> float:
        """The measured share of requests within an SLA: TTFT <= bound and per-request mean ITL <= bound (the
        every-token histogram when the server has no per-request one), the two taken as independent as the
        prediction does (tuner.metrics.ServingMetrics.share_within). Read at the buckets' resolution."""
        if self.increase is None:
            return math.nan
        share = 1.0
        if max_ttft_ms is not None:
            share *= self.increase.ttft_s.share_at_most(max_ttft_ms / 1000)
        if max_itl_ms is not None:
            itl = self.increase.request_itl_s or self.increase.itl_s
            share *= itl.share_at_most(max_itl_ms / 1000)
        return share

    def summary_json(self) -> dict[str, object]:
        return {"sources": list(self.sources), "models": list(self.models), "window_s": round(self.window_s, 3),
                "requests": round(self.requests, 1), "failed_requests": round(self.failed, 1),
                "duration_s": round(self.window_s, 3), "arrival_rps": round(self.arrival_rps, 4),
                "prefix_reuse": round(self.prefix_hit_share, 4), "preemptions": round(self.preemptions, 1),
                "measured": {"ttft_ms": self.ttft.as_json(), "itl_ms": self.itl.as_json(),
                             "request_itl_ms": None if self.request_itl is None else self.request_itl.as_json()},
                "token_buckets": self.bucket_resolution}


def histogram_lengths(h: Histogram) -> HistogramLengths:
    """Token lengths at the buckets' resolution: each non-empty bucket (lo, hi] becomes one length, placed at the
    same fraction t of every bucket, t chosen so the mean equals the exact _sum / _count (one bucket: the exact
    mean; t = 1/2 when the mean cannot tell)."""
    bins = [(lo, hi, c) for lo, hi, c in h.bins if c > 0]
    target = h.mean
    base = sum(lo * c for lo, _, c in bins) / h.count
    spread = sum((hi - lo) * c for lo, hi, c in bins) / h.count
    t = min(1.0, max(0.0, (target - base) / spread)) if spread > 0 and target > 0 else 0.5
    merged: dict[int, float] = {}
    for lo, hi, c in bins:
        tokens = max(1, round(lo + t * (hi - lo)))
        merged[tokens] = merged.get(tokens, 0.0) + c
    return HistogramLengths(bins=tuple(sorted(merged.items())))


def live_traffic(increase: VllmCounters, window_s: float, sources: tuple[str, ...]) -> LiveTraffic:
    """The workload and latencies of a window from the series' increase over it. A window where no request
    finished has no traffic to read (an error naming the sources and the fix)."""
    where = ", ".join(sources)
    if not window_s > 0:
        raise MetricsError(f"the window is {window_s:g} s", field="--window", fix="give a positive window, e.g. 10m")
    served = increase.prompt_tokens.count
    if increase.finished <= 0 or served <= 0:
        raise MetricsError(f"no request finished in the {window_s:,.0f} s window", field=where,
                           fix="widen the window (--window / --range), or check that the traffic reaches these "
                               "servers")
    hit = increase.prefix_hits / increase.prefix_queries if increase.prefix_queries > 0 else 0.0
    hit = min(max(hit, 0.0), 1.0)
    inputs = histogram_lengths(increase.prompt_tokens)
    outputs = histogram_lengths(increase.generation_tokens) if increase.generation_tokens.count > 0 else inputs
    # Arrivals, not completions: a window's completions lag its arrivals by the latency, which moves with the load;
    # the change in requests inside the engine (running + waiting at each scrape) puts them back.
    arrived = increase.finished + increase.in_flight
    if arrived <= 0:
        raise MetricsError(f"no request arrived in the {window_s:,.0f} s window ({increase.finished:,.0f} finished "
                           "were already running when it began)", field=where,
                           fix="widen the window (--window / --range), or check that the traffic reaches these "
                               "servers")
    rate = arrived / window_s
    # The hit share as one shared prefix every cache holds: no structure beyond the share (docs/workloads.md).
    shared = math.floor(hit * inputs.expected)
    prefix = PrefixSharing(shared_tokens=shared, num_prefixes=1) if 1 <= shared < inputs.longest else None
    workload = Workload(input_tokens=inputs, output_tokens=outputs, prefix=prefix, arrival="poisson",
                        request_rates=(rate,))
    request_itl = increase.request_itl_s
    return LiveTraffic(
        sources=sources, window_s=window_s, requests=increase.finished, failed=increase.failed, arrival_rps=rate,
        prefix_hit_share=hit, preemptions=increase.preemptions, workload=workload, ttft=LatencySummary.of(
            increase.ttft_s), itl=LatencySummary.of(increase.itl_s),
        request_itl=LatencySummary.of(request_itl) if request_itl is not None and request_itl.count > 0 else None,
        models=increase.models, increase=increase,
        bucket_resolution={"input": [b for b in increase.prompt_tokens.bounds if math.isfinite(b)],
                           "output": [b for b in increase.generation_tokens.bounds if math.isfinite(b)]})
