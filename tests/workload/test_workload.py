"""The workload type: distributions, traces (streaming, errors naming line and field), prefix reuse, shorthand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from tuner.errors import ConfigError
from tuner.workload import (
    FixedLengths,
    HistogramLengths,
    LogNormalLengths,
    NormalLengths,
    Workload,
    read_trace,
    summarise_trace,
)


def _write(path: Path, rows: list[dict | str]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_fixed_shorthand_serialises_as_before_and_reads_old_records() -> None:
    w = Workload.fixed(8192, 1024, (1, 8))
    assert (w.isl, w.osl, w.is_fixed, w.max_model_len) == (8192, 1024, True, 9728)
    assert w.identity_json() == '{"isl":8192,"osl":1024,"concurrency":[1,8],"requests_per_level":0}'
    old = Workload.model_validate_json('{"isl":100,"osl":20,"concurrency":[4,1],"requests_per_level":0}')
    assert old == Workload.fixed(100, 20, (1, 4))
    assert Workload.model_validate_json(w.model_dump_json()) == w


def test_distributions_reduce_to_samples_with_their_moments() -> None:
    normal = NormalLengths(mean=1000, stddev=200)
    assert abs(normal.expected - 1000) < 5 and normal.quantile(0.9) == pytest.approx(1000 + 1.2816 * 200, rel=0.02)
    logn = LogNormalLengths(mean=2000, stddev=1500)
    assert abs(logn.expected - 2000) / 2000 < 0.05 and logn.quantile(0.99) > 3 * logn.quantile(0.5)
    assert logn.longest > logn.points.max() - 1
    hist = HistogramLengths(bins=((100, 3), (1000, 1)))
    assert np.mean(hist.points == 100) == pytest.approx(0.75) and hist.longest == 1000
    assert FixedLengths(tokens=7).points.tolist() == [7] * len(FixedLengths(tokens=7).points)


def test_bad_workloads_name_the_field() -> None:
    with pytest.raises(ValidationError, match="request_rates"):
        Workload(arrival="poisson")
    with pytest.raises(ValidationError, match="open-loop"):
        Workload(request_rates=(1.0,))
    with pytest.raises(ValidationError, match="shorter than the longest prompt"):
        Workload(isl=100, osl=10, prefix={"shared_tokens": 200})
    with pytest.raises(ValidationError):
        NormalLengths(mean=-1, stddev=1)


def test_trace_summary_lengths_rate_and_prefix_reuse(tmp_path: Path) -> None:
    # Two prompts sharing their first two 512-token blocks, then a third repeating the first exactly.
    trace = _write(tmp_path / "t.jsonl", [
        {"timestamp": 0, "input_length": 1536, "output_length": 10, "hash_ids": [1, 2, 3]},
        {"timestamp": 500, "input_length": 1536, "output_length": 20, "hash_ids": [1, 2, 4]},
        {"timestamp": 1000, "input_length": 1536, "output_length": 30, "hash_ids": [1, 2, 3]},
    ])
    s = summarise_trace(trace)
    assert (s.requests, s.duration_s, s.arrival_rps) == (3, 1.0, 2.0)
    # Hits: request 2 reuses blocks 1, 2 (1024 tokens); request 3 reuses 1, 2 and 3 (1535: the last token is
    # always recomputed). Of 4608 input tokens, 2559 hit with an unbounded cache.
    assert s.prefix_reuse == pytest.approx(2559 / 4608)
    # Block 3's reuse distance is 2 (blocks 4 and ... distinct since): a 2-block cache misses it, a 4-block one hits.
    assert s.hit_share(2 * 512) < s.hit_share(4 * 512) == pytest.approx(s.prefix_reuse)
    assert s.hit_share(100) == 0.0
    w = Workload.from_trace(trace)
    assert w.isl == 1536 and w.osl == 20 and w.trace == s
    # Round robin over two caches finds a block where its last use went only half the time.
    assert w.prefix_hit_share(1e6, ranks=2, cache_aware=False) == pytest.approx(s.prefix_reuse / 2)
    assert w.prefix_hit_share(1e6, ranks=2, cache_aware=True) == pytest.approx(s.prefix_reuse)


@pytest.mark.parametrize(("line", "needles"), [
    ("not json", ["line 2", "not JSON"]),
    ('{"input_length": -5, "output_length": 3}', ["line 2", "input_length", "positive integer"]),
    ('{"output_length": 3}', ["line 2", "input_length", "missing"]),
    ('{"timestamp": 5, "input_length": 5, "output_length": 3}', ["line 2", "timestamp", "earlier", "sort"]),
    ('{"timestamp": 1' + "0" * 400 + ', "input_length": 5, "output_length": 3}', ["line 2", "timestamp", "ms"]),
    ('{"input_length": 5000, "output_length": 3, "hash_ids": [' + str(2**64) + ']}', ["line 2", "hash_ids", "64"]),
    ('{"input_length": 5, "output_length": 3, "hash_ids": ["a"]}', ["line 2", "hash_ids"]),
    ("[1, 2]", ["line 2", "not a JSON object"]),
])
def test_bad_trace_lines_name_line_and_field(tmp_path: Path, line: str, needles: list[str]) -> None:
    trace = _write(tmp_path / "bad.jsonl", [{"timestamp": 10, "input_length": 5, "output_length": 3}, line])
    with pytest.raises(ConfigError) as err:
        summarise_trace(trace)
    message = err.value.user_message()
    assert all(n in message for n in needles), message
    assert "bad.jsonl" in message


def test_huge_or_empty_trace_is_refused_before_reading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tuner.workload._trace as trace_module

    big = _write(tmp_path / "big.jsonl", [{"input_length": 5, "output_length": 3}] * 10)
    monkeypatch.setattr(trace_module, "MAX_TRACE_BYTES", 100)
    with pytest.raises(ConfigError, match="at most"):
        next(read_trace(big))
    monkeypatch.undo()
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ConfigError, match="holds no request"):
        summarise_trace(tmp_path / "empty.jsonl")


def test_stack_distances_match_a_direct_lru(tmp_path: Path) -> None:
    """The Fenwick stack-distance curve equals replaying the trace through LRU caches of each size (the growth
    of the tree past its first 65,536 positions included)."""
    rng = np.random.default_rng(3)
    rows = []
    for _ in range(16000):  # ~80,000 block accesses
        prefix = int(rng.integers(0, 40))
        blocks = [prefix * 1000 + k for k in range(int(rng.integers(1, 10)))]
        rows.append({"input_length": 512 * len(blocks) + 1, "output_length": 5, "hash_ids": blocks})
    summary = summarise_trace(_write(tmp_path / "r.jsonl", rows))
    for capacity_blocks in (8, 64, 256):
        cache: dict[int, None] = {}
        hit = total = 0
        for row in rows:
            total += row["input_length"]
            prefix_ok = True
            for block in row["hash_ids"]:
                found = block in cache
                prefix_ok = prefix_ok and found
                if prefix_ok:
                    hit += 512
                cache.pop(block, None)
                cache[block] = None
                if len(cache) > capacity_blocks:
                    cache.pop(next(iter(cache)))
        assert summary.hit_share(capacity_blocks * 512) == pytest.approx(hit / total), capacity_blocks


@pytest.mark.parametrize("seed", range(6))
def test_vectorised_stack_distances_equal_an_lru_stack(seed: int) -> None:
    """stack_distances (NumPy, bit by bit) against the definition: the block's depth in an LRU stack."""
    from tuner.workload._trace import _INF, stack_distances

    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    blocks = rng.integers(0, int(rng.integers(1, 400)), size=n) * (-1) ** seed * 2**40  # sparse, signed ids
    stack: list[int] = []
    expected = []
    for b in blocks.tolist():
        if b in stack:
            depth = len(stack) - 1 - stack.index(b)
            stack.remove(b)
        else:
            depth = _INF
        expected.append(depth)
        stack.append(b)
    assert stack_distances(blocks.astype(np.int64)).tolist() == expected
