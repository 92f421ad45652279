"""The traffic a deployment serves: length distributions or a trace, shared prefixes, closed or open loop."""

from tuner.workload._lengths import (
    QUANTILE_POINTS,
    EmpiricalLengths,
    FixedLengths,
    HistogramLengths,
    Lengths,
    LogNormalLengths,
    NormalLengths,
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
    "HistogramLengths",
    "Lengths",
    "LogNormalLengths",
    "NormalLengths",
    "PrefixSharing",
    "TraceRequest",
    "TraceSummary",
    "Workload",
    "read_trace",
    "served_context_tokens",
    "summarise_trace",
    "workload_error",
]
