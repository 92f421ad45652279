"""The traffic a deployment serves: length distributions or a trace, shared prefixes, and the load.

One type for every part: the simulator predicts it, a study measures it, the vLLM backend replays it through
AIPerf, the service stores it. `Workload.fixed(isl, osl)` is the benchmark point topotune started from; it
serialises as it always did, so studies stored before distributions existed read back unchanged.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tuner.errors import ConfigError
from tuner.workload._lengths import EmpiricalLengths, FixedLengths, Lengths, as_lengths
from tuner.workload._trace import DEFAULT_BLOCK_TOKENS, TraceSummary, summarise_trace

Arrival = Literal["closed", "poisson", "trace"]
MAX_LEVELS = 64


class PrefixSharing(BaseModel):
    """Synthetic shared prefixes: each prompt starts with one of `num_prefixes` prefixes of `shared_tokens`
    (AIPerf's --prefix-prompt-length and --prefix-prompt-pool-size; a system prompt, a few-shot block)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    shared_tokens: int = Field(ge=1, le=10_000_000)
    num_prefixes: int = Field(1, ge=1, le=1_000_000)


def served_context_tokens(isl: int, osl: int) -> int:
    """--max-model-len for a workload: isl + osl plus headroom (5%, at least 256 tokens, rounded up to 256).

    AIPerf's synthetic prompts are built to isl tokens with one tokenizer and re-tokenized by the server, which
    can count a few more; a context of exactly isl + osl rejects those requests. The recipes leave headroom
    too. The memory model reads the same figure (vLLM refuses to start when one max-model-len request does not
    fit the KV cache).
    """
    tokens = isl + osl
    return -(-(tokens + max(256, -(-tokens // 20))) // 256) * 256


class Workload(BaseModel):
    """Lengths, prefix reuse and load levels: closed loop at `concurrency` clients, or open loop at
    `request_rates` (requests/s, Poisson or the trace's own timestamps rescaled)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_tokens: Lengths = FixedLengths(tokens=8192)
    output_tokens: Lengths = FixedLengths(tokens=1024)
    prefix: PrefixSharing | None = None
    trace: TraceSummary | None = None
    arrival: Arrival = "closed"
    concurrency: tuple[int, ...] = Field((1, 8, 64, 256), min_length=1, max_length=MAX_LEVELS)
    request_rates: tuple[float, ...] = Field((), max_length=MAX_LEVELS)
    requests_per_level: int = Field(0, ge=0, description="0 = max(2 x concurrency, 16)")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: object) -> object:
        """`isl`/`osl` are the fixed-length shorthand (and what studies stored before distributions hold)."""
        if isinstance(data, dict):
            data = dict(data)
            for short, full in (("isl", "input_tokens"), ("osl", "output_tokens")):
                if short in data:
                    if full in data:
                        raise ValueError(f"give {short} or {full}, not both")
                    data[full] = data.pop(short)
            for full in ("input_tokens", "output_tokens"):
                if full in data:
                    data[full] = as_lengths(data[full])
        return data

    @field_validator("concurrency")
    @classmethod
    def _positive_sorted(cls, levels: tuple[int, ...]) -> tuple[int, ...]:
        if any(c < 1 for c in levels):
            raise ValueError("concurrency levels must be >= 1")
        return tuple(sorted(set(levels)))

    @field_validator("request_rates")
    @classmethod
    def _rates(cls, rates: tuple[float, ...]) -> tuple[float, ...]:
        if any(not (math.isfinite(r) and r > 0) for r in rates):
            raise ValueError("request rates must be > 0 requests/s")
        return tuple(sorted(set(rates)))

    @model_validator(mode="after")
    def _consistent(self) -> Workload:
        if self.arrival == "closed" and self.request_rates:
            raise ValueError("request_rates need an open-loop arrival (poisson or trace)")
        if self.arrival != "closed" and not self.request_rates:
            raise ValueError(f"arrival {self.arrival} needs request_rates (requests/s), e.g. [1, 2, 4]")
        if self.arrival == "trace" and (self.trace is None or self.trace.arrival_rps is None):
            raise ValueError("arrival: trace needs a trace file with timestamps")
        if self.prefix is not None and self.trace is not None:
            raise ValueError("a trace carries its own prefix reuse (hash_ids): drop prefix")
        if self.prefix is not None and self.prefix.shared_tokens >= self.input_tokens.longest:
            raise ValueError("prefix.shared_tokens must be shorter than the longest prompt")
        return self

    # -- constructors ---------------------------------------------------------------------------------
    @classmethod
    def fixed(cls, isl: int, osl: int, concurrency: tuple[int, ...] = (1, 8, 64, 256),
              requests_per_level: int = 0) -> Workload:
        return cls(input_tokens=FixedLengths(tokens=isl), output_tokens=FixedLengths(tokens=osl),
                   concurrency=concurrency, requests_per_level=requests_per_level)

    @classmethod
    def from_trace(cls, path: Path | str, *, block_tokens: int = DEFAULT_BLOCK_TOKENS, **load: object) -> Workload:
        """The trace's lengths and prefix reuse; `load` gives the levels (closed loop unless rates are given)."""
        summary = summarise_trace(path, block_tokens=block_tokens)
        return cls(input_tokens=EmpiricalLengths(percentiles=summary.input_percentiles),
                   output_tokens=EmpiricalLengths(percentiles=summary.output_percentiles), trace=summary, **load)

    def with_lengths(self, isl: int | None, osl: int | None) -> Workload:
        """A phase that measures at its own fixed lengths (the campaign's prefill sweep used 8192/2)."""
        update: dict[str, object] = {}
        if isl is not None:
            update["input_tokens"] = FixedLengths(tokens=isl)
            update["prefix"] = None
            update["trace"] = None
        if osl is not None:
            update["output_tokens"] = FixedLengths(tokens=osl)
        return self.model_copy(update=update) if update else self

    # -- what the rest of topotune reads --------------------------------------------------------------
    @property
    def is_fixed(self) -> bool:
        return (isinstance(self.input_tokens, FixedLengths) and isinstance(self.output_tokens, FixedLengths)
                and self.prefix is None and self.trace is None)

    @property
    def open_loop(self) -> bool:
        return self.arrival != "closed"

    @property
    def isl(self) -> int:
        """The typical prompt (the mean, rounded): what a single-shape model and a study's name use."""
        return self.input_tokens.typical_tokens

    @property
    def osl(self) -> int:
        return self.output_tokens.typical_tokens

    @property
    def longest_request_tokens(self) -> tuple[int, int]:
        """(input, output) of the longest request: the served context (--max-model-len) must hold it."""
        return self.input_tokens.longest, self.output_tokens.longest

    @property
    def max_model_len(self) -> int:
        return served_context_tokens(*self.longest_request_tokens)

    @property
    def levels(self) -> tuple[float, ...]:
        """The load levels a sweep measures: client counts (closed loop) or requests/s (open loop)."""
        return self.request_rates if self.open_loop else tuple(float(c) for c in self.concurrency)

    def request_count(self, concurrency: int) -> int:
        return self.requests_per_level or max(2 * concurrency, 16)

    def prefix_hit_share(self, cache_tokens: float, *, ranks: int = 1, cache_aware: bool = True) -> float:
        """Share of input tokens served from the prefix cache, each of `ranks` caches holding `cache_tokens`.

        A trace answers from its stack-distance curve. Over several caches a cache-aware router (vllm-router's
        consistent-hash policy) sends a prefix to one rank, so together they act as one cache `ranks` times as
        large; round robin scatters a prefix's requests, so a block is found only where its last use went, with
        probability 1 / ranks, in a cache that sees 1 / ranks of the stream. Synthetic prefixes are reused while
        the cache holds them all (else each is present with the share of them that fits).
        """
        if self.trace is not None:
            if cache_aware or ranks == 1:
                return self.trace.hit_share(cache_tokens * ranks)
            return self.trace.hit_share(cache_tokens * ranks) / ranks
        if self.prefix is None:
            return 0.0
        # Every rank sees every prefix under round robin, so each must hold them all; cache-aware routing
        # gives each rank its own share of the prefixes.
        pooled = cache_tokens * (ranks if cache_aware else 1)
        held = min(1.0, pooled / (self.prefix.shared_tokens * self.prefix.num_prefixes))
        return held * self.prefix.shared_tokens / self.input_tokens.expected

    def identity_json(self) -> str:
        """A stable key of the traffic (seeds the simulated backend's noise). A fixed closed-loop workload keeps
        the key it had before distributions existed, so its simulated figures are unchanged."""
        if self.is_fixed and not self.open_loop:
            return json.dumps({"isl": self.isl, "osl": self.osl, "concurrency": list(self.concurrency),
                               "requests_per_level": self.requests_per_level}, separators=(",", ":"))
        return self.model_dump_json()

    def describe(self, *, load: bool = True) -> str:
        levels = (f"{self.arrival} arrivals at {', '.join(f'{r:g}' for r in self.request_rates)} req/s"
                if self.open_loop else f"concurrency {', '.join(str(c) for c in self.concurrency)}")
        prefix = ""
        if self.trace is not None:
            prefix = f", prefix reuse {self.trace.prefix_reuse:.0%}"
        elif self.prefix is not None:
            prefix = f", {self.prefix.num_prefixes} shared prefix(es) of {self.prefix.shared_tokens:,} tokens"
        text = f"input {self.input_tokens.describe()}, output {self.output_tokens.describe()} tokens{prefix}"
        return f"{text}; {levels}" if load else text


def workload_error(exc: Exception, field: str = "workload") -> ConfigError:
    """A pydantic error on a workload block as one ConfigError naming the field."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        loc = ".".join(str(p) for p in first.get("loc", ()) if not str(p).endswith("Lengths"))
        return ConfigError(first["msg"].removeprefix("Value error, "), field=f"{field}.{loc}" if loc else field,
                           fix="see the workload block in the README (fixed, normal, lognormal, histogram or a trace)")
    return ConfigError(str(exc), field=field, fix="see the workload block in the README")
