"""Aggregated serving, expert-parallel layouts (imbalance, EPLB, DBO) and per-kernel fixed costs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.backends.vllm import topology_flags
from tuner.errors import TopologyError
from tuner.hardware import GpuSpec, get_gpu
from tuner.models import ModelSpec, load_model
from tuner.perf import Calibration, RooflineModel, default_calibration
from tuner.perf._costs import splits_mixed_attention
from tuner.perf._experts import busiest_rank_factor, effective_skew
from tuner.perf._kernels import layer_kernels
from tuner.topology import Role, Topology


def test_tp8_and_tep8_differ_only_by_expert_placement(reference: ModelSpec, gb300: GpuSpec) -> None:
    perf = RooflineModel(reference, gb300)
    tp, tep = Topology.parse("TP8"), Topology.parse("TEP8")
    for batch in (1, 8, 64):
        a = perf.decode_step(tp, batch, isl=8192, osl=1024)
        b = perf.decode_step(tep, batch, isl=8192, osl=1024)
        assert a.comm_ms == pytest.approx(b.comm_ms)  # TEP keeps vLLM's all-reduce path (no all-to-all kernels)
        assert b.ep_load_factor > 1.0 and a.ep_load_factor == 1.0
        assert b.step_ms > a.step_ms  # the busiest EP rank reads and multiplies more experts
    small = perf.decode_step(tep, 1, isl=8192, osl=1024).step_ms / perf.decode_step(tp, 1, isl=8192, osl=1024).step_ms
    large = (perf.decode_step(tep, 256, isl=8192, osl=1024).step_ms
             / perf.decode_step(tp, 256, isl=8192, osl=1024).step_ms)
    assert small > large >= 1.0  # every local expert is active at large batches: imbalance only adds compute


def test_all_to_all_only_with_ep_over_dp(reference: ModelSpec, gb300: GpuSpec) -> None:
    cal = default_calibration("gb300").model_copy(update={"allreduce_latency_us": 0.0})
    perf = RooflineModel(reference, gb300, cal)
    dep = perf.decode_step(Topology.parse("TP2DP8+EP"), 256, isl=8192, osl=1024)
    assert dep.comm_ms >= 2 * cal.alltoall_latency_us * 1e-3 * reference.num_moe_layers  # dispatch + combine
    tep = perf.decode_step(Topology.parse("TEP8"), 256, isl=8192, osl=1024)
    assert tep.comm_ms < 2 * cal.alltoall_latency_us * 1e-3 * reference.num_moe_layers  # all-reduce only


def test_imbalance_falls_with_tokens_and_rises_with_ep() -> None:
    cal = Calibration()
    kw = {"num_experts": 256, "experts_per_token": 8, "redundant_experts": 0, "cal": cal}
    by_tokens = [busiest_rank_factor(t, ep_size=8, **kw) for t in (1, 16, 256, 4096, 65536)]
    assert by_tokens == sorted(by_tokens, reverse=True) and by_tokens[-1] > 1.0  # popularity skew stays
    by_ep = [busiest_rank_factor(4096, ep_size=ep, **kw) for ep in (2, 8, 32, 64)]
    assert by_ep == sorted(by_ep)
    assert busiest_rank_factor(1, ep_size=8, **kw) <= 8  # one rank cannot take more than everything
    uniform = Calibration(expert_popularity_cv=0.0)
    assert busiest_rank_factor(10**7, ep_size=8, num_experts=256, experts_per_token=8, redundant_experts=0,
                               cal=uniform) == pytest.approx(1.0, abs=0.01)


def test_eplb_redundant_experts_cut_the_skew() -> None:
    cal = Calibration(expert_popularity_cv=0.5, eplb_residual_skew=0.2)
    assert effective_skew(cal, 32, 0) == 0.5
    assert effective_skew(cal, 32, 16) == pytest.approx(0.5 * (1 - 0.8 * 0.5))
    assert effective_skew(cal, 32, 32) == pytest.approx(0.1) == effective_skew(cal, 32, 64)
    kw = {"num_experts": 256, "experts_per_token": 8, "ep_size": 32, "cal": cal}
    assert busiest_rank_factor(8192, redundant_experts=32, **kw) < busiest_rank_factor(8192, redundant_experts=0, **kw)


def test_dbo_hides_all_to_all_above_the_token_threshold(reference: ModelSpec, gb300: GpuSpec) -> None:
    perf = RooflineModel(reference, gb300)
    # the same DeepEP backend with and without DBO (DBO runs on it; vLLM's default backend is priced apart)
    plain = Topology.parse("TP2DP8+EP", all2all_backend="deepep_low_latency")
    dbo = Topology.parse("TP2DP8+EP", dbo=True)
    small = perf.decode_step(plain, 16, isl=8192, osl=1024), perf.decode_step(dbo, 16, isl=8192, osl=1024)
    assert small[1].comm_ms == pytest.approx(small[0].comm_ms)  # 1 token per rank: below vLLM's threshold of 32
    big = perf.decode_step(plain, 1024, isl=8192, osl=1024), perf.decode_step(dbo, 1024, isl=8192, osl=1024)
    assert big[1].comm_ms < big[0].comm_ms
    assert big[0].comm_ms - big[1].comm_ms <= big[0].compute_ms + 1e-9  # overlap never hides more than compute
    with pytest.raises(TopologyError):
        Topology.parse("TEP8", dbo=True).check(reference)
    assert "--enable-dbo" in topology_flags(dbo)


def test_fixed_costs_scale_with_kernels_per_layer(reference: ModelSpec, dense: ModelSpec, gb300: GpuSpec) -> None:
    kinds = set(reference.layer_kinds)
    hybrid = {layer_kernels(reference, k, True) for k in kinds}
    assert min(hybrid) > layer_kernels(dense, dense.layer_kinds[0], False) == 10
    cal = Calibration(step_overhead_ms=0.0, kernel_latency_us=4.0)
    step = RooflineModel(dense, gb300, cal).decode_step(Topology.parse("TP4"), 1, isl=128, osl=2)
    assert step.overhead_ms == pytest.approx(dense.num_layers * 10 * 4.0e-3)


def test_aggregated_closed_loop_is_consistent(dense: ModelSpec, gb300: GpuSpec) -> None:
    perf = RooflineModel(dense, gb300)
    topo = Topology.parse("TP4")
    for conc in (1, 16, 128):
        m = perf.predict(topo, Role.BOTH, isl=2048, osl=256, concurrency=conc)
        # Little's law: each client's cycle is TTFT + (osl - 1) inter-token gaps
        cycle_s = (m.ttft_ms_mean + 255 * m.itl_ms_mean) / 1e3
        assert conc / cycle_s == pytest.approx(m.request_throughput_rps, rel=0.05)


def test_aggregated_pays_for_prefill_that_pd_decode_does_not(reference: ModelSpec, gb300: GpuSpec) -> None:
    perf = RooflineModel(reference, gb300)
    topo = Topology.parse("TEP8")
    previous = 0.0
    for conc in (1, 16, 64, 128):
        agg = perf.predict(topo, Role.BOTH, isl=8192, osl=1024, concurrency=conc)
        dec = perf.predict(topo, Role.DECODE, isl=8192, osl=1024, concurrency=conc)
        ratio = agg.itl_ms_mean / dec.itl_ms_mean
        assert ratio >= 1.0 and ratio >= previous - 1e-9  # the stall grows with concurrency
        previous = ratio
    assert previous > 1.3
    one = perf.aggregated_point(topo, 1, isl=8192, osl=1024)
    assert one.prefill_steps == pytest.approx(1.0, rel=1e-3) and one.chunk_tokens == pytest.approx(8192, rel=1e-3)
    assert one.decode_steps == pytest.approx(1023)


def test_aggregated_respects_the_token_budget(dense: ModelSpec, gb300: GpuSpec) -> None:
    perf = RooflineModel(dense, gb300)
    topo = Topology.parse("TP8", max_num_batched_tokens=2048)
    point = perf.aggregated_point(topo, 512, isl=4096, osl=64)
    assert point.decode_requests + point.starts_per_step * 4096 <= 2048 + 1e-6
    assert point.prefill_steps >= 2  # a 4k prompt needs at least two 2k chunks


def test_moe_and_fp8_gemm_efficiencies_slow_only_their_gemms(reference: ModelSpec, dense: ModelSpec,
                                                              gb300: GpuSpec) -> None:
    moe_slow = Calibration(moe_gemm_efficiency=0.5)
    a = RooflineModel(reference, gb300).prefill_step(Topology.parse("TEP8"), 4, isl=8192)
    b = RooflineModel(reference, gb300, moe_slow).prefill_step(Topology.parse("TEP8"), 4, isl=8192)
    assert b.compute_ms > a.compute_ms
    dense_a = RooflineModel(dense, gb300).prefill_step(Topology.parse("TP4"), 4, isl=8192)
    dense_b = RooflineModel(dense, gb300, moe_slow).prefill_step(Topology.parse("TP4"), 4, isl=8192)
    assert dense_b.compute_ms == pytest.approx(dense_a.compute_ms)  # no experts: unchanged
    fp8_slow = Calibration(fp8_gemm_efficiency=0.5)  # the reference model has no FP8 GEMMs (BF16 + NVFP4)
    c = RooflineModel(reference, gb300, fp8_slow).prefill_step(Topology.parse("TEP8"), 4, isl=8192)
    assert c.compute_ms == pytest.approx(a.compute_ms)


def test_prefill_attention_runs_at_its_own_efficiency(dense: ModelSpec, gb300: GpuSpec) -> None:
    """Only the attention part of a prefill chunk moves with attention_flop_efficiency, and it grows with the
    prompt; None keeps attention at prefill_flop_efficiency (the GB300 reference calibration)."""
    topo = Topology.parse("TP4")
    base = Calibration(prefill_flop_efficiency=0.4, step_overhead_ms=0.0, kernel_latency_us=0.0)
    same = Calibration(prefill_flop_efficiency=0.4, attention_flop_efficiency=0.4, step_overhead_ms=0.0,
                       kernel_latency_us=0.0)
    fast = base.model_copy(update={"attention_flop_efficiency": 0.8})
    for isl in (2048, 32768):
        a = RooflineModel(dense, gb300, base).prefill_step(topo, 4, isl=isl)
        assert RooflineModel(dense, gb300, same).prefill_step(topo, 4, isl=isl).compute_ms == pytest.approx(
            a.compute_ms)
    short = [RooflineModel(dense, gb300, c).prefill_step(topo, 4, isl=2048).compute_ms for c in (base, fast)]
    long = [RooflineModel(dense, gb300, c).prefill_step(topo, 4, isl=32768).compute_ms for c in (base, fast)]
    assert short[1] < short[0] and long[1] < long[0]
    assert long[1] / long[0] < short[1] / short[0]  # attention is a larger share of a long prompt's chunk
    decode = [RooflineModel(dense, gb300, c).decode_step(topo, 8, isl=32768, osl=2).compute_ms for c in (base, fast)]
    assert decode[0] == pytest.approx(decode[1])  # decode attention stays at flop_efficiency


def test_aggregated_ttft_does_not_fall_as_concurrency_rises(dense: ModelSpec, gb300: GpuSpec) -> None:
    """With --max-num-seqs = concurrency (InferenceX's recipes) every client runs: a KV-occupancy factor below 1
    must not shrink max-num-seqs, which queued one client of four for a whole request (TTFT 2.9 s at c4 on Kimi)."""
    perf = RooflineModel(dense, gb300, default_calibration("gb300").model_copy(update={"kv_occupancy": 0.95}))
    previous = 0.0
    for conc in (1, 2, 4, 8, 16, 32):
        topo = Topology.parse("TP4", max_num_seqs=conc)
        m = perf.predict(topo, Role.BOTH, isl=7372, osl=921, concurrency=conc)
        assert m.running_requests == conc
        assert m.ttft_ms_mean >= previous - 1e-6
        previous = m.ttft_ms_mean
    # one prompt alone: its TTFT is the front end plus the compute of its own chunk(s), nothing queued
    topo = Topology.parse("TP4", max_num_seqs=1)
    one = perf.predict(topo, Role.BOTH, isl=7372, osl=921, concurrency=1)
    chunk = perf.aggregated_point(topo, 1, isl=7372, osl=921).chunk_step_ms
    prefill = perf.prefill_step(topo, 1, isl=7372).step_ms
    assert chunk == pytest.approx(prefill, rel=0.02)  # the chunk step is the prompt's prefill (+ 1 decode at most)
    assert one.ttft_ms_mean == pytest.approx(perf.front_end_ms(7372) + chunk, rel=0.01)


@pytest.mark.parametrize("gpu_name", ["gb300", "h100"])
def test_decode_kv_reads_do_not_hide_under_a_chunks_gemms(dense: ModelSpec, gpu_name: str) -> None:
    """A mixed step runs the attention kernels apart from the GEMMs: the decode requests' KV reads add to a
    compute-bound chunk instead of hiding under its FLOPs (one roofline per kernel, not one per step). Within the
    attention phase, Blackwell's FlashInfer runs the chunk's prefill kernel and then the decode kernel (times add);
    Hopper's FlashAttention runs one varlen kernel over the whole batch (the longer part hides the shorter)."""
    from tuner.perf._steps import mixed_step

    gpu = get_gpu(gpu_name)
    perf = RooflineModel(dense, gpu)
    topo = Topology.parse("TP4", max_num_batched_tokens=16384)
    state = perf.state(topo, Role.BOTH, isl=8192, osl=1024)
    cal = perf.calibration

    def step(decodes: float, chunk: float):
        return mixed_step(state.costs, gpu, cal, decode_requests_per_rank=decodes, total_decode_requests=decodes,
                          context_tokens=8704, mtp_depth=0, chunk_tokens_per_rank=chunk, busy_ranks=1,
                          prompt_tokens=8192)

    alone, with_decodes = step(0, 8192), step(512, 8192)
    kv_ms = 512 * state.costs.target.kv_bytes_per_token * 8704 / (gpu.hbm_bandwidth_tb_s * 1e12
                                                                  * cal.hbm_efficiency) * 1e3
    assert alone.attention_ms > 0 and kv_ms > 0
    assert with_decodes.compute_ms > with_decodes.memory_ms  # the chunk's GEMMs are compute-bound
    split = gpu.architecture == "blackwell"
    assert state.costs.target.split_attention is split
    expected = kv_ms + alone.attention_ms if split else max(kv_ms, alone.attention_ms)
    assert with_decodes.attention_ms == pytest.approx(expected, rel=1e-6)
    assert with_decodes.step_ms > alone.step_ms + 0.9 * (expected - alone.attention_ms)
    assert step(128, 0).attention_ms == 0.0  # a decode-only step keeps its single (memory-bound) roofline


@pytest.mark.parametrize(("model_name", "gpu_name", "split"), [
    ("llama-3.1-70b", "b200", True),  # FlashInfer (SM100's first backend): prefill kernel, then decode kernel
    ("llama-3.1-70b", "h200", False),  # FlashAttention: one flash_attn_varlen_func over the batch
    ("deepseek-v3", "h200", True),  # MLA: _forward_prefill, then the decode kernel, on every GPU class
    ("deepseek-v3", "b200", True),
    ("deepseek-v3.2-exp", "h200", False),  # DSA: every token through one FlashMLA sparse kernel
])
def test_mixed_attention_split_follows_the_backend(models_dir: Path, model_name: str, gpu_name: str,
                                                   split: bool) -> None:
    model = load_model(models_dir / model_name)
    gpu = get_gpu(gpu_name)
    assert splits_mixed_attention(model, gpu.architecture, sparse=bool(model.mla and model.mla.index_topk)) is split
    costs = RooflineModel(model, gpu).state(Topology.parse("TP8"), Role.BOTH, isl=2048, osl=256).costs
    assert costs.target.split_attention is split


def test_prefill_gemm_efficiency_grows_with_the_steps_tokens(dense: ModelSpec, gb300: GpuSpec) -> None:
    """With prefill_half_tokens a chunk's GEMMs reach prefill_flop_efficiency x n / (n + half): a small chunk costs
    more per token than a large one, the large-step limit is prefill_flop_efficiency, and 0 keeps one efficiency
    at every size (the GB300 reference calibration). Attention keeps its own efficiency; decode steps never move."""
    topo = Topology.parse("TP4")
    flat = Calibration(prefill_flop_efficiency=0.5, attention_flop_efficiency=0.5, step_overhead_ms=0.0,
                       kernel_latency_us=0.0)
    curve = flat.model_copy(update={"prefill_half_tokens": 512.0})
    assert default_calibration("gb300").prefill_half_tokens == 0.0

    def per_token_ms(cal: Calibration, tokens: int) -> float:
        step = RooflineModel(dense, gb300, cal).prefill_step(topo, 1, isl=tokens)
        return step.compute_ms / tokens

    small, large = per_token_ms(curve, 256), per_token_ms(curve, 8192)
    assert small > 1.5 * large  # 256 tokens: a third of the limit; 8,192: 94% of it
    assert per_token_ms(flat, 8192) / per_token_ms(flat, 256) == pytest.approx(1.0, abs=0.1)  # attention only
    assert large == pytest.approx(per_token_ms(flat, 8192), rel=0.08)  # near the limit at 8,192 tokens
    assert large > per_token_ms(flat, 8192)  # but never past it
    decode = [RooflineModel(dense, gb300, c).decode_step(topo, 8, isl=2048, osl=128).step_ms for c in (flat, curve)]
    assert decode[0] == pytest.approx(decode[1])
    with pytest.raises(ValueError):
        Calibration(prefill_half_tokens=-1.0)
