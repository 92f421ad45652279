"""The traffic a deployment serves: length distributions or a trace, shared prefixes, closed or open loop; and the
traffic a running vLLM served, read from its Prometheus metrics."""

from tuner.workload._lengths import (
    QUANTILE_POINTS,
    EmpiricalLengths,
    FixedLengths,
    HistogramLengths,
    Lengths,
    LogNormalLengths,
    NormalLengths,
)
from tuner.workload._metrics import (
    Histogram,
    LatencySummary,
    LiveTraffic,
    MetricsError,
    VllmCounters,
    histogram_lengths,
    live_traffic,
    parse_exposition,
    sum_counters,
)
from tuner.workload._scrape import (
    PrometheusApi,
    metrics_url,
    parse_duration,
    scrape,
    traffic_from_prometheus,
    traffic_from_servers,
)
from tuner.workload._trace import (
    MAX_LINE_CHARS,
    MAX_TRACE_BYTES,
    MAX_TRACE_REQUESTS,
    TraceRequest,
    TraceSummary,
    read_trace,
    summarise_trace,
)
from tuner.workload._workload import (
    Arrival,
    PrefixSharing,
    Workload,
    served_context_tokens,
    workload_error,
)

__all__ = [
    "MAX_LINE_CHARS",
    "MAX_TRACE_BYTES",
    "MAX_TRACE_REQUESTS",
    "QUANTILE_POINTS",
    "Arrival",
    "EmpiricalLengths",
    "FixedLengths",
    "Histogram",
    "HistogramLengths",
    "LatencySummary",
    "Lengths",
    "LiveTraffic",
    "LogNormalLengths",
    "MetricsError",
    "NormalLengths",
    "PrefixSharing",
    "PrometheusApi",
    "TraceRequest",
    "TraceSummary",
    "VllmCounters",
    "Workload",
    "histogram_lengths",
    "live_traffic",
    "metrics_url",
    "parse_duration",
    "parse_exposition",
    "read_trace",
    "scrape",
    "served_context_tokens",
    "sum_counters",
    "summarise_trace",
    "traffic_from_prometheus",
    "traffic_from_servers",
    "workload_error",
]
