"""FP8 KV cache, CUDA-graph capture sizes and reserve, uneven EP and EPLB: each against vLLM's arithmetic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.backends.vllm import topology_flags
from tuner.errors import ConfigError, TopologyError
from tuner.hardware import get_gpu
from tuner.memory import GIB, MemoryInputs, compute_memory, local_experts
from tuner.memory._estimates import cuda_graph_bytes, cudagraph_capture_sizes
from tuner.models import load_model
from tuner.space import parse_space
from tuner.topology import Role, Topology


@pytest.fixture(scope="module")
def llama_fp8_weights(models_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Llama-3.1-70B with FP8 weights (per-tensor, vLLM's `fp8` method): fits one H200."""
    cfg = json.loads((models_dir / "llama-3.1-70b" / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    path = tmp_path_factory.mktemp("llama") / "config.json"
    path.write_text(json.dumps(cfg))
    return load_model(path)


@pytest.mark.parametrize(("dtype", "bytes_per_token"), [
    ("auto", 2 * 2 * 128 * 2), ("bfloat16", 2 * 2 * 128 * 2), ("fp8", 2 * 2 * 128), ("fp8_e4m3", 2 * 2 * 128),
    ("fp8_e5m2", 2 * 2 * 128),
    # AttentionSpec.page_size_bytes adds 2 x block x kv_heads x fp32 scales for per-token-head modes
    ("fp8_per_token_head", 2 * 2 * 128 + 2 * 2 * 4), ("int8_per_token_head", 2 * 2 * 128 + 2 * 2 * 4),
    # FullAttentionSpec NVFP4: kv_heads x (nvfp4_kv_cache_full_dim(K) + same for V), full_dim = d/2 + d/16
    ("nvfp4", 2 * 2 * (64 + 8)),
])
def test_gqa_page_size_per_kv_cache_dtype(models_dir: Path, dtype: str, bytes_per_token: int) -> None:
    llama = load_model(models_dir / "llama-3.1-70b")
    b = compute_memory(llama, get_gpu("h100"), Topology(tp=4, kv_cache_dtype=dtype),
                       MemoryInputs(kv_cache_memory_bytes=20 * GIB))
    assert b.layout.attn_bytes_per_token == bytes_per_token
    assert b.layout.page_size_bytes == 16 * bytes_per_token
    assert b.num_gpu_blocks == 20 * GIB // (16 * bytes_per_token) // 80


def test_fp8_kv_doubles_llama_70b_concurrency_on_one_h200(llama_fp8_weights) -> None:  # type: ignore[no-untyped-def]
    """The issue's case: BF16 KV caps Llama-70B (FP8 weights) on one H200 near 16 requests of 8k+1k;
    with --kv-cache-dtype fp8 the same GPU holds twice the tokens and more than 128 requests of 1k+1k."""
    gpu = get_gpu("h200")
    bf16 = compute_memory(llama_fp8_weights, gpu, Topology(tp=1, gpu_memory_utilization=0.9),
                          MemoryInputs(isl=8192, osl=1024))
    # near 16 (15.9: the plan captures CUDA graphs up to the 1024-sequence batch, a larger reserve than 512)
    assert 15.5 <= bf16.max_concurrency < 20
    fp8 = compute_memory(llama_fp8_weights, gpu, Topology(tp=1, gpu_memory_utilization=0.9, kv_cache_dtype="fp8"),
                         MemoryInputs(isl=1024, osl=1024))
    assert fp8.kv_budget_bytes == bf16.kv_budget_bytes  # KV dtype changes pages, not the budget
    assert fp8.layout.page_size_bytes * 2 == bf16.layout.page_size_bytes
    assert fp8.max_concurrency >= 128
    assert fp8.kv_cache_tokens == pytest.approx(2 * bf16.kv_cache_tokens, rel=1e-3)


def test_fp8_kv_on_mla_and_hybrid(models_dir: Path, reference_model_path: Path) -> None:
    ds = load_model(models_dir / "deepseek-v3")
    inputs = MemoryInputs(kv_cache_memory_bytes=10 * GIB)
    fp8 = compute_memory(ds, get_gpu("h200"), Topology(tp=8, kv_cache_dtype="fp8"), inputs)
    assert fp8.layout.attn_bytes_per_token == 576  # MLAAttentionSpec: 512 latent + 64 rope, one byte each
    assert fp8.layout.page_size_bytes == 64 * 576
    # hybrid: the GDN state keeps its dtype (mamba_cache_dtype), attention pages halve, so the block doubles
    ref = load_model(reference_model_path)
    auto = compute_memory(ref, get_gpu("gb300"), Topology(tp=1, mtp=2))
    hyb = compute_memory(ref, get_gpu("gb300"), Topology(tp=1, mtp=2, kv_cache_dtype="fp8"))
    assert hyb.layout.state_bytes == auto.layout.state_bytes == 4_317_184
    assert hyb.layout.attn_bytes_per_token == 1024
    assert hyb.layout.block_size == 16 * -(-4_317_184 // (16 * 1024)) == 4224
    assert hyb.layout.page_size_bytes == auto.layout.page_size_bytes


def test_kv_cache_dtype_reaches_the_vllm_flags_and_the_space() -> None:
    flags = topology_flags(Topology(tp=8, kv_cache_dtype="fp8"))
    assert flags[flags.index("--kv-cache-dtype") + 1] == "fp8"
    assert "--kv-cache-dtype" not in topology_flags(Topology(tp=8))
    with pytest.raises(ConfigError) as err:
        Topology.create(kv_cache_dtype="fp9")
    assert err.value.field == "kv-cache-dtype"
    space = parse_space("""
name: t
cluster: {gpu: h200, num_gpus: 8}
workload: {isl: 1024, osl: 1024}
phases:
  decode: {tp: [8], concurrency: [1], kv_cache_dtype: [auto, fp8]}
""")
    assert space.param_choices("decode")["kv_cache_dtype"] == ["auto", "fp8"]
    topo = space.topology("decode", {**{k: v[0] for k, v in space.param_choices("decode").items()},
                                     "kv_cache_dtype": "fp8"})
    assert topo.kv_cache_dtype == "fp8"
    # a space that does not search it keeps the old parameter set (stored studies resume unchanged)
    plain = parse_space("name: t\ncluster: {gpu: h200, num_gpus: 8}\nworkload: {isl: 1, osl: 1}\n"
                        "phases: {decode: {tp: [8], concurrency: [1]}}\n")
    assert "kv_cache_dtype" not in plain.param_choices("decode")


@pytest.mark.parametrize(("arch", "seqs", "mtp", "batched", "count", "largest"), [
    ("hopper", 1024, 0, 8192, 51, 512),  # min(1024 x 2, 512): [1,2,4] + 8..248 + 256..512 step 16
    ("blackwell", 1024, 0, 8192, 83, 1024),  # data-centre Blackwell raises the default cap to 1024
    ("hopper", 16, 0, 8192, 7, 32),  # min(16 x 2, 512) = 32: 1, 2, 4, 8, 16, 24, 32
    ("hopper", 1024, 0, 300, 38, 300),  # capped by max-num-batched-tokens, which is then captured itself
    ("hopper", 64, 2, 8192, 46, 384),  # MTP2: cap min(64 x 3 x 2, 512) = 384 -> 43, plus decode sizes 3, 6, 12
    ("cpu", 1024, 0, 8192, 0, None),
])
def test_capture_sizes_follow_vllm(arch: str, seqs: int, mtp: int, batched: int, count: int,
                                   largest: int | None) -> None:
    # vLLM's default sizes: what a prefill instance gets (launch plans set no capture size there)
    topo = Topology(max_num_seqs=seqs, mtp=mtp, max_num_batched_tokens=batched, role=Role.PREFILL)
    sizes = cudagraph_capture_sizes(topo, arch)
    assert len(sizes) == count
    assert (max(sizes) if sizes else None) == largest
    assert sizes == sorted(set(sizes))
    if mtp:
        assert {3, 6, 12} <= set(sizes) and 9 not in sizes  # uniform decode n x (1 + mtp), n in 1, 2, 4, 8k


def test_decoding_instances_follow_the_plans_capture_size() -> None:
    """Launch plans pass --max-cudagraph-capture-size = decode batch x (1 + MTP) (or the searched knob): the
    reserve is computed for those sizes, not vLLM's default 512."""
    decode = Topology(max_num_seqs=256, mtp=3, role=Role.DECODE)
    assert max(cudagraph_capture_sizes(decode, "hopper")) == 1024 == decode.cudagraph_capture_tokens
    knob = decode.model_copy(update={"max_cudagraph_capture_size": 128})
    assert max(cudagraph_capture_sizes(knob, "hopper")) == 128
    assert cuda_graph_bytes_for(knob) < cuda_graph_bytes_for(decode)


def cuda_graph_bytes_for(topo: Topology) -> int:
    return cuda_graph_bytes(load_model(Path(__file__).parents[2] / "examples" / "models" / "deepseek-v3"), topo)


def test_qwen3_235b_bf16_tp8_fits_at_090_with_32k(models_dir: Path) -> None:
    """vLLM served Qwen3-235B-A22B BF16 at TP8 with 0.90 and 32k context on H100; the old reserve
    (3 MiB per size per layer: 51 x 94 x 3 MiB = 14 GiB) said it did not fit."""
    qwen = load_model(models_dir / "qwen3-235b-a22b")
    assert qwen.num_layers == 94 and qwen.moe is not None and qwen.moe.num_experts == 128
    topo = Topology(tp=8, gpu_memory_utilization=0.9)
    b = compute_memory(qwen, get_gpu("h100"), topo, MemoryInputs(isl=32768, osl=0))
    assert b.fits and b.max_concurrency >= 1
    assert b.cuda_graph_gib < 51 * 94 * 3 / 1024
    # fewer captured sizes, smaller reserve
    small = Topology(tp=8, gpu_memory_utilization=0.9, max_num_seqs=16)
    assert cuda_graph_bytes(qwen, small, "hopper") < cuda_graph_bytes(qwen, topo, "hopper") / 5


def test_uneven_ep_and_eplb_weights(reference_model_path: Path, models_dir: Path) -> None:
    """determine_expert_map: 256 experts over EP48 give ranks 0-15 six experts and the rest five."""
    ds = load_model(models_dir / "deepseek-v3")
    ep48 = Topology(tp=8, dp=6, ep=True)
    ep48.check(ds)
    assert local_experts(256, ep48) == 6
    b48 = compute_memory(ds, get_gpu("gb200"), ep48)
    assert b48.weights.expert_bytes == pytest.approx(ds.expert_bytes * 6 / 256, rel=1e-9)
    ep72 = Topology(tp=1, dp=72, ep=True)
    ep72.check(ds)
    assert local_experts(256, ep72) == 4  # 256 = 3 x 72 + 40
    # EPLB: 256 + 32 redundant = 288 physical experts over EP72 = 4 per rank; 256 + 8 does not divide
    eplb = Topology(tp=1, dp=72, ep=True, num_redundant_experts=32)
    eplb.check(ds)
    assert local_experts(256, eplb) == 4
    flags = topology_flags(eplb)
    assert "--enable-eplb" in flags and json.loads(flags[flags.index("--eplb-config") + 1]) == {
        "num_redundant_experts": 32}
    with pytest.raises(TopologyError) as err:
        Topology(tp=1, dp=72, ep=True, num_redundant_experts=8).check(ds)
    assert err.value.field == "num-redundant-experts"
    ep32 = Topology(tp=8, dp=4, ep=True)
    more = compute_memory(ds, get_gpu("gb200"), ep32.model_copy(update={"num_redundant_experts": 32}))
    assert more.weights.expert_bytes == pytest.approx(ds.expert_bytes * 9 / 256, rel=1e-9)  # 288 / 32
    with pytest.raises(TopologyError, match="expert parallelism"):
        Topology(tp=8, num_redundant_experts=8).check(ds)


def test_space_searches_eplb_over_ep48(models_dir: Path) -> None:
    ds = load_model(models_dir / "deepseek-v3")
    space = parse_space("""
name: eplb
cluster: {gpu: gb200, num_gpus: 72}
workload: {isl: 8192, osl: 1024}
phases:
  decode: {tp: [8], dp: [6, 9], ep: [true], concurrency: [64], num_redundant_experts: [0, 32]}
""")
    topos = space.expand("decode", ds)
    names = {(t.name, t.num_redundant_experts) for t in topos}
    # EP48: 256 and 288 physical experts both fine (288 = 6 x 48); EP72: 256 uneven is fine, 288 = 4 x 72 too
    assert names == {("TP8DP6+EP", 0), ("TP8DP6+EP", 32), ("TP8DP9+EP", 0), ("TP8DP9+EP", 32)}
    assert all(topology_flags(t).count("--enable-eplb") == (t.num_redundant_experts > 0) for t in topos)
    odd = parse_space("name: e\ncluster: {gpu: gb200, num_gpus: 72}\nworkload: {isl: 1, osl: 1}\nphases: {decode: "
                      "{tp: [8], dp: [6], ep: [true], concurrency: [1], num_redundant_experts: [8]}}\n")
    with pytest.raises(ConfigError, match="redundant"):
        odd.expand("decode", ds)
