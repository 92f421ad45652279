"""The requests one measured level sends, as the mooncake JSONL AIPerf replays (`--custom-dataset-type
mooncake_trace`), for the workloads AIPerf's own synthetic options cannot express.

AIPerf 0.13.0 reads `{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}` and builds each
prompt from its hash ids: every id is one `--isl-block-size`-token block (the same id, the same tokens; a last
id may be a partial block), ids not given are sampled afresh (dataset/generator/prompt.py
_build_token_sequence). So:
- a length distribution: lengths drawn from its deterministic `points` (the sample the simulator reads), seeded
  by the trial's seed and the level, every block its own id (no reuse);
- synthetic prefixes: each request starts with one of `num_prefixes` shared runs of ids, then its own;
- a trace: its first N requests, their own ids; with `arrival: trace` the timestamps are kept, rescaled so the
  window arrives at the level's rate.
Every id is salted by the level (`level_index`): AIPerf seeds a block's tokens from the file's hash, and a level
must not find the blocks of the level before it in the prefix cache (each level starts as cold as the trace's
own window).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tuner.errors import ConfigError
from tuner.workload import FixedLengths, NormalLengths, Workload, read_trace

SYNTHETIC_BLOCK_TOKENS = 16  # the finest shared-prefix grain AIPerf's hash blocks give (vLLM's GPU block)
MAX_BLOCK_TOKENS = 512  # the mooncake traces' block; a synthetic prefix uses the largest power of two dividing it
LEVEL_ID_STRIDE = 1 << 40  # ids of level k are offset by k * stride: no two levels share a block


def aiperf_synthesizes(workload: Workload) -> bool:
    """Whether AIPerf's own --isl/--isl-stddev/--osl/--osl-stddev produce this traffic: fixed or unclipped
    normal lengths, no shared prefixes, no trace. AIPerf redraws a normal sample below 0 and rounds up
    (common/random_generator.py sample_positive_normal_integer) where NormalLengths clips at min_tokens: the
    two agree when the mean is 3 standard deviations above 0 and nothing else clips."""
    def native(lengths: object) -> bool:
        if isinstance(lengths, FixedLengths):
            return True
        return (isinstance(lengths, NormalLengths) and lengths.min_tokens == 1 and lengths.max_tokens is None
                and lengths.mean >= 3 * lengths.stddev)

    return (native(workload.input_tokens) and native(workload.output_tokens) and workload.prefix is None
            and workload.trace is None and workload.arrival != "trace")


@dataclass(frozen=True)
class ReplayFile:
    """The JSONL written for one level and what AIPerf needs to read it as intended."""

    path: Path
    requests: int
    block_tokens: int
    timestamps: bool  # replay on the file's schedule (--fixed-schedule)
    input_tokens: int  # their sum: the denominator of the share the prefix cache should serve
    shared_tokens: int  # tokens of blocks some earlier request of the file already sent (an unbounded cache's hits)


def prefix_block_tokens(shared_tokens: int) -> int:
    """The hash block of a synthetic prefix: the largest power of two <= 512 dividing it, at least 16 (a prefix
    that is not a multiple of 16 is shared to its last whole 16-token block)."""
    block = MAX_BLOCK_TOKENS
    while block > SYNTHETIC_BLOCK_TOKENS and shared_tokens % block:
        block //= 2
    return block


def write_replay(workload: Workload, path: Path, *, requests: int, seed: int, level_index: int,
                 rate_rps: float | None = None) -> ReplayFile:
    """Write the level's requests to `path` (see the module docstring); `rate_rps` rescales a trace's
    timestamps (arrival: trace)."""
    if requests < 1:
        raise ValueError("a level sends at least one request")
    salt = level_index * LEVEL_ID_STRIDE
    if workload.trace is not None:
        rows, block = _trace_rows(workload, requests, salt, rate_rps)
    else:
        rows, block = _synthetic_rows(workload, requests, seed, level_index, salt)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as out:
        for row in rows:
            out.write(json.dumps(row, separators=(",", ":")) + "\n")
    return ReplayFile(path=path, requests=len(rows), block_tokens=block,
                      timestamps="timestamp" in rows[0], input_tokens=sum(r["input_length"] for r in rows),
                      shared_tokens=_shared_tokens(rows, block))


def _synthetic_rows(workload: Workload, requests: int, seed: int, level_index: int, salt: int
                    ) -> tuple[list[dict], int]:
    rng = np.random.default_rng([seed, level_index])
    inputs = rng.choice(workload.input_tokens.points, size=requests)
    outputs = rng.choice(workload.output_tokens.points, size=requests)
    prefix = workload.prefix
    if prefix is not None:
        block = prefix_block_tokens(prefix.shared_tokens)
        shared_blocks = prefix.shared_tokens // block
        choices = rng.integers(prefix.num_prefixes, size=requests)
    else:
        block, shared_blocks, choices = MAX_BLOCK_TOKENS, 0, np.zeros(requests, dtype=np.int64)
    next_id = salt + (prefix.num_prefixes * shared_blocks if prefix is not None else 0)
    rows = []
    for isl, osl, which in zip(inputs.tolist(), outputs.tolist(), choices.tolist(), strict=True):
        # the prefix's whole blocks that fit, then the request's own blocks (the last one partial)
        shared = min(shared_blocks, isl // block)
        ids = [salt + int(which) * shared_blocks + j for j in range(shared)]
        own = -(-(isl - shared * block) // block)
        ids += range(next_id, next_id + own)
        next_id += own
        rows.append({"input_length": int(isl), "output_length": int(osl), "hash_ids": ids})
    return rows, block


def _trace_rows(workload: Workload, requests: int, salt: int, rate_rps: float | None) -> tuple[list[dict], int]:
    """The trace's first `requests` lines; ids renumbered densely from the level's salt (same id, same block)."""
    trace = workload.trace
    assert trace is not None
    block = trace.block_tokens
    name = Path(trace.path).name
    renamed: dict[int, int] = {}
    next_id = salt
    sizes: dict[int, tuple[int, int]] = {}  # new id -> (block size, trace line): AIPerf needs one size per id
    rows: list[dict] = []
    times: list[float] = []
    for request in read_trace(trace.path, block_tokens=block):
        if len(rows) == requests:
            break
        count = len(request.hash_ids)
        if count and (count - 1) * block >= request.input_tokens:
            raise ConfigError(f"{count} hash_ids of {block} tokens are more than input_length "
                              f"{request.input_tokens} holds", field=f"{name} line {request.line}: hash_ids",
                              fix=f"give one id per {block}-token block of the prompt (or the trace's block_tokens)")
        ids = []
        for trace_id in request.hash_ids:
            if trace_id not in renamed:
                renamed[trace_id] = next_id
                next_id += 1
            ids.append(renamed[trace_id])
        if not ids:  # AIPerf would sample it from its seeded RNG: the same prompt at every level
            count = -(-request.input_tokens // block)
            ids = list(range(next_id, next_id + count))
            next_id += count
        for index, new in enumerate(ids):
            size = min(block, request.input_tokens - index * block)
            seen = sizes.setdefault(new, (size, request.line))
            if seen[0] != size:
                raise ConfigError(f"a hash id is a {size}-token block here and a {seen[0]}-token block on line "
                                  f"{seen[1]}", field=f"{name} line {request.line}: hash_ids",
                                  fix="an id names one block: only a prompt's last block may be partial, and a "
                                  "partial block's id must not recur as a whole one")
        rows.append({"input_length": request.input_tokens, "output_length": request.output_tokens, "hash_ids": ids})
        if workload.arrival == "trace":
            if request.timestamp_ms is None:
                raise ConfigError("no timestamp", field=f"{name} line {request.line}: timestamp",
                                  fix="arrival: trace replays the trace's timestamps; give every line one, "
                                  "or use arrival: poisson")
            times.append(request.timestamp_ms)
    if times:
        for row, ms in zip(rows, _rescaled(times, rate_rps), strict=True):
            row["timestamp"] = ms
    return rows, block


def _rescaled(times_ms: list[float], rate_rps: float | None) -> list[float]:
    """The window's arrival times from 0, stretched so it arrives at `rate_rps` on average (its own rate
    when None); a window with no time between its requests is spread evenly at that rate."""
    start, span = times_ms[0], times_ms[-1] - times_ms[0]
    n = len(times_ms)
    if rate_rps is None:
        return [t - start for t in times_ms]
    if span <= 0 or n < 2:
        return [round(i * 1e3 / rate_rps, 3) for i in range(n)]
    scale = (n - 1) / rate_rps * 1e3 / span
    return [round((t - start) * scale, 3) for t in times_ms]


def _shared_tokens(rows: list[dict], block: int) -> int:
    """Input tokens an unbounded prefix cache serves within the file: a request's leading blocks already sent,
    up to its first new one (vLLM's block hashes chain; its own last token is always computed)."""
    seen: set[int] = set()
    total = 0
    for row in rows:
        cacheable = row["input_length"] - 1
        for index, block_id in enumerate(row["hash_ids"]):
            if block_id not in seen:
                break
            total += max(0, min(block, cacheable - index * block))
        seen.update(row["hash_ids"])
    return total
