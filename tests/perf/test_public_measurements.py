"""The public-measurement table that benchmarks/fidelity.py replays: every row cites a source and is replayable."""

from __future__ import annotations

from pathlib import Path

import pytest
from _support.benchmarks import load_benchmark
from _support.paths import REPO

from tuner.hardware import get_gpu
from tuner.memory import compute_memory
from tuner.models import load_model
from tuner.perf import Calibration, RooflineModel
from tuner.topology import Role, Topology


@pytest.fixture(scope="module")
def fidelity():  # the benchmark script, imported as a module (it is not part of the library)
    return load_benchmark("fidelity")


def test_table_has_cited_rows_for_four_gpus_and_five_checkpoints(fidelity) -> None:
    sources, rows = fidelity.load_table(fidelity.TABLE)
    for source in sources.values():
        assert source["url"].startswith("https://") and source["what"]
    vllm = [r for r in rows if r.is_vllm]
    assert len({r.gpu for r in vllm}) >= 4
    assert len({r.checkpoint for r in vllm}) >= 5
    assert {r.engine for r in rows} >= {"vllm", "sglang"}
    for r in rows:
        assert r.tok_s_per_gpu > 0 and r.isl >= 1 and r.osl >= 1
        assert (REPO / r.model / "config.json").exists(), r.model
        assert r.scored or r.why, f"{r.id} is left out without a reason"


def test_every_row_replays(fidelity) -> None:
    _, rows = fidelity.load_table(fidelity.TABLE)
    replayer = fidelity.Replayer()
    for r in rows:
        p = replayer.predict(r, fidelity.PRIORS[fidelity.gpu_class(replayer.gpu(r.gpu))])
        assert p.tok_s_per_gpu > 0, r.id
        assert r.role == "prefill" or p.tok_s_per_user > 0, r.id  # a prefill role emits no decode tokens


def test_unknown_source_is_refused(fidelity, tmp_path: Path) -> None:
    bad = tmp_path / "t.yaml"
    bad.write_text("sources: {}\nrows:\n  - {id: x, source: nowhere}\n")
    with pytest.raises(SystemExit, match="unknown source"):
        fidelity.load_table(bad)


def test_old_vllm_sizes_kv_without_a_graph_reserve(fidelity) -> None:
    assert fidelity._version("0.11.0") < (0, 21) <= fidelity._version("0.21.0")
    assert fidelity._version("main (2026-02)") > (0, 21)
    model = load_model(REPO / "examples" / "models" / "qwen3-235b-a22b")
    topo = Topology.parse("TP8", gpu_memory_utilization=0.9)
    reserved = RooflineModel(model, get_gpu("h100"))
    none = RooflineModel(model, get_gpu("h100"), cuda_graph_gib=0.0)
    assert none.capacity(topo, Role.BOTH, isl=2000, osl=100) > reserved.capacity(topo, Role.BOTH, isl=2000, osl=100)
    assert none.with_calibration(Calibration()).cuda_graph_gib == 0.0


def test_kv_occupancy_scales_the_running_cap(fidelity) -> None:
    model = load_model(REPO / "benchmarks" / "data" / "models" / "qwen3-14b")
    topo = Topology.parse("TP1", gpu_memory_utilization=0.9)
    full = RooflineModel(model, get_gpu("h100"), Calibration(kv_occupancy=1.0))
    part = full.with_calibration(Calibration(kv_occupancy=0.5))
    cap = full.capacity(topo, Role.BOTH, isl=2000, osl=100)
    assert part.capacity(topo, Role.BOTH, isl=2000, osl=100) == max(1, int(cap * 0.5))


def test_row_serve_flags_reach_the_replay(fidelity, tmp_path: Path) -> None:
    """A row's `serve:` (the source's own vLLM flags) changes what is replayed: FP8 KV holds more requests."""
    table = tmp_path / "t.yaml"
    row = ("{id: %s, source: s, engine: vllm, engine_version: '0.21.0', gpu: b200, model: examples/models/minimax-m2, "
           "checkpoint: c, topology: TP2, role: aggregated, isl: 7372.5, osl: 921.5, "
           "load: {kind: closed, concurrency: 512}, %s measured: {tok_s_per_gpu: 1, counts: total}}")
    table.write_text("sources: {s: {url: 'https://x', what: w}}\nrows:\n"
                     f"  - {row % ('auto', '')}\n  - {row % ('fp8', 'serve: {kv_cache_dtype: fp8},')}\n")
    _, (auto, fp8) = fidelity.load_table(table)
    assert dict(fp8.serve) == {"kv_cache_dtype": "fp8"} and auto.serve == ()
    replayer = fidelity.Replayer()
    cal = fidelity.PRIORS["blackwell"]
    assert replayer.predict(fp8, cal).tok_s_per_gpu > 1.2 * replayer.predict(auto, cal).tok_s_per_gpu
    table.write_text(table.read_text().replace("kv_cache_dtype: fp8", "kv_dtype: fp8"))
    with pytest.raises(SystemExit, match="unknown setting"):
        fidelity.load_table(table)


def test_kv_bytes_and_stream_interval_of_a_row_reach_the_replay(fidelity, tmp_path: Path) -> None:
    """The GB200 decode rows sized the KV cache by bytes (--kv_cache_memory_bytes) and streamed 50 tokens at a
    time: the first sets the replay's capacity exactly, the second its per-request host cost."""
    table = tmp_path / "t.yaml"
    row = ("{id: %s, source: s, engine: vllm, engine_version: '0.21.0', gpu: gb200, "
           "model: benchmarks/data/models/deepseek-r1-0528-nvfp4, checkpoint: c, topology: DEP8, role: decode, "
           "isl: 2000, osl: 2000, load: {kind: closed, concurrency: 8192}, serve: {kv_cache_dtype: fp8, %s}, "
           "measured: {tok_s_per_gpu: 1, counts: output}}")
    table.write_text("sources: {s: {url: 'https://x', what: w}}\nrows:\n"
                     f"  - {row % ('small', 'kv_cache_memory_bytes: 20000000000')}\n"
                     f"  - {row % ('large', 'kv_cache_memory_bytes: 119519622533')}\n"
                     f"  - {row % ('streamed', 'kv_cache_memory_bytes: 119519622533, stream_interval: 50')}\n")
    _, (small, large, streamed) = fidelity.load_table(table)
    replayer = fidelity.Replayer()
    cal = Calibration(request_step_us=60.0, streamed_request_share=0.5)
    model = replayer.perf(large, cal)
    assert model.kv_cache_memory_bytes == 119519622533
    topo = Topology.parse("DEP8", role=Role.DECODE, kv_cache_dtype="fp8")
    budget = model.state(topo, Role.DECODE, isl=2000, osl=2000).memory.kv_budget_bytes
    assert budget == 119519622533
    assert replayer.predict(small, cal).tok_s_per_gpu < replayer.predict(large, cal).tok_s_per_gpu
    assert replayer.predict(streamed, cal).tok_s_per_gpu > replayer.predict(large, cal).tok_s_per_gpu


def test_running_requests_hold_their_current_context_under_a_queue(fidelity) -> None:
    """vLLM allocates KV blocks as tokens are computed and preempts the newest request when they run out, so a
    saturated instance runs KV / (isl + osl/2) requests, not KV / (isl + osl): MiniMax-M2.5 TP4 on B200 (FP8 KV)
    ran ~410 at 8k/1k where the full-length cap is 386."""
    model = load_model(REPO / "examples" / "models" / "minimax-m2")
    topo = Topology.parse("TP4", kv_cache_dtype="fp8", max_num_batched_tokens=16384)
    perf = RooflineModel(model, get_gpu("b200"), Calibration(kv_occupancy=1.0))
    state = perf.state(topo, Role.BOTH, isl=7372, osl=921)
    full_length = int(state.memory.max_concurrency)
    running = perf.capacity(topo, Role.BOTH, isl=7372, osl=921)
    assert running == state.memory.num_gpu_blocks // state.memory.layout.blocks_per_request(7372 + 460, 16384)
    assert 1.04 * full_length < running < 1.08 * full_length  # (7372 + 921) / (7372 + 460) = 1.059
    capped = Topology.parse("TP4", kv_cache_dtype="fp8", max_num_batched_tokens=16384, max_num_seqs=64)
    assert perf.capacity(capped, Role.BOTH, isl=7372, osl=921) == 64  # max-num-seqs still caps it


def test_sliding_window_layers_hold_only_their_window(fidelity) -> None:
    """vLLM frees a sliding-window layer's blocks before the window as a request advances, so the scheduler runs
    about twice the requests of gpt-oss's reported maximum concurrency (its worst case: a whole token budget in
    flight per request). gpt-oss-120b on one H100 (vLLM 0.10.2, Marlin, 2K prompts sent 500 at once) measured a
    41.35 ms TPOT and 14,386 tok/s: ~27 requests at once (throughput x TPOT / tokens per request)."""
    _, rows = fidelity.load_table(fidelity.TABLE)
    row = next(r for r in rows if r.id == "oss120b-h100-2k")
    perf = fidelity.Replayer().perf(row, fidelity.default_calibration("h100"))
    topo = Topology.parse("TP1", role=Role.BOTH, **row.engine_flags)
    state = perf.state(topo, Role.BOTH, isl=1998, osl=98)
    layout = state.memory.layout
    groups = {kind.name: n for kind, n in layout.num_groups_by_kind.items()}
    full, window = groups["FULL_ATTENTION"], groups["SLIDING_WINDOW"]  # 18 layers each at TP1, one group each
    # 2,046 tokens of context: 128 blocks of 16 per full group; 127 tokens of window + the current block: 9
    assert layout.resident_blocks_per_request(1998 + 48) == full * 128 + window * 9
    assert layout.blocks_per_request(1998 + 48, 8192) == full * 128 + window * 129  # vLLM's reported worst case
    running = perf.capacity(topo, Role.BOTH, isl=1998, osl=98)
    assert running == (state.memory.num_gpu_blocks - window * 125) // (full * 128 + window * 9)  # one chunk in flight
    assert running > 1.7 * state.memory.max_concurrency
    burst = perf.predict_burst(topo, isl=1998, osl=98, prompts=500)
    assert 1000 / burst.tok_s_per_user == pytest.approx(41.35, rel=0.15)  # it was 22.5 ms at the reported cap
    # without a sliding window nothing changes: a full-attention request holds its whole context
    dense = compute_memory(load_model(REPO / "benchmarks" / "data" / "models" / "qwen3-8b"), get_gpu("h100"),
                           Topology.parse("TP1")).layout
    assert dense.resident_blocks_per_request(3000) == dense.blocks_per_request(3000, 8192)
    assert dense.chunk_blocks_in_flight(8192) == 0
