"""Request traces in the mooncake JSONL format AIPerf replays, read streaming and summarised once.

One JSON object per line: `{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}`.
`hash_ids` name the prompt's consecutive `block_tokens`-token blocks (512 in the published traces); two requests
whose first k ids agree share a k-block prefix, which vLLM's automatic prefix cache serves from memory.

The summary keeps what the models need and nothing per request: length percentiles, the arrival rate, and the
prefix cache's hit ratio as a function of its capacity (an LRU stack-distance curve, Mattson et al. 1970): for
every block of every prompt, the number of distinct blocks touched since that block was last seen. A block hits
an LRU cache of C blocks iff that distance is < C, and vLLM reuses a prompt's cached blocks only as a prefix
(its block hashes chain), so a block counts as a hit when it and every block before it would hit: the curve uses
each block's running maximum distance within its prompt.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tuner.errors import ConfigError

MAX_TRACE_BYTES = 2 * 2**30  # a trace is requests, not prompts: 2 GiB is ~20 M requests
MAX_TRACE_REQUESTS = 5_000_000
MAX_LINE_CHARS = 1_000_000
DEFAULT_BLOCK_TOKENS = 512  # the mooncake traces' hash block
# Capacities (in hash blocks) at which the hit-ratio curve is kept: powers of two up to 2**30 blocks.
CAPACITY_POINTS = tuple(2**k for k in range(31))
_INF = np.iinfo(np.int64).max


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One line of a trace."""

    line: int
    timestamp_ms: float | None
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...]


def _field_error(path: Path, line: int, field: str, message: str, fix: str) -> ConfigError:
    return ConfigError(message, field=f"{path.name} line {line}: {field}", fix=fix)


def _count(path: Path, line: int, record: dict, key: str) -> int:
    value = record.get(key)
    if value is None:
        raise _field_error(path, line, key, "missing", f"give {key} as a positive integer (tokens)")
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) or value < 1:
        raise _field_error(path, line, key, f"must be a positive integer of tokens, got {value!r}",
                           f"give {key} as a positive integer (tokens)")
    if value > 10_000_000:
        raise _field_error(path, line, key, f"{value:,} tokens is beyond any context length",
                           "check the column: lengths are token counts")
    return int(value)


def read_trace(path: Path | str) -> Iterator[TraceRequest]:
    """The trace's requests, one line at a time (a large file is never held whole); a bad line is a ConfigError
    naming the file, the line and the field."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", field="workload.trace",
                          fix="give the path of a mooncake-format JSONL trace") from exc
    if size > MAX_TRACE_BYTES:
        raise ConfigError(f"{path.name} is {size / 2**30:,.1f} GiB; at most {MAX_TRACE_BYTES / 2**30:.0f} GiB is read",
                          field="workload.trace", fix="cut the trace to a representative window (e.g. head -n 100000)")
    last_ts: float | None = None
    count = 0
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if len(raw) > MAX_LINE_CHARS:
                raise _field_error(path, number, "line", f"{len(raw):,} bytes on one line",
                                   "one request per line; hash_ids hold block ids, not the prompt")
            text = raw.strip()
            if not text:
                continue
            try:
                record = json.loads(text)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise _field_error(path, number, "line", f"not JSON ({exc})",
                                   'write one JSON object per line, e.g. {"input_length": 512, '
                                   '"output_length": 64}') from None
            if not isinstance(record, dict):
                raise _field_error(path, number, "line", "not a JSON object", "one object per line")
            timestamp = record.get("timestamp")
            if timestamp is not None:
                if isinstance(timestamp, bool) or not isinstance(timestamp, int | float) or not math.isfinite(
                        timestamp) or timestamp < 0:
                    raise _field_error(path, number, "timestamp", f"must be milliseconds >= 0, got {timestamp!r}",
                                       "give the arrival time in ms since the trace's start, or leave it out")
                if last_ts is not None and timestamp < last_ts:
                    raise _field_error(path, number, "timestamp",
                                       f"{timestamp} is earlier than the line before ({last_ts})",
                                       "sort the trace by timestamp (sort -n on the field)")
                last_ts = float(timestamp)
            hash_ids = record.get("hash_ids", [])
            if not isinstance(hash_ids, list) or any(isinstance(h, bool) or not isinstance(h, int)
                                                     for h in hash_ids):
                raise _field_error(path, number, "hash_ids", "must be a list of integers",
                                   "give the prompt's block ids, or leave hash_ids out")
            count += 1
            if count > MAX_TRACE_REQUESTS:
                raise ConfigError(f"{path.name} has more than {MAX_TRACE_REQUESTS:,} requests",
                                  field="workload.trace", fix="cut the trace to a representative window")
            yield TraceRequest(line=number, timestamp_ms=None if timestamp is None else float(timestamp),
                               input_tokens=_count(path, number, record, "input_length"),
                               output_tokens=_count(path, number, record, "output_length"),
                               hash_ids=tuple(hash_ids))
    if count == 0:
        raise ConfigError(f"{path.name} holds no request", field="workload.trace",
                          fix="give a JSONL file with one request per line")


class _Fenwick:
    """Prefix sums over access positions: how many distinct blocks were touched after a position."""

    def __init__(self, size: int) -> None:
        self.tree = np.zeros(size + 1, dtype=np.int64)

    def add(self, index: int, value: int) -> None:
        i = index + 1
        tree = self.tree
        n = len(tree)
        while i < n:
            tree[i] += value
            i += i & -i

    def prefix(self, index: int) -> int:
        """Sum over positions 0..index."""
        i = index + 1
        total = 0
        tree = self.tree
        while i > 0:
            total += int(tree[i])
            i -= i & -i
        return total


class TraceSummary(BaseModel):
    """What the models read from a trace (small, stored with a study; the file itself is not needed again)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    sha256: str
    requests: int = Field(ge=1)
    input_percentiles: tuple[int, ...]  # p0..p100
    output_percentiles: tuple[int, ...]
    duration_s: float | None = Field(None, ge=0, description="first to last timestamp; None without timestamps")
    arrival_rps: float | None = Field(None, ge=0)
    block_tokens: int = Field(DEFAULT_BLOCK_TOKENS, ge=1)
    # Share of input tokens served from an LRU prefix cache of CAPACITY_POINTS[k] blocks (one cache, every
    # request); the last value is the infinite cache's: the trace's prefix reuse.
    hit_share_by_capacity: tuple[float, ...]

    @property
    def prefix_reuse(self) -> float:
        return self.hit_share_by_capacity[-1]

    def hit_share(self, capacity_tokens: float) -> float:
        """Input-token share an LRU prefix cache of `capacity_tokens` serves (log-linear between the points)."""
        blocks = capacity_tokens / self.block_tokens
        if blocks < 1:
            return 0.0
        k = math.log2(blocks)
        if k >= len(CAPACITY_POINTS) - 1:
            return self.hit_share_by_capacity[-1]
        lo = int(k)
        frac = k - lo
        curve = self.hit_share_by_capacity
        return curve[lo] + frac * (curve[lo + 1] - curve[lo])


def summarise_trace(path: Path | str, *, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> TraceSummary:
    """One streaming pass: lengths, arrivals and the prefix cache's stack-distance curve."""
    path = Path(path)
    digest = hashlib.sha256()
    inputs: list[int] = []
    outputs: list[int] = []
    first_ts = last_ts = None
    last_access: dict[int, int] = {}
    positions = 0
    # Fenwick over positions sized lazily in chunks: the trace's block count is unknown until the end.
    capacity = 1 << 16
    fenwick = _Fenwick(capacity)
    hit_distance: list[int] = []  # running max distance of each (request, block), as tokens are weighed below
    hit_tokens: list[int] = []
    total_input = 0
    for request in read_trace(path):
        digest.update(f"{request.timestamp_ms}|{request.input_tokens}|{request.output_tokens}|"
                      f"{request.hash_ids}\n".encode())
        inputs.append(request.input_tokens)
        outputs.append(request.output_tokens)
        total_input += request.input_tokens
        if request.timestamp_ms is not None:
            first_ts = request.timestamp_ms if first_ts is None else first_ts
            last_ts = request.timestamp_ms
        running_max = 0
        # vLLM recomputes at least the prompt's last token: a full-hit prompt still prefills one token.
        cacheable = request.input_tokens - 1
        for index, block in enumerate(request.hash_ids):
            tokens = min(block_tokens, cacheable - index * block_tokens)
            if positions >= capacity:
                grown = _Fenwick(capacity * 2)
                # rebuild: replay the live positions (one per distinct block) into the larger tree
                for pos in last_access.values():
                    grown.add(pos, 1)
                fenwick, capacity = grown, capacity * 2
            previous = last_access.get(block)
            if previous is None:
                distance = _INF
            else:
                distance = fenwick.prefix(positions - 1) - fenwick.prefix(previous)
                fenwick.add(previous, -1)
            fenwick.add(positions, 1)
            last_access[block] = positions
            positions += 1
            running_max = max(running_max, distance)
            if tokens > 0 and running_max != _INF:
                hit_distance.append(running_max)
                hit_tokens.append(tokens)
    distances = np.asarray(hit_distance, dtype=np.int64)
    weights = np.asarray(hit_tokens, dtype=np.float64)
    finite = [float(weights[distances < c].sum() / total_input) for c in CAPACITY_POINTS[:-1]]
    curve = (*finite, float(weights.sum() / total_input))
    duration = None if first_ts is None or last_ts is None else (last_ts - first_ts) / 1e3
    n = len(inputs)
    rate = (n - 1) / duration if duration else None
    q = np.linspace(0, 100, 101)
    return TraceSummary(
        path=str(path), sha256=digest.hexdigest(), requests=n,
        input_percentiles=tuple(int(v) for v in np.percentile(inputs, q, method="inverted_cdf")),
        output_percentiles=tuple(int(v) for v in np.percentile(outputs, q, method="inverted_cdf")),
        duration_s=duration, arrival_rps=rate, block_tokens=block_tokens, hit_share_by_capacity=curve)
