"""What each phase maximises, and how its two axes are labelled everywhere (CLI tables, HTML report, web pages).

Both objectives are maximised so a failed trial is simply (0, 0). The first is goodput: tokens/s per GPU of the
requests that meet the space's SLA (a point's `sla_attainment`, set by the study); with no SLA every request
counts and it is the total throughput per GPU, as before SLAs existed.
"""

from __future__ import annotations

from tuner.metrics import ServingMetrics

# prefill: throughput per GPU vs prompt tokens/s per user (isl / TTFT): the campaign's "throughput vs TTFT"
# decode: throughput per GPU vs generated tokens/s per user (1 / ITL)
PHASE_METRICS: dict[str, tuple[str, str]] = {
    "prefill": ("total_tok_s_per_gpu", "prefill_tok_s_per_user"),
    "decode": ("total_tok_s_per_gpu", "tok_s_per_user"),
    "aggregated": ("total_tok_s_per_gpu", "tok_s_per_user"),  # one instance serving ISL/OSL: the user's view
}
# The same two objectives, in words, for chart axes.
PHASE_AXES: dict[str, tuple[str, str]] = {
    "prefill": ("total tokens/s per GPU (within the SLA)", "prompt tokens/s per user"),
    "decode": ("total tokens/s per GPU (within the SLA)", "generated tokens/s per user"),
    "aggregated": ("total tokens/s per GPU (within the SLA)", "generated tokens/s per user"),
}


def phase_values(phase: str, m: ServingMetrics) -> tuple[float, float]:
    if phase == "prefill":
        return (m.goodput_tok_s_per_gpu, m.isl * 1000.0 / m.ttft_ms_p50 if m.ttft_ms_p50 > 0 else 0.0)
    return (m.goodput_tok_s_per_gpu, m.tok_s_per_user)
