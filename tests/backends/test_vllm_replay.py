"""What a real trial sends AIPerf for each kind of workload: the argv (flags read from the installed AIPerf
0.13.0's cli_config.py) and the mooncake JSONL written for a level (lengths, shared hash ids, timestamps)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tuner.backends.vllm import default_envs_dir
from tuner.backends.vllm._aiperf import AiperfRun, tokenizer_hub_alias
from tuner.backends.vllm._backend import _Level, _synthetic
from tuner.backends.vllm._replay import (
    LEVEL_ID_STRIDE,
    aiperf_synthesizes,
    prefix_block_tokens,
    write_replay,
)
from tuner.errors import ConfigError
from tuner.workload import LogNormalLengths, NormalLengths, PrefixSharing, Workload

AIPERF_PYTHON = default_envs_dir() / "aiperf" / "bin" / "python"
BASE = {"aiperf_argv": ("aiperf",), "model": "m", "tokenizer": "/tok", "url": "http://h:1", "request_count": 24}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _trace(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# -- argv per workload kind ---------------------------------------------------------------------------------
def test_normal_lengths_use_aiperfs_own_stddev_flags(tmp_path: Path) -> None:
    w = Workload(input_tokens=NormalLengths(mean=300.4, stddev=60), output_tokens=NormalLengths(mean=10, stddev=3),
                 concurrency=(2,))
    assert aiperf_synthesizes(w)
    (isl, isl_sd), (osl, osl_sd) = _synthetic(w.input_tokens), _synthetic(w.output_tokens)
    argv = AiperfRun(**BASE, isl=isl, isl_stddev=isl_sd, osl=osl, osl_stddev=osl_sd, concurrency=2,
                     warmup_request_count=2).argv(tmp_path)
    assert [_flag(argv, f) for f in ("--isl", "--isl-stddev", "--osl", "--osl-stddev")] == ["300", "60", "10", "3"]
    assert _flag(argv, "--concurrency") == "2" and "--input-file" not in argv
    # one prompt per request, warm-up's included: a smaller pool resends the warm-up's prompts
    assert _flag(argv, "--num-dataset-entries") == "26"
    assert _flag(argv, "--export-level") == "records"


def test_clipped_or_skewed_lengths_prefixes_and_traces_are_replayed_from_a_file() -> None:
    assert not aiperf_synthesizes(Workload(input_tokens=NormalLengths(mean=300, stddev=60, max_tokens=400)))
    assert not aiperf_synthesizes(Workload(input_tokens=NormalLengths(mean=300, stddev=150)))  # its tail at 0
    assert not aiperf_synthesizes(Workload(input_tokens=LogNormalLengths(mean=300, stddev=200)))
    assert not aiperf_synthesizes(Workload(isl=1024, osl=8, prefix=PrefixSharing(shared_tokens=512)))


def test_open_loop_poisson_argv(tmp_path: Path) -> None:
    argv = AiperfRun(**BASE, isl=128, osl=8, request_rate=2.5, warmup_request_count=3).argv(tmp_path)
    assert _flag(argv, "--request-rate") == "2.5" and _flag(argv, "--arrival-pattern") == "poisson"
    assert "--concurrency" not in argv and "--fixed-schedule" not in argv


def test_replay_argv_closed_loop_and_trace_schedule(tmp_path: Path) -> None:
    closed = AiperfRun(**BASE, isl=1, osl=1, input_file="/x/requests.jsonl", block_tokens=128,
                       concurrency=4).argv(tmp_path)
    assert _flag(closed, "--input-file") == "/x/requests.jsonl"
    assert _flag(closed, "--custom-dataset-type") == "mooncake_trace" and _flag(closed, "--isl-block-size") == "128"
    assert "--no-fixed-schedule" in closed and _flag(closed, "--concurrency") == "4"
    # the file decides lengths; AIPerf's warm-up would consume (and later resend) the file's first requests
    assert "--isl" not in closed and "--warmup-request-count" not in closed
    scheduled = AiperfRun(**BASE, isl=1, osl=1, input_file="/x/r.jsonl", block_tokens=512,
                          fixed_schedule=True).argv(tmp_path)
    assert "--fixed-schedule" in scheduled and "--no-fixed-schedule" not in scheduled
    assert "--request-rate" not in scheduled and "--concurrency" not in scheduled


def test_run_takes_exactly_one_load_and_no_warmup_on_a_file() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        AiperfRun(**BASE, isl=1, osl=1, concurrency=2, request_rate=1.0)
    with pytest.raises(ValueError, match="input_file"):
        AiperfRun(**BASE, isl=1, osl=1, fixed_schedule=True)
    with pytest.raises(ValueError, match="warm-up"):
        AiperfRun(**BASE, isl=1, osl=1, input_file="/f", concurrency=2, warmup_request_count=2)


def test_levels_are_clients_or_rates() -> None:
    closed = [_Level(i, v, w) for w in [Workload(isl=8, osl=8, concurrency=(1, 8))] for i, v in enumerate(w.levels)]
    assert [(lv.name, lv.clients, lv.rate_rps) for lv in closed] == [("c1", 1, None), ("c8", 8, None)]
    w = Workload(isl=8, osl=8, arrival="poisson", request_rates=(0.5, 3.0))
    opened = [_Level(i, v, w) for i, v in enumerate(w.levels)]
    assert [(lv.name, lv.clients, lv.rate_rps, lv.slots) for lv in opened] == [("r0.5", None, 0.5, 1),
                                                                              ("r3", None, 3.0, 3)]
    assert opened[1].describe() == "3 req/s (Poisson)"


@pytest.mark.skipif(not AIPERF_PYTHON.exists(), reason="AIPerf venv missing (make cpu-vllm)")
def test_tokenizer_hub_alias_resolves_offline(tmp_path: Path) -> None:
    """AIPerf's hash-id decoding workers force HF_HUB_OFFLINE and resolve the tokenizer with
    snapshot_download(local_files_only=True): the alias must resolve there (AIPerf's own huggingface_hub), to
    the tokenizer's files and not the weights."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"\0")
    repo = tokenizer_hub_alias(model, tmp_path / "hub")
    assert tokenizer_hub_alias(model, tmp_path / "hub") == repo  # idempotent across levels
    found = subprocess.run([str(AIPERF_PYTHON), "-c", "import sys; from huggingface_hub import snapshot_download; "
                            "print(snapshot_download(sys.argv[1], local_files_only=True))", repo],
                           env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")},
                           capture_output=True, text=True, check=True, timeout=120)
    snapshot = Path(found.stdout.strip())
    assert (snapshot / "tokenizer.json").read_text() == "{}"
    assert not (snapshot / "model.safetensors").exists()


# -- the JSONL a level replays ------------------------------------------------------------------------------
def test_distribution_lengths_are_drawn_from_the_points_deterministically(tmp_path: Path) -> None:
    w = Workload(input_tokens=LogNormalLengths(mean=600, stddev=400), output_tokens=NormalLengths(
        mean=20, stddev=5, max_tokens=30), concurrency=(4,))
    a = write_replay(w, tmp_path / "a.jsonl", requests=200, seed=7, level_index=0)
    b = write_replay(w, tmp_path / "b.jsonl", requests=200, seed=7, level_index=0)
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    rows = _rows(a.path)
    assert len(rows) == a.requests == 200 and not a.timestamps
    assert {r["input_length"] for r in rows} <= set(w.input_tokens.points.tolist())
    assert {r["output_length"] for r in rows} <= set(w.output_tokens.points.tolist())
    assert abs(np.mean([r["input_length"] for r in rows]) - w.input_tokens.expected) < 0.15 * w.input_tokens.expected
    # every block its own id, the last one partial: nothing to reuse, lengths exactly as AIPerf builds them
    ids = [i for r in rows for i in r["hash_ids"]]
    assert len(ids) == len(set(ids)) and a.shared_tokens == 0
    assert all(-(-r["input_length"] // a.block_tokens) == len(r["hash_ids"]) for r in rows)
    other_level = _rows(write_replay(w, tmp_path / "c.jsonl", requests=200, seed=7, level_index=1).path)
    assert not set(ids) & {i for r in other_level for i in r["hash_ids"]}
    assert b.input_tokens == a.input_tokens


def test_synthetic_prefixes_are_shared_leading_ids(tmp_path: Path) -> None:
    w = Workload(isl=1000, osl=8, prefix=PrefixSharing(shared_tokens=768, num_prefixes=2), concurrency=(4,))
    replay = write_replay(w, tmp_path / "p.jsonl", requests=24, seed=1, level_index=0)
    assert replay.block_tokens == prefix_block_tokens(768) == 256
    rows = _rows(replay.path)
    heads = {tuple(r["hash_ids"][:3]) for r in rows}
    assert len(heads) == 2  # two prefixes of three 256-token blocks
    tails = [i for r in rows for i in r["hash_ids"][3:]]
    assert len(tails) == len(set(tails)) and not set(tails) & {i for h in heads for i in h}
    assert all(r["input_length"] == 1000 and len(r["hash_ids"]) == 4 for r in rows)
    # every request after the first of its prefix finds 768 tokens cached
    assert replay.shared_tokens == (24 - 2) * 768
    assert prefix_block_tokens(1000) == 16  # 1000 = 8 x 125: shared to its last whole 16-token block


def test_a_prompt_shorter_than_the_prefix_shares_its_whole_blocks(tmp_path: Path) -> None:
    w = Workload(input_tokens=NormalLengths(mean=600, stddev=300, max_tokens=1500), osl=4,
                 prefix=PrefixSharing(shared_tokens=512), concurrency=(2,))
    rows = _rows(write_replay(w, tmp_path / "s.jsonl", requests=64, seed=3, level_index=0).path)
    for r in rows:
        block = 512
        assert (len(r["hash_ids"]) - 1) * block < r["input_length"] <= len(r["hash_ids"]) * block
        if r["input_length"] >= 512:
            assert r["hash_ids"][0] == 0


def test_trace_window_keeps_ids_renumbers_per_level_and_rescales_time(tmp_path: Path) -> None:
    path = _trace(tmp_path / "t.jsonl", [
        {"timestamp": 1000, "input_length": 300, "output_length": 5, "hash_ids": [70, 71, 99]},
        {"timestamp": 1500, "input_length": 256, "output_length": 6, "hash_ids": [70, 71]},
        {"timestamp": 3000, "input_length": 100, "output_length": 7},
        {"timestamp": 9000, "input_length": 128, "output_length": 8, "hash_ids": [5]},
    ])
    w = Workload.from_trace(path, block_tokens=128, arrival="trace", request_rates=(2.0,))
    level0 = write_replay(w, tmp_path / "l0.jsonl", requests=3, seed=0, level_index=0, rate_rps=2.0)
    rows = _rows(level0.path)
    assert [r["input_length"] for r in rows] == [300, 256, 100] and [r["output_length"] for r in rows] == [5, 6, 7]
    assert rows[0]["hash_ids"][:2] == rows[1]["hash_ids"] and rows[0]["hash_ids"][2] not in rows[1]["hash_ids"]
    assert len(rows[2]["hash_ids"]) == 1 and rows[2]["hash_ids"][0] not in rows[0]["hash_ids"]  # own ids
    assert level0.block_tokens == 128 and level0.timestamps
    # 3 requests in 2 s at 2 req/s means 1 s: times halved, from 0
    assert [r["timestamp"] for r in rows] == [0.0, 250.0, 1000.0]
    assert level0.shared_tokens == 255  # the second prompt: its two blocks but the last token, which vLLM computes
    level1 = _rows(write_replay(w, tmp_path / "l1.jsonl", requests=3, seed=0, level_index=1, rate_rps=2.0).path)
    assert [r["hash_ids"][0] - LEVEL_ID_STRIDE for r in level1] == [r["hash_ids"][0] for r in rows]
    closed = write_replay(Workload.from_trace(path, block_tokens=128, concurrency=(2,)), tmp_path / "c.jsonl",
                          requests=10, seed=0, level_index=0)
    assert closed.requests == 4 and not closed.timestamps  # the whole trace when it is shorter than the level


def test_trace_whose_ids_do_not_fit_its_lengths_is_refused_by_line(tmp_path: Path) -> None:
    too_many = _trace(tmp_path / "bad.jsonl", [{"input_length": 100, "output_length": 5, "hash_ids": [1, 2, 3]}])
    with pytest.raises(ConfigError, match=r"bad\.jsonl line 1: hash_ids"):
        write_replay(Workload.from_trace(too_many, block_tokens=64), tmp_path / "o.jsonl", requests=1, seed=0,
                     level_index=0)
    resized = _trace(tmp_path / "resized.jsonl", [
        {"input_length": 100, "output_length": 5, "hash_ids": [1, 2]},
        {"input_length": 200, "output_length": 5, "hash_ids": [1, 2, 3, 4]},
    ])
    with pytest.raises(ConfigError, match=r"resized.jsonl line 2: hash_ids.*line 1"):
        write_replay(Workload.from_trace(resized, block_tokens=64), tmp_path / "o.jsonl", requests=2, seed=0,
                     level_index=0)


def test_plans_ask_for_prefix_caching_when_the_workload_reuses_prefixes(tmp_path: Path) -> None:
    from tuner.backends import TrialRequest
    from tuner.backends.vllm import VllmBackend, VllmBackendSettings
    from tuner.deployment import Deployment
    from tuner.topology import Topology

    backend = VllmBackend(VllmBackendSettings(vllm_version="0.32.0"))
    pd = Deployment.disaggregated(Topology.parse("TP1"), 1, Topology.parse("TP1"), 1)

    def servers(workload: Workload) -> list[tuple[str, ...]]:
        request = TrialRequest(trial_id="t", model_path=str(tmp_path), gpu="h100", deployment=pd, workload=workload)
        return [p.argv for p in backend.plan(request, port_base=9000).servers]

    shared = Workload(isl=1024, osl=8, prefix=PrefixSharing(shared_tokens=512))
    assert all("--enable-prefix-caching" in argv for argv in servers(shared))
    assert not any("--enable-prefix-caching" in argv for argv in servers(Workload(isl=1024, osl=8)))


def test_a_whole_trace_replayed_reuses_what_its_summary_says(tmp_path: Path) -> None:
    """The file's own reuse (what an unbounded cache serves) and the trace summary's stack-distance curve at
    infinite capacity are computed apart: on a window holding the whole trace they agree."""
    rng = np.random.default_rng(5)
    rows, fresh = [], 10_000
    for _ in range(60):
        shared = [int(p) * 100 + j for p in [rng.integers(4)] for j in range(int(rng.integers(0, 4)))]
        own = int(rng.integers(1, 3))
        length = (len(shared) + own - 1) * 64 + int(rng.integers(1, 65))
        rows.append({"input_length": length, "output_length": 4, "hash_ids": shared + list(range(fresh, fresh + own))})
        fresh += own
    w = Workload.from_trace(_trace(tmp_path / "t.jsonl", rows), block_tokens=64)
    replay = write_replay(w, tmp_path / "r.jsonl", requests=60, seed=0, level_index=2)
    assert w.trace is not None and w.trace.prefix_reuse > 0.2
    assert replay.shared_tokens / replay.input_tokens == pytest.approx(w.trace.prefix_reuse, rel=1e-12)
