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
import os
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from tuner.errors import ConfigError
from tuner.files import decode_utf8, open_regular

MAX_TRACE_BYTES = 2 * 2**30  # a trace is requests, not prompts: 2 GiB is ~20 M requests
MAX_TRACE_REQUESTS = 5_000_000
MAX_LINE_CHARS = 1_000_000
MAX_REQUEST_TOKENS = 10_000_000  # beyond any context length
MAX_TIMESTAMP_MS = 2**53  # exact as a float; an integer of 400 digits would not even convert
HASH_ID_SLACK = 1  # a generator that counts the last token's block once more is not refused
# The shortest line a request can be: {"input_length":1,"output_length":1} (36 bytes, the last line needs no
# newline). A file smaller than this many bytes per request cannot hold more than MAX_TRACE_REQUESTS valid lines
# (any other line is refused where it stands), so only larger ones are counted before parsing.
MIN_REQUEST_LINE_BYTES = 36
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
    if type(value) is int and 0 < value <= MAX_REQUEST_TOKENS:  # the usual line, checked in one test
        return value
    if value is None:
        raise _field_error(path, line, key, "missing", f"give {key} as a positive integer (tokens)")
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not math.isfinite(value)) or value != int(value) or value < 1:
        raise _field_error(path, line, key, f"must be a positive integer of tokens, got {value!r}",
                           f"give {key} as a positive integer (tokens)")
    if value > MAX_REQUEST_TOKENS:
        raise _field_error(path, line, key, f"{value:,} tokens is beyond any context length",
                           "check the column: lengths are token counts")
    return int(value)


def max_hash_ids(input_tokens: int, block_tokens: int) -> int:
    """The most block ids a prompt of `input_tokens` can name: one per (partial) block, plus one of slack."""
    return -(-input_tokens // block_tokens) + HASH_ID_SLACK


_TRACE_FIX = "cut the trace to a representative window (e.g. head -n 100000)"
_TRACE_WHAT = "a mooncake-format JSONL trace"
_CHUNK_BYTES = 16 * 2**20


def _prescan(handle: BinaryIO, path: Path) -> None:
    """A trace large enough to hold more than MAX_TRACE_REQUESTS lines is counted before any line is parsed (a
    byte scan: `topotune workload` refused a 185 MB file of 5,000,001 minimal lines in 0.65 s here, where parsing
    them took 32 s); a run of MAX_LINE_CHARS bytes without a newline across chunks is refused here too (a file
    of zeros, a prompt pasted whole)."""
    lines = run = 0  # newlines so far; bytes since the last one
    while chunk := handle.read(_CHUNK_BYTES):
        first = chunk.find(b"\n")
        if first >= 0:
            if run + first > MAX_LINE_CHARS:
                break
            lines += chunk.count(b"\n")
            run = len(chunk) - chunk.rfind(b"\n") - 1
        else:
            run += len(chunk)
        if run > MAX_LINE_CHARS:
            break
        if lines > MAX_TRACE_REQUESTS:
            raise ConfigError(f"{path.name} has more than {MAX_TRACE_REQUESTS:,} lines (one request per line)",
                              field="workload.trace", fix=_TRACE_FIX)
    else:
        handle.seek(0)
        return
    raise _field_error(path, lines + 1, "line", f"more than {MAX_LINE_CHARS:,} bytes on one line",
                       "one request per line; hash_ids hold block ids, not the prompt")


def read_trace(path: Path | str, *, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> Iterator[TraceRequest]:
    """The trace's requests, one line at a time (a large file is never held whole); a bad line is a ConfigError
    naming the file, the line and the field.

    Whatever the path names, reading is bounded: a regular file of at most MAX_TRACE_BYTES (a directory, FIFO,
    device or socket is refused before it is opened), at most MAX_TRACE_REQUESTS lines (counted before parsing
    when the file could hold more), lines of at most MAX_LINE_CHARS (checked while reading), UTF-8, JSON nested at
    most as deep as the parser's recursion limit, finite numbers, and hash_ids no more than the prompt's blocks.
    """
    path = Path(path)
    last_ts: float | None = None
    count = 0
    with open_regular(path, max_bytes=MAX_TRACE_BYTES, field="workload.trace", fix=_TRACE_FIX,
                      what=_TRACE_WHAT) as handle:
        if os.fstat(handle.fileno()).st_size > MIN_REQUEST_LINE_BYTES * MAX_TRACE_REQUESTS:
            _prescan(handle, path)
        number = 0
        while raw := handle.readline(MAX_LINE_CHARS + 1):
            number += 1
            if len(raw) > MAX_LINE_CHARS:
                raise _field_error(path, number, "line", f"more than {MAX_LINE_CHARS:,} bytes on one line",
                                   "one request per line; hash_ids hold block ids, not the prompt")
            text = decode_utf8(raw, path, field="workload.trace", first_line=number).strip()
            if not text:
                continue
            count += 1
            if count > MAX_TRACE_REQUESTS:
                raise ConfigError(f"{path.name} has more than {MAX_TRACE_REQUESTS:,} requests",
                                  field="workload.trace", fix=_TRACE_FIX)
            record = _record(path, number, text)
            timestamp = _timestamp(path, number, record, last_ts)
            if timestamp is not None:
                last_ts = timestamp
            input_tokens = _count(path, number, record, "input_length")
            output_tokens = _count(path, number, record, "output_length")
            yield TraceRequest(line=number, timestamp_ms=timestamp, input_tokens=input_tokens,
                               output_tokens=output_tokens,
                               hash_ids=_hash_ids(path, number, record, input_tokens, block_tokens))
    if count == 0:
        raise ConfigError(f"{path.name} holds no request", field="workload.trace",
                          fix="give a JSONL file with one request per line")


def _record(path: Path, number: int, text: str) -> dict:
    """One line's JSON object."""
    try:
        record = json.loads(text)
    except RecursionError:
        raise _field_error(path, number, "line", "JSON nested too deeply",
                           'one flat object per line, e.g. {"input_length": 512, "output_length": 64}') from None
    except ValueError as exc:  # JSONDecodeError, or an integer of more than 4,300 digits
        raise _field_error(path, number, "line", f"not JSON ({exc})",
                           'write one JSON object per line, e.g. {"input_length": 512, '
                           '"output_length": 64}') from None
    if not isinstance(record, dict):
        raise _field_error(path, number, "line", "not a JSON object", "one object per line")
    return record


def _timestamp(path: Path, number: int, record: dict, last_ts: float | None) -> float | None:
    """The line's arrival time in ms (None when it has none), never earlier than the line before's."""
    timestamp = record.get("timestamp")
    if timestamp is None:
        return None
    if type(timestamp) is int and 0 <= timestamp < MAX_TIMESTAMP_MS and (last_ts is None or timestamp >= last_ts):
        return float(timestamp)  # the usual line, checked in one test
    if isinstance(timestamp, bool) or not isinstance(timestamp, int | float) or timestamp < 0 or (
            timestamp >= MAX_TIMESTAMP_MS if isinstance(timestamp, int) else not math.isfinite(timestamp)):
        raise _field_error(path, number, "timestamp", f"must be milliseconds >= 0, got {timestamp!r}",
                           "give the arrival time in ms since the trace's start, or leave it out")
    if last_ts is not None and timestamp < last_ts:
        raise _field_error(path, number, "timestamp", f"{timestamp} is earlier than the line before ({last_ts})",
                           "sort the trace by timestamp (sort -n on the field)")
    return float(timestamp)


def _hash_ids(path: Path, number: int, record: dict, input_tokens: int, block_tokens: int) -> tuple[int, ...]:
    """The prompt's block ids: integers, no more than its blocks (plus the slack)."""
    hash_ids = record.get("hash_ids", [])
    if not isinstance(hash_ids, list):
        raise _field_error(path, number, "hash_ids", "must be a list of integers",
                           "give the prompt's block ids, or leave hash_ids out")
    bound = max_hash_ids(input_tokens, block_tokens)
    if len(hash_ids) > bound:
        raise _field_error(path, number, "hash_ids",
                           f"{len(hash_ids):,} block ids for a {input_tokens:,}-token prompt; its "
                           f"{block_tokens}-token blocks number at most {bound - HASH_ID_SLACK:,}",
                           f"give one id per {block_tokens}-token block of the prompt: at most "
                           f"ceil(input_length / {block_tokens})")
    if hash_ids and not set(map(type, hash_ids)) <= {int}:  # exactly int: a bool is not a block id
        raise _field_error(path, number, "hash_ids", "must be a list of integers",
                           "give the prompt's block ids, or leave hash_ids out")
    return tuple(hash_ids)


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


def stack_distances(blocks: np.ndarray) -> np.ndarray:
    """Each access's LRU stack distance (distinct blocks touched since its last access; _INF on the first), all at
    once in NumPy. With v = (previous access of the same block) + 1 (0 on a first access), the blocks touched in
    between are the accesses j in (prev, i) that are their block's first there, i.e. with v_j <= v_i; every j <= prev
    has v_j <= v_i too, so distance_i = #{j < i : v_j <= v_i} - v_i: a per-element dominance count. First accesses
    (v = 0) are counted by a running sum; the repeats' count is `_earlier_at_most`, bit by bit (where a Fenwick
    tree walked in Python took minutes on 9 M accesses)."""
    n = len(blocks)
    order = np.argsort(blocks, kind="stable")
    prev = np.full(n, -1, dtype=np.int64)
    same = blocks[order[1:]] == blocks[order[:-1]]
    prev[order[1:][same]] = order[:-1][same]
    repeats = np.flatnonzero(prev >= 0)
    firsts_before = np.cumsum(prev < 0)[repeats]  # a repeat is not a first: inclusive == exclusive
    out = np.full(n, _INF, dtype=np.int64)
    v = prev[repeats] + 1
    out[repeats] = firsts_before + _earlier_at_most(v) - v
    return out


def _earlier_at_most(v: np.ndarray) -> np.ndarray:
    """For every i, #{j < i : v[j] <= v[i]} (v >= 0). From the top bit down, each group of equal high bits is kept
    in index order and split stably into its 0s and its 1s; an element with a 1 counts the 0s before it in its group
    (all smaller); at the end a group holds equal values, and each counts the ones before it. The arrays are in
    position order and move together (a gather by the inverse of each split: local, not random, access)."""
    n = len(v)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    top = int(v.max()).bit_length()
    idx = np.int32 if max(n, 2**top) < 2**31 - 1 else np.int64
    order = np.arange(n, dtype=idx)  # position -> original index
    vals = v.astype(idx)
    start = np.zeros(n, dtype=idx)  # position -> its group's first position
    end = np.full(n, n, dtype=idx)  # position -> one past its group's last
    acc = np.zeros(n, dtype=idx)  # position -> smaller values counted so far
    pos = np.arange(n, dtype=idx)
    zeros_upto = np.zeros(n + 1, dtype=idx)
    bits = np.empty(n, dtype=idx)
    for bit in range(top - 1, -1, -1):
        np.right_shift(vals, bit, out=bits)
        np.bitwise_and(bits, 1, out=bits)
        one = bits.astype(bool)
        np.cumsum(~one, out=zeros_upto[1:])
        base = zeros_upto[start]
        zeros_before = zeros_upto[:-1] - base
        split = zeros_upto[end] - base + start  # the first position of the group's ones once split
        acc += np.where(one, zeros_before, 0)
        new_pos = np.where(one, pos - zeros_before + (split - start), start + zeros_before)
        new_start, new_end = np.where(one, split, start), np.where(one, end, split)
        back = np.empty_like(pos)
        back[new_pos] = pos  # new position -> old
        order, vals, acc, start, end = order[back], vals[back], acc[back], new_start[back], new_end[back]
    counts = np.empty(n, dtype=np.int64)
    counts[order] = acc.astype(np.int64) + (pos - start)  # + equal values before, in index order
    return counts


def _hit_curve(blocks: array, requests: array, input_tokens: array, block_tokens: int) -> tuple[float, ...]:
    """Share of input tokens an LRU prefix cache of each CAPACITY_POINTS size serves: a block hits when it and every
    block before it in its prompt would (the running maximum of their distances within the prompt is < C)."""
    total_input = int(np.frombuffer(input_tokens, dtype=np.int64).sum())
    counts = np.frombuffer(requests, dtype=np.int64)  # blocks per request
    block_ids = np.frombuffer(blocks, dtype=np.int64)
    distances = stack_distances(block_ids)
    n = len(block_ids)
    request = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    index = np.arange(n, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)  # block within its prompt
    cap = n + 1  # above every finite distance: a first access
    finite = np.minimum(distances, cap)
    offset = request * (cap + 1)  # a running maximum that restarts at every prompt
    running = np.maximum.accumulate(offset + finite) - offset
    # vLLM recomputes at least the prompt's last token: a full-hit prompt still prefills one token.
    cacheable = np.frombuffer(input_tokens, dtype=np.int64)[request] - 1
    tokens = np.minimum(block_tokens, cacheable - index * block_tokens)
    kept = (tokens > 0) & (running < cap)
    # distance d hits a cache of 2**k blocks iff d < 2**k iff bit_length(d) <= k (frexp's exponent, exact here):
    # token sums per bit length, then cumulative (integer sums: exact, whatever the order)
    lengths = np.frexp(running[kept].astype(np.float64))[1]
    hits = np.cumsum(np.bincount(lengths, weights=tokens[kept], minlength=len(CAPACITY_POINTS)))
    finite_curve = [float(hits[k] / total_input) for k in range(len(CAPACITY_POINTS) - 1)]
    return (*finite_curve, float(hits[-1] / total_input))


def summarise_trace(path: Path | str, *, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> TraceSummary:
    """One streaming pass (lengths, arrivals, every block id in order), then the prefix cache's stack-distance
    curve in NumPy."""
    path = Path(path)
    digest = hashlib.sha256()
    # array('q'), not lists: 8 bytes an entry instead of ~36
    inputs, outputs, blocks, per_request = array("q"), array("q"), array("q"), array("q")
    first_ts = last_ts = None
    for request in read_trace(path, block_tokens=block_tokens):
        digest.update(f"{request.timestamp_ms}|{request.input_tokens}|{request.output_tokens}|"
                      f"{request.hash_ids}\n".encode())
        inputs.append(request.input_tokens)
        outputs.append(request.output_tokens)
        try:
            blocks.extend(request.hash_ids)
        except OverflowError:
            raise _field_error(path, request.line, "hash_ids", "a block id does not fit in 64 bits",
                               "give block ids between -2**63 and 2**63 - 1") from None
        per_request.append(len(request.hash_ids))
        if request.timestamp_ms is not None:
            first_ts = request.timestamp_ms if first_ts is None else first_ts
            last_ts = request.timestamp_ms
    curve = _hit_curve(blocks, per_request, inputs, block_tokens)
    duration = None if first_ts is None or last_ts is None else (last_ts - first_ts) / 1e3
    n = len(inputs)
    rate = (n - 1) / duration if duration else None
    q = np.linspace(0, 100, 101)
    return TraceSummary(
        path=str(path), sha256=digest.hexdigest(), requests=n,
        input_percentiles=tuple(int(v) for v in np.percentile(np.frombuffer(inputs, dtype=np.int64), q,
                                                              method="inverted_cdf")),
        output_percentiles=tuple(int(v) for v in np.percentile(np.frombuffer(outputs, dtype=np.int64), q,
                                                               method="inverted_cdf")),
        duration_s=duration, arrival_rps=rate, block_tokens=block_tokens, hit_share_by_capacity=curve)
