"""The roofline model term by term against hand arithmetic, its monotonicity, and KV-capacity queueing."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.errors import ConfigError, DoesNotFitError
from tuner.hardware import GpuSpec
from tuner.memory import MemoryInputs, compute_memory
from tuner.models import ModelSpec, TensorGroup
from tuner.perf import Calibration, RooflineModel, accepted_tokens, default_calibration
from tuner.topology import Role, Topology

NO_FIXED_COSTS = Calibration(step_overhead_ms=0.0, kernel_latency_us=0.0, allreduce_latency_us=0.0,
                             alltoall_latency_us=0.0, draft_overhead_ms=0.0)


def _gemm_params(model: ModelSpec) -> int:
    """Parameters that multiply every token (embedding gather, norms and lm_head excluded)."""
    return sum(t.num_params for t in model.tensors if not t.is_mtp and len(t.shape) == 2
               and t.group not in (TensorGroup.EMBEDDING, TensorGroup.LM_HEAD, TensorGroup.NORM))


def _streamed_bytes(model: ModelSpec) -> int:
    """Weights a TP1 decode step reads: everything but the embedding table (a row gather)."""
    return sum(t.nbytes for t in model.tensors if not t.is_mtp and t.group is not TensorGroup.EMBEDDING)


def test_dense_batch1_decode_is_weight_bytes_over_bandwidth(dense: ModelSpec, gb300: GpuSpec) -> None:
    cal = Calibration(hbm_efficiency=0.8, step_overhead_ms=1.0, kernel_latency_us=1.0)
    perf = RooflineModel(dense, gb300, cal)
    step = perf.decode_step(Topology.parse("TP1"), 1, isl=1, osl=2)
    hbm = 8e12 * 0.8
    kv = dense.num_layers * 2 * 8 * 128 * 2 * 2.0  # 2 KV x 8 heads x 128 dim x bf16, context isl + osl/2 = 2
    assert step.weight_bytes == pytest.approx(_streamed_bytes(dense), rel=1e-9)
    assert step.memory_ms == pytest.approx((_streamed_bytes(dense) + kv) / hbm * 1e3, rel=1e-6)
    assert step.comm_ms == 0.0 and step.draft_ms == 0.0
    # Llama: per layer 2 norms + 5 attention kernels + 3 MLP kernels, at 1 us each
    assert step.overhead_ms == pytest.approx(1.0 + 80 * 10 * 0.001)
    assert step.compute_ms < step.memory_ms / 100  # batch 1 is bandwidth-bound
    assert step.step_ms == pytest.approx(step.memory_ms + step.overhead_ms)


def test_doubling_tp_halves_weight_bytes_and_adds_allreduce(dense: ModelSpec, gb300: GpuSpec) -> None:
    cal = Calibration(allreduce_latency_us=5.0, allreduce_bw_efficiency=0.5)
    perf = RooflineModel(dense, gb300, cal)
    s2 = perf.decode_step(Topology.parse("TP2"), 1, isl=1, osl=2)
    s4 = perf.decode_step(Topology.parse("TP4"), 1, isl=1, osl=2)
    assert s4.weight_bytes == pytest.approx(s2.weight_bytes / 2, rel=0.01)  # norms stay replicated
    # one all-reduce of one token's hidden state, twice per layer: latency per stage + 2(n-1)/n bytes / bw
    message = 8192 * 2
    per_ar = {n: 5e-6 * math.log2(n) + 2 * (n - 1) / n * message / (900e9 * 0.5) for n in (2, 4)}
    assert s2.comm_ms == pytest.approx(2 * 80 * per_ar[2] * 1e3, rel=1e-9)
    assert s4.comm_ms == pytest.approx(2 * 80 * per_ar[4] * 1e3, rel=1e-9)
    assert s4.comm_ms > s2.comm_ms > 0


def test_expert_bytes_follow_top_k_activation(reference: ModelSpec, gb300: GpuSpec) -> None:
    perf = RooflineModel(reference, gb300)
    for name in ("TP8", "TEP8"):
        topo = Topology.parse(name)
        local = compute_memory(reference, gb300, topo, MemoryInputs(8192, 1024)).weights.expert_bytes
        for batch in (1, 16, 256):
            step = perf.decode_step(topo, batch, isl=8192, osl=1024)
            # TP-sharded experts are balanced; with EP the busiest rank sees `ep_load_factor` x the mean tokens
            assert (step.ep_load_factor == 1.0) is (name == "TP8")
            tokens = batch * step.ep_load_factor
            assert step.expert_bytes == pytest.approx(local * (1 - (1 - 10 / 512) ** tokens), rel=1e-3)
        # a large batch touches every local expert
        assert perf.decode_step(topo, 256, isl=8192, osl=1024).expert_bytes == pytest.approx(local, rel=0.01)


def test_kv_and_gdn_state_reads_scale_with_batch_and_context(reference: ModelSpec, gb300: GpuSpec) -> None:
    perf = RooflineModel(reference, gb300)
    topo = Topology.parse("TEP8")
    one = perf.decode_step(topo, 1, isl=8192, osl=1024)
    ten = perf.decode_step(topo, 10, isl=8192, osl=1024)
    # 23 full-attention layers x 1 KV head (2 KV heads / TP8 -> replicated once) x 256 dim x K,V x bf16
    assert one.kv_bytes == pytest.approx(23 * 1 * 256 * 2 * 2 * (8192 + 512))
    assert ten.kv_bytes == pytest.approx(10 * one.kv_bytes)
    # GDN: 69 layers of (ssm 4 MiB + conv 3 x 12288 x bf16) / TP8, read once and written once
    state = 69 * (64 * 128 * 128 * 4 + 3 * 12288 * 2) / 8
    assert one.state_bytes == pytest.approx(2 * state)


def test_request_step_cost_adds_per_running_request(reference: ModelSpec, gb300: GpuSpec) -> None:
    """request_step_us: a fixed time per running request per step (fitted on public measurements), on each DP
    rank's own requests; nothing else in the step moves."""
    topo = Topology.parse("DEP16")
    base = RooflineModel(reference, gb300, default_calibration("gb300").model_copy(update={"request_step_us": 0.0}))
    slow = base.with_calibration(base.calibration.model_copy(update={"request_step_us": 50.0}))
    a, b = base.decode_step(topo, 64, isl=8192, osl=1024), slow.decode_step(topo, 64, isl=8192, osl=1024)
    assert b.requests_ms - a.requests_ms == pytest.approx(50e-3 * 64 / 16)  # 4 requests on each of 16 ranks
    assert b.step_ms - a.step_ms == pytest.approx(b.requests_ms)
    assert (b.memory_ms, b.compute_ms, b.comm_ms, b.overhead_ms) == (a.memory_ms, a.compute_ms, a.comm_ms,
                                                                     a.overhead_ms)


def test_mtp_tokens_per_step_and_draft_cost(reference: ModelSpec, gb300: GpuSpec) -> None:
    cal = default_calibration("gb300").model_copy(update={"mtp_acceptance": 0.6})
    perf = RooflineModel(reference, gb300, cal)
    assert accepted_tokens(3, 0.6) == pytest.approx(1 + 0.6 + 0.36 + 0.216)
    assert accepted_tokens(0, 0.6) == 1.0
    step = perf.decode_step(Topology.parse("TEP8", mtp=3), 1, isl=8192, osl=1024)
    assert step.tokens_per_request == 4 and step.accepted_tokens == pytest.approx(2.176)
    assert step.draft_ms > 3 * cal.draft_overhead_ms  # three draft passes, each with its own work
    assert step.itl_ms == pytest.approx(step.step_ms / 2.176)
    plain = perf.decode_step(Topology.parse("TEP8"), 1, isl=8192, osl=1024)
    assert step.itl_ms < plain.itl_ms  # at batch 1 MTP lowers the ITL


def test_prefill_flops_are_linear_plus_quadratic_attention(dense: ModelSpec, gb300: GpuSpec) -> None:
    perf = RooflineModel(dense, gb300, NO_FIXED_COSTS)
    isl = 4096
    step = perf.prefill_step(Topology.parse("TP1"), 2, isl=isl)
    assert step.tokens == 8192  # two prompts in one chunk of max-num-batched-tokens
    linear = 2 * _gemm_params(dense) * 8192
    attention = 80 * 4 * 64 * 128 * 8192 * isl / 2  # QK^T + PV over half the prompt on average
    lm_head = 2 * 8192 * 128256 * 2  # logits of the last token of each prompt
    assert step.flops == pytest.approx(linear + attention + lm_head, rel=1e-6)
    assert step.compute_ms == pytest.approx(step.flops / (2500e12 * NO_FIXED_COSTS.prefill_flop_efficiency) * 1e3,
                                            rel=1e-6)
    assert step.step_ms == pytest.approx(step.compute_ms)  # compute-bound, no fixed costs at TP1


def test_prefill_ttft_and_chunking(dense: ModelSpec, gb300: GpuSpec) -> None:
    perf = RooflineModel(dense, gb300)
    topo = Topology.parse("TP2")
    one = perf.predict(topo, Role.PREFILL, isl=16384, osl=1, concurrency=1)
    chunk = perf.prefill_step(topo, 1, isl=16384)
    front = perf.front_end_ms(16384)  # API server, tokenizer, scheduler admission
    assert front == pytest.approx(perf.calibration.request_overhead_ms + 16384 * perf.calibration.tokenize_us_per_token
                                  / 1e3)
    assert one.ttft_ms_mean == pytest.approx(2 * chunk.step_ms + front)  # 16k prompt = two 8k chunks
    four = perf.predict(topo, Role.PREFILL, isl=16384, osl=1, concurrency=4)
    assert four.request_throughput_rps == pytest.approx(one.request_throughput_rps)  # chunk already full
    assert four.ttft_ms_mean - front == pytest.approx(4 * (one.ttft_ms_mean - front))  # Little: the others wait


def test_queueing_starts_exactly_past_the_memory_cap(reference: ModelSpec, gb300: GpuSpec) -> None:
    perf = RooflineModel(reference, gb300)
    topo = Topology.parse("TEP8")
    memory = compute_memory(reference, gb300, topo, MemoryInputs(8192, 1024))
    # running requests hold their current context (isl + osl/2 on average): vLLM allocates blocks as tokens come
    held = memory.layout.blocks_per_request(8192 + 511, topo.max_num_batched_tokens)
    cap = memory.num_gpu_blocks // held * topo.dp
    assert cap == perf.capacity(topo, Role.DECODE, isl=8192, osl=1024) > int(memory.max_concurrency)
    at = perf.predict(topo, Role.DECODE, isl=8192, osl=1024, concurrency=cap)
    past = perf.predict(topo, Role.DECODE, isl=8192, osl=1024, concurrency=cap + 1)
    below = perf.predict(topo, Role.DECODE, isl=8192, osl=1024, concurrency=cap - 1)
    assert at.running_requests == cap and past.running_requests == cap and below.running_requests == cap - 1
    # TTFT = queue wait + KV transfer (constant) + first ITL: no wait up to the cap, a wait right past it
    wait = {name: m.ttft_ms_mean - m.itl_ms_mean for name, m in (("below", below), ("at", at), ("past", past))}
    assert wait["at"] == pytest.approx(wait["below"], abs=1e-9)
    one_slot_ms = 1024 * at.itl_ms_mean / cap  # Little's law: one extra client waits osl x ITL / cap
    assert wait["past"] - wait["at"] == pytest.approx(one_slot_ms, rel=1e-6)
    assert past.total_tok_s == pytest.approx(at.total_tok_s)  # throughput flat
    assert past.itl_ms_mean == pytest.approx(at.itl_ms_mean)


def test_max_num_seqs_caps_the_batch_too(reference: ModelSpec, gb300: GpuSpec) -> None:
    perf = RooflineModel(reference, gb300)
    topo = Topology.parse("TP4DP4+EP", max_num_seqs=64)
    metrics = perf.predict(topo, Role.DECODE, isl=8192, osl=1024, concurrency=1000)
    assert metrics.running_requests == 64 * 4


PERF_TOPOLOGIES = ["TEP8", "TP4DP2+EP", "TP4DP4+EP", "DEP16", "TP8"]


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(PERF_TOPOLOGIES), mtp=st.integers(0, 3), c1=st.integers(1, 3000),
       c2=st.integers(1, 3000))
def test_decode_monotonic_in_concurrency(reference: ModelSpec, gb300: GpuSpec, name: str, mtp: int, c1: int,
                                         c2: int) -> None:
    lo, hi = sorted((c1, c2))
    perf = _shared_model(reference, gb300)
    topo = Topology.parse(name, mtp=mtp)
    a = perf.predict(topo, Role.DECODE, isl=8192, osl=1024, concurrency=lo)
    b = perf.predict(topo, Role.DECODE, isl=8192, osl=1024, concurrency=hi)
    assert b.total_tok_s >= a.total_tok_s * (1 - 1e-9)  # never lower (flat past the KV cap)
    assert b.tok_s_per_user <= a.tok_s_per_user * (1 + 1e-9)  # never higher
    assert b.ttft_ms_mean >= a.ttft_ms_mean * (1 - 1e-9) or b.running_requests > a.running_requests


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(PERF_TOPOLOGIES), c1=st.integers(1, 200), c2=st.integers(1, 200))
def test_prefill_monotonic_in_concurrency(reference: ModelSpec, gb300: GpuSpec, name: str, c1: int, c2: int) -> None:
    lo, hi = sorted((c1, c2))
    perf = _shared_model(reference, gb300)
    topo = Topology.parse(name)
    a = perf.predict(topo, Role.PREFILL, isl=8192, osl=1, concurrency=lo)
    b = perf.predict(topo, Role.PREFILL, isl=8192, osl=1, concurrency=hi)
    assert b.request_throughput_rps >= a.request_throughput_rps * (1 - 1e-9)
    assert b.ttft_ms_mean >= a.ttft_ms_mean * (1 - 1e-9)


_MODELS: dict[int, RooflineModel] = {}


def _shared_model(model: ModelSpec, gpu: GpuSpec) -> RooflineModel:
    return _MODELS.setdefault(id(model), RooflineModel(model, gpu))


def test_more_hbm_efficiency_is_faster(reference: ModelSpec, gb300: GpuSpec) -> None:
    topo = Topology.parse("TEP8")
    slow = RooflineModel(reference, gb300, Calibration(hbm_efficiency=0.6))
    fast = RooflineModel(reference, gb300, Calibration(hbm_efficiency=0.9))
    for c in (1, 64, 256):
        assert fast.predict(topo, Role.DECODE, isl=8192, osl=1024, concurrency=c).itl_ms_mean < \
            slow.predict(topo, Role.DECODE, isl=8192, osl=1024, concurrency=c).itl_ms_mean


def test_topology_that_does_not_fit_raises(reference: ModelSpec, gb300: GpuSpec) -> None:
    with pytest.raises(DoesNotFitError) as info:
        RooflineModel(reference, gb300).predict(Topology.parse("DEP8"), Role.DECODE, isl=8192, osl=1024,
                                                concurrency=1)
    assert info.value.shortfall_gib > 0 and info.value.fix


def test_bad_workload_raises_config_errors(reference: ModelSpec, gb300: GpuSpec) -> None:
    perf = RooflineModel(reference, gb300)
    with pytest.raises(ConfigError):
        perf.predict(Topology.parse("TEP8"), Role.BOTH, isl=8192, osl=0, concurrency=1)
    with pytest.raises(ConfigError):
        perf.predict(Topology.parse("TEP8"), Role.DECODE, isl=0, osl=1024, concurrency=1)


def test_metrics_schema_is_consistent(reference: ModelSpec, gb300: GpuSpec) -> None:
    m = RooflineModel(reference, gb300).predict(Topology.parse("TP4DP4+EP", mtp=2), Role.DECODE, isl=8192,
                                                 osl=1024, concurrency=512)
    assert m.num_gpus == 16 and m.total_tok_s == pytest.approx(m.request_throughput_rps * (8192 + 1024))
    assert m.total_tok_s_per_gpu == pytest.approx(m.total_tok_s / 16)
    assert m.tok_s_per_user == pytest.approx(1000 / m.itl_ms_mean)
    assert m.max_concurrency > m.running_requests == 512


def test_calibration_is_validated_and_documented() -> None:
    with pytest.raises(ValueError):
        Calibration(hbm_efficiency=1.5)
    cal = default_calibration("gb300")
    assert 0.7 <= cal.hbm_efficiency <= 0.9 and 0.4 <= cal.prefill_flop_efficiency <= 0.8
    assert 0.4 <= cal.flop_efficiency <= 0.8
    assert all(field.description for field in Calibration.model_fields.values())
    assert default_calibration("some-new-gpu") == Calibration()
    with pytest.raises(ConfigError):
        default_calibration(" ")
