"""The request stream a replay sends: from a trace or a workload's distributions, and when each request leaves.

Arrivals: the trace's own timestamps (bursts kept; rescaled when a rate is asked for), Poisson, a gamma renewal
process of a stated coefficient of variation (CV 1 is Poisson, > 1 bursty), or a closed loop of C clients each
sending its next request when the previous answer ends (AIPerf's --concurrency). Multi-turn sessions: each turn's
prompt is the whole history (earlier prompts and answers) plus its new tokens, sent `think_ms` after the previous
answer; sessions start by the arrival process (open loop) or one per client (closed loop).

Prompts are cut into cacheable units of `UNIT_TOKENS` tokens (a trace's 512-token hash blocks): a unit's key names
its content, so two prompts share a unit exactly where they share the text (a shared prefix, a session's
history), and vLLM's block-granular prefix hits follow from them.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from tuner.errors import ConfigError
from tuner.replay._requests import RequestSpec, Unit
from tuner.workload import Workload, read_trace

MAX_REPLAY_REQUESTS = 10_000_000
UNIT_TOKENS = 512

ArrivalKind = Literal["trace", "poisson", "gamma", "closed"]


@dataclass(frozen=True, slots=True)
class ArrivalProcess:
    """When requests leave the clients: `rate_rps` for the open-loop kinds (None with `trace`: its own
    timestamps), `cv` for gamma, `concurrency` for closed."""

    kind: ArrivalKind = "poisson"
    rate_rps: float | None = None
    cv: float = 1.0
    concurrency: int = 0

    def __post_init__(self) -> None:
        if self.kind == "closed" and self.concurrency < 1:
            raise ConfigError("a closed loop needs a concurrency >= 1", field="concurrency",
                              fix="give `concurrency` C (clients)")
        if self.kind in ("poisson", "gamma") and not (self.rate_rps and self.rate_rps > 0):
            raise ConfigError(f"{self.kind} arrivals need a rate", field="request_rate",
                              fix="give `request_rate` R (requests/s)")
        if self.kind == "gamma" and not (0 < self.cv <= 20):
            raise ConfigError(f"burstiness CV must be in (0, 20], got {self.cv:g}", field="burstiness_cv",
                              fix="give the inter-arrival coefficient of variation, e.g. 2 (1 = Poisson)")

    @property
    def open_loop(self) -> bool:
        return self.kind != "closed"

    def describe(self) -> str:
        if self.kind == "closed":
            return f"closed loop at concurrency {self.concurrency}"
        if self.kind == "trace":
            return "the trace's own timestamps" + (f" rescaled to {self.rate_rps:g} req/s" if self.rate_rps else "")
        if self.kind == "gamma":
            return f"gamma arrivals at {self.rate_rps:g} req/s, CV {self.cv:g}"
        return f"Poisson arrivals at {self.rate_rps:g} req/s"


@dataclass(frozen=True, slots=True)
class Sessions:
    """Multi-turn conversations: `turns` turns each, `think_ms` between an answer and the next turn."""

    turns: int = 3
    think_ms: float = 1000.0

    def __post_init__(self) -> None:
        if not 1 <= self.turns <= 1000:
            raise ConfigError(f"turns must be 1..1000, got {self.turns}", field="turns",
                              fix="give the turns per conversation, e.g. 4")
        if not (self.think_ms >= 0 and math.isfinite(self.think_ms)):
            raise ConfigError("think time must be >= 0 ms", field="think_ms", fix="give milliseconds, e.g. 2000")


def _chunk_units(key: tuple, first_block: int, last_block: int, block_size: int) -> list[Unit]:
    """Blocks first_block..last_block - 1 as units of at most UNIT_TOKENS, each keyed by where it starts."""
    step = max(1, UNIT_TOKENS // block_size)
    return [((*key, start, take), take) for start in range(first_block, last_block, step)
            for take in (min(step, last_block - start),)]


def _prefix_units(index: int, shared_tokens: int, block_size: int) -> list[Unit]:
    """The full blocks of shared prefix `index` (the block its end shares with the prompt's own text is not)."""
    return _chunk_units(("prefix", index), 0, shared_tokens // block_size, block_size)


_TRACES = 8
_traces: OrderedDict[tuple, tuple[RequestSpec, ...]] = OrderedDict()


def trace_requests(path: Path | str, block_size: int, limit: int | None = None,
                   hash_block_tokens: int = UNIT_TOKENS) -> list[RequestSpec]:
    """A mooncake trace's requests, with their timestamps and hash ids as units (a hash block of 512 tokens is
    512 / block_size vLLM blocks; a partial last block keeps its full blocks only). The last few traces read are
    kept (keyed by the file's size and modification time): verification replays one trace per candidate."""
    try:
        stat = Path(path).stat()
    except OSError:  # read_trace names what is wrong with the path
        return _read_trace_requests(path, block_size, limit, hash_block_tokens)
    key = (str(path), stat.st_size, stat.st_mtime_ns, block_size, limit, hash_block_tokens)
    found = _traces.get(key)
    if found is None:
        found = _traces[key] = tuple(_read_trace_requests(path, block_size, limit, hash_block_tokens))
        while len(_traces) > _TRACES:
            _traces.popitem(last=False)
    return list(found)


def _read_trace_requests(path: Path | str, block_size: int, limit: int | None,
                         hash_block_tokens: int) -> list[RequestSpec]:
    specs = []
    per_unit = max(1, hash_block_tokens // block_size)
    for request in read_trace(path, block_tokens=hash_block_tokens):
        units = []
        for index, h in enumerate(request.hash_ids):
            tokens = min(hash_block_tokens, request.input_tokens - index * hash_block_tokens)
            blocks = min(per_unit, tokens // block_size)
            if blocks <= 0:
                break
            units.append(((h, blocks), blocks))
        specs.append(RequestSpec(prompt_tokens=request.input_tokens, output_tokens=request.output_tokens,
                                 units=tuple(units), arrival_ms=request.timestamp_ms))
        if limit is not None and len(specs) >= limit:
            break
        if len(specs) > MAX_REPLAY_REQUESTS:
            break
    return specs


def sampled_requests(workload: Workload, count: int, block_size: int, seed: int = 0,
                     sessions: Sessions | None = None) -> list[RequestSpec]:
    """`count` requests drawn from the workload's length distributions (its 64-point samples), each prompt
    starting with one of its shared prefixes if it has them; with `sessions`, grouped into conversations whose
    turns re-send the history (a turn's units cover its answer too, as vLLM caches generated blocks)."""
    rng = np.random.default_rng(seed)
    inputs = workload.input_tokens.points
    outputs = workload.output_tokens.points
    prefix = workload.prefix
    specs: list[RequestSpec] = []
    session = 0
    draws_in = inputs[rng.integers(len(inputs), size=count)].tolist()
    draws_out = outputs[rng.integers(len(outputs), size=count)].tolist()
    draws_prefix = rng.integers(prefix.num_prefixes, size=count).tolist() if prefix is not None else []
    prefixes: dict[int, list[Unit]] = {}
    while len(specs) < count:
        turns = sessions.turns if sessions else 1
        history = 0
        units: list[Unit] = []
        if prefix is not None:
            index = draws_prefix[session % count]
            if index not in prefixes:
                prefixes[index] = _prefix_units(index, prefix.shared_tokens, block_size)
            units = list(prefixes[index])
            history = prefix.shared_tokens
        done_blocks = sum(b for _, b in units)  # blocks of the history already cut into units
        for turn in range(turns):
            if len(specs) >= count:
                break
            new = int(draws_in[len(specs)])
            out = int(draws_out[len(specs)])
            if turn == 0 and prefix is not None:
                new = max(1, new - prefix.shared_tokens)
            prompt = history + new
            covered = prompt + out if sessions else prompt
            mine = _chunk_units(("s", session), done_blocks, covered // block_size, block_size)
            specs.append(RequestSpec(prompt_tokens=prompt, output_tokens=out, units=tuple(units + mine),
                                     session=session if sessions else None, turn=turn,
                                     think_ms=sessions.think_ms if sessions and turn else 0.0))
            units += mine
            done_blocks = max(done_blocks, covered // block_size)
            history = prompt + out
        session += 1
    return specs


def arrival_times_ms(count: int, process: ArrivalProcess, trace_ms: list[float | None] | None = None,
                     seed: int = 0) -> list[float]:
    """Send times of `count` open-loop requests (or of the first turns of sessions)."""
    rng = np.random.default_rng(seed + 1)
    if process.kind == "trace":
        if trace_ms is None or any(t is None for t in trace_ms[:count]):
            raise ConfigError("trace arrivals need a trace with timestamps", field="arrival",
                              fix="give a JSONL trace with timestamps, or `arrival` poisson with `request_rate`")
        times = [float(t) - float(trace_ms[0]) for t in trace_ms[:count]]  # type: ignore[arg-type]
        if process.rate_rps and count > 1 and times[-1] > 0:
            scale = (count - 1) / process.rate_rps * 1e3 / times[-1]
            times = [t * scale for t in times]
        return times
    rate = float(process.rate_rps or 1.0)
    if process.kind == "gamma" and process.cv != 1.0:
        shape = 1.0 / (process.cv * process.cv)
        gaps = rng.gamma(shape, 1.0 / (rate * shape), size=count)
    else:
        gaps = rng.exponential(1.0 / rate, size=count)
    gaps[0] = 0.0
    return list(np.cumsum(gaps) * 1e3)
