"""How long `summarise_trace` (what `topotune workload FILE`, a study's trace and `POST /v1/advice` read) takes on a
large valid mooncake trace: the streaming read of every line, then the LRU stack-distance hit curve. Goal: well
under 20 s for 1 M lines (it took 196 s when the distances were a Fenwick tree walked in Python).

The trace is generated (seeded): requests with 1-17 blocks of 512 tokens (about 9 M blocks for 1 M lines), a
prefix drawn from a few thousand shared documents (Zipf-like, so the curve has reuse at every capacity), then
blocks of their own. With --check N, the first N lines' curve is also compared with a direct LRU replay.

Run: taskset -c 0 .venv/bin/python benchmarks/trace_summary_speed.py [--lines 1000000] [--repeat 1] [--check 20000]
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

import numpy as np

from tuner.workload import summarise_trace
from tuner.workload._trace import CAPACITY_POINTS, _hit_curve, read_trace


def write_trace(path: Path, lines: int, seed: int = 0) -> int:
    """A trace of `lines` requests; returns its block count."""
    rng = np.random.default_rng(seed)
    documents = 4000
    shared = rng.zipf(1.3, size=lines) % documents
    shared_blocks = rng.integers(1, 9, size=lines)
    own_blocks = rng.integers(0, 9, size=lines)
    blocks = 0
    next_id = documents * 16
    with path.open("w") as out:
        for i in range(lines):
            ids = [int(shared[i]) * 16 + k for k in range(int(shared_blocks[i]))]
            ids += range(next_id, next_id + int(own_blocks[i]))
            next_id += int(own_blocks[i])
            blocks += len(ids)
            out.write(json.dumps({"timestamp": i * 10, "input_length": 512 * len(ids) - int(rng.integers(0, 400)),
                                  "output_length": int(rng.integers(16, 512)), "hash_ids": ids}) + "\n")
    return blocks


def lru_curve(path: Path, capacities: tuple[int, ...]) -> list[float]:
    """The definition: replay the prompts through one LRU cache per capacity (slow; small traces only)."""
    hits = dict.fromkeys(capacities, 0)
    total = 0
    caches: dict[int, dict[int, None]] = {c: {} for c in capacities}
    for r in read_trace(path):
        total += r.input_tokens
        for c, cache in caches.items():
            prefix_ok = True
            for index, block in enumerate(r.hash_ids):
                prefix_ok = prefix_ok and block in cache
                if prefix_ok:
                    hits[c] += max(0, min(512, r.input_tokens - 1 - index * 512))
                cache.pop(block, None)
                cache[block] = None
                if len(cache) > c:
                    cache.pop(next(iter(cache)))
    return [hits[c] / total for c in capacities]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--check", type=int, default=0, help="also check a trace of this many lines against LRU")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.jsonl"
        blocks = write_trace(path, args.lines)
        print(f"trace: {args.lines:,} lines, {blocks:,} blocks, {path.stat().st_size / 2**20:,.0f} MiB")
        times, cpu = [], []
        for _ in range(args.repeat):
            start, start_cpu = time.perf_counter(), time.process_time()
            summary = summarise_trace(path)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        print(f"summarise_trace: min {min(times):.1f} s wall, {min(cpu):.1f} s CPU over {args.repeat} run(s) "
              f"(goal < 20 s: {'met' if min(times) < 20 else 'NOT met'}); prefix reuse {summary.prefix_reuse:.3f}; "
              f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB")
        _split(path)
        if args.check:
            small = Path(tmp) / "small.jsonl"
            write_trace(small, args.check, seed=1)
            capacities = (64, 1024, 16384)
            got = [summarise_trace(small).hit_share(c * 512) for c in capacities]
            want = lru_curve(small, capacities)
            print(f"check on {args.check:,} lines, capacities {capacities} blocks: stack distances {got}, "
                  f"direct LRU {want}: {'equal' if np.allclose(got, want, rtol=1e-12) else 'DIFFERENT'}")


def _split(path: Path) -> None:
    """Where the time goes: reading and checking the lines, then the curve."""
    from array import array

    start = time.perf_counter()
    blocks, per_request, inputs = array("q"), array("q"), array("q")
    for r in read_trace(path):
        blocks.extend(r.hash_ids)
        per_request.append(len(r.hash_ids))
        inputs.append(r.input_tokens)
    read_s = time.perf_counter() - start
    start = time.perf_counter()
    _hit_curve(blocks, per_request, inputs, 512)
    print(f"  of which: reading {read_s:.1f} s, hit curve ({len(CAPACITY_POINTS)} capacities) "
          f"{time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
