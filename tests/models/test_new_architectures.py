"""gpt-oss, DeepSeek-V3.2, GLM-4.6, MiniMax-M2, Kimi-K2 and the formats they ship in, each pinned on its public
config.json (examples/models/<name>/config.json) and on the checkpoint sizes the publishers state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.errors import ConfigError
from tuner.hardware import get_gpu
from tuner.memory import GIB, MemoryInputs, Mxfp4Backend, compute_memory
from tuner.models import LayerKind, Sharding, TensorGroup, WeightFormat, load_model
from tuner.topology import Topology


def _tensor(spec, name: str):  # type: ignore[no-untyped-def]
    return next(t for t in spec.tensors if t.name == name)


def test_gpt_oss_120b_and_20b(models_dir: Path) -> None:
    big = load_model(models_dir / "gpt-oss-120b")
    assert big.family == "gpt_oss" and big.quantization == "mxfp4"
    assert round(big.total_params / 1e9, 1) == 116.8  # model card: 116.8B parameters
    assert big.count_layers(LayerKind.SLIDING_WINDOW) == big.count_layers(LayerKind.FULL_ATTENTION) == 18
    assert big.attention is not None and big.attention.sliding_window == 128 and big.attention.head_dim == 64
    # MXFP4 experts only (vLLM's Mxfp4Config quantizes the fused MoE; attention and router stay BF16):
    gate_up = _tensor(big, "model.layers.0.mlp.experts.E.gate_up_proj")
    assert gate_up.fmt is WeightFormat.MXFP4
    n = 2 * 2880 * 2880
    assert gate_up.nbytes == 128 * (n // 2 + n // 32)  # uint8 blocks (2 per byte) + one E8M0 scale per 32
    assert _tensor(big, "model.layers.0.mlp.experts.E.gate_up_proj_bias").fmt is WeightFormat.BF16
    assert _tensor(big, "model.layers.0.self_attn.q_proj.weight").fmt is WeightFormat.BF16
    router = _tensor(big, "model.layers.0.mlp.router.weight")
    assert router.group is TensorGroup.ROUTER and router.sharding is Sharding.REPLICATED
    sinks = _tensor(big, "model.layers.0.self_attn.sinks")
    assert sinks.shape == (64,) and sinks.sharding is Sharding.SPLIT
    # the published checkpoint is ~65 GB (60.8 GiB): 4.25 bits per expert weight + BF16 rest
    assert 60 < (big.non_expert_bytes + big.expert_bytes) / GIB < 61.5
    small = load_model(models_dir / "gpt-oss-20b")
    assert round(small.total_params / 1e9, 1) == 20.9 and small.moe is not None and small.moe.num_experts == 32


def test_gpt_oss_sliding_window_kv_groups(models_dir: Path) -> None:
    """18 sliding + 18 full layers: two KV-cache groups of 18; a sliding layer holds at most window - 1 +
    max-num-batched-tokens tokens (+1 block), a full layer the whole request (SlidingWindowSpec)."""
    big = load_model(models_dir / "gpt-oss-120b")
    topo = Topology(tp=1, max_num_batched_tokens=2048)
    b = compute_memory(big, get_gpu("h100"), topo, MemoryInputs(isl=16384, osl=0, kv_cache_memory_bytes=10 * GIB))
    assert b.layout.group_size == 18 and b.layout.num_groups == 2
    assert b.layout.attn_bytes_per_token == 2 * 8 * 64 * 2
    assert b.blocks_per_request == 16384 // 16 + (-(-(127 + 2048) // 16) + 1)
    assert b.fits and b.weights.expert_bytes == big.expert_bytes  # TP1 keeps every expert


def test_deepseek_v32_indexer_cache_and_weights(models_dir: Path) -> None:
    v32 = load_model(models_dir / "deepseek-v3.2-exp")
    assert v32.mla is not None and v32.mla.index_head_dim == 128 and v32.mla.index_n_heads == 64
    wq_b = _tensor(v32, "model.layers.0.self_attn.indexer.wq_b.weight")
    assert wq_b.sharding is Sharding.REPLICATED and wq_b.fmt is WeightFormat.FP8_BLOCK
    assert _tensor(v32, "model.layers.0.self_attn.indexer.weights_proj.weight").fmt is WeightFormat.BF16
    v3 = load_model(models_dir / "deepseek-v3")
    per_layer = 64 * 128 * 1536 + 128 * 7168 + 64 * 7168 + 2 * 128  # wq_b, wk, weights_proj, k_norm
    assert v32.total_params - v3.total_params == 61 * per_layer
    inputs = MemoryInputs(kv_cache_memory_bytes=20 * GIB)
    for gpu in ("h200", "gb200"):  # FlashMLA sparse supports only block 64, on Hopper and Blackwell alike
        bf16 = compute_memory(v32, get_gpu(gpu), Topology(tp=8), inputs)
        assert bf16.layout.block_size == 64
        assert bf16.layout.attn_bytes_per_token == 576 * 2 + 132  # latent + indexer K (128 fp8 + fp32 scale)
    fp8 = compute_memory(v32, get_gpu("h200"), Topology(tp=8, kv_cache_dtype="fp8"), inputs)
    assert fp8.layout.kv_cache_dtype == "fp8_ds_mla"
    assert fp8.layout.attn_bytes_per_token == 656 + 132  # fp8_ds_mla record + indexer
    assert fp8.num_gpu_blocks == 20 * GIB // (64 * 788) // 61


def test_glm_46(models_dir: Path) -> None:
    glm = load_model(models_dir / "glm-4.6")
    assert glm.family == "glm4_moe" and glm.num_layers == 92 and glm.num_mtp_layers == 1
    assert glm.moe is not None and glm.moe.num_experts == 160 and glm.moe.num_shared_experts == 1
    assert glm.num_moe_layers == 89  # first_k_dense_replace = 3
    assert 350 < glm.total_params / 1e9 < 356  # "355B total parameters" (incl. the MTP layer: below)
    assert 352 < (glm.total_params + sum(t.num_params for t in glm.tensors if t.is_mtp)) / 1e9 < 360
    assert _tensor(glm, "model.layers.0.self_attn.q_proj.bias").shape == (96 * 128,)
    b = compute_memory(glm, get_gpu("h200"), Topology(tp=8, mtp=1), MemoryInputs(isl=8192, osl=1024))
    assert b.layout.attn_bytes_per_token == 2 * 1 * 128 * 2  # 8 KV heads over TP8
    assert b.layout.layers_by_kind[LayerKind.FULL_ATTENTION] == 93  # the MTP layer's attention too


def test_minimax_m2(models_dir: Path) -> None:
    mm = load_model(models_dir / "minimax-m2")
    assert mm.family == "minimax_m2" and mm.num_mtp_layers == 0
    assert 228 < mm.total_params / 1e9 < 231  # "230B total"
    assert 9.5 < (mm.active_params - 2 * 200064 * 3072) / 1e9 < 10.5  # "10B active" (without embeddings)
    assert _tensor(mm, "model.layers.0.block_sparse_moe.experts.E.w1.weight").fmt is WeightFormat.FP8_BLOCK
    assert _tensor(mm, "model.layers.0.block_sparse_moe.gate.weight").fmt is WeightFormat.BF16
    assert _tensor(mm, "model.layers.0.self_attn.q_norm.weight").shape == (48 * 128,)


def test_kimi_k2_fp8_and_int4(models_dir: Path) -> None:
    fp8 = load_model(models_dir / "kimi-k2-instruct")
    assert fp8.family == "deepseek_v3" and fp8.model_type == "kimi_k2"
    assert fp8.moe is not None and fp8.moe.num_experts == 384 and fp8.num_moe_layers == 60
    assert round(fp8.total_params / 1e12, 2) == 1.03 and 32 < fp8.active_params / 1e9 < 33.5
    int4 = load_model(models_dir / "kimi-k2-thinking")
    assert int4.quantization == "w4a16 int4 g32 (compressed-tensors)"
    expert = _tensor(int4, "model.layers.1.mlp.experts.E.gate_proj.weight")
    assert expert.fmt is WeightFormat.INT4
    n = 2048 * 7168
    assert expert.nbytes == 384 * (n // 2 + 2 * (n // 32) + 16)  # packed int4, bf16 scale per 32, weight_shape
    # the ignore list keeps attention, shared experts and the dense first layer in BF16
    assert _tensor(int4, "model.layers.1.self_attn.kv_b_proj.weight").fmt is WeightFormat.BF16
    assert _tensor(int4, "model.layers.1.mlp.shared_experts.up_proj.weight").fmt is WeightFormat.BF16
    assert _tensor(int4, "model.layers.0.mlp.gate_proj.weight").fmt is WeightFormat.BF16
    assert 540 < (int4.expert_bytes + int4.non_expert_bytes) / GIB < 560  # the published ~594 GB checkpoint
    # EP over 48 and 72 GPUs (384 = 8 x 48; 384 = 5 x 72 + 24: 6 experts on the first 24 ranks)
    b72 = compute_memory(int4, get_gpu("gb200"), Topology(tp=1, dp=72, ep=True))
    assert b72.weights.expert_bytes == pytest.approx(int4.expert_bytes * 6 / 384, rel=1e-9)


def _write(folder: Path, config: dict, quant: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if quant is not None:
        (folder / "hf_quant_config.json").write_text(json.dumps(quant))
    return folder


def test_modelopt_nvfp4_read_from_hf_quant_config(models_dir: Path, tmp_path: Path) -> None:
    """A ModelOpt export whose config.json has no quantization_config: vLLM reads hf_quant_config.json.
    (The config is the public Qwen3-235B-A22B one; the quant file is written here in ModelOpt's schema.)"""
    cfg = json.loads((models_dir / "qwen3-235b-a22b" / "config.json").read_text())
    quant = {"producer": {"name": "modelopt", "version": "0.23.0"},
             "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                              "exclude_modules": ["lm_head", "model.layers.*.self_attn*", "model.layers.*.mlp.gate"]}}
    spec = load_model(_write(tmp_path / "nvfp4", cfg, quant))
    assert spec.quantization == "nvfp4 (modelopt)"
    assert _tensor(spec, "model.layers.0.mlp.experts.E.down_proj.weight").fmt is WeightFormat.NVFP4
    assert _tensor(spec, "model.layers.0.self_attn.o_proj.weight").fmt is WeightFormat.BF16
    bf16 = load_model(models_dir / "qwen3-235b-a22b")
    assert spec.expert_bytes / bf16.expert_bytes == pytest.approx(4.5 / 16, rel=1e-3)
    with pytest.raises(ConfigError) as err:
        load_model(_write(tmp_path / "bad", cfg, {"producer": {"name": "modelopt"}}))
    assert "quant_algo" in err.value.field


@pytest.mark.parametrize(("qc", "fmt", "bytes_of"), [
    ({"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head"],
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float",
                                                                        "strategy": "channel"}}}},
     WeightFormat.FP8_CHANNEL, lambda r, c: r * c + 4 * r),
    ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": ["lm_head"],
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float",
                                                                        "group_size": 16}}}},
     WeightFormat.NVFP4, lambda r, c: r * c // 2 + r * c // 16 + 8),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
     WeightFormat.INT4_ZP, lambda r, c: r * c // 2 + 2 * (r * c // 128) + r * c // 256),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True},
     WeightFormat.INT4_ZP, lambda r, c: r * c // 2 + 2 * (r * c // 128) + r * c // 256),
])
def test_llama_in_each_format(models_dir: Path, tmp_path: Path, qc: dict, fmt: WeightFormat,
                              bytes_of) -> None:  # type: ignore[no-untyped-def]
    cfg = json.loads((models_dir / "llama-3.1-70b" / "config.json").read_text())
    spec = load_model(_write(tmp_path / "m", {**cfg, "quantization_config": qc}))
    down = _tensor(spec, "model.layers.0.mlp.down_proj.weight")
    assert down.fmt is fmt and down.nbytes == bytes_of(8192, 28672)
    assert _tensor(spec, "lm_head.weight").fmt is WeightFormat.BF16


def test_unknown_quant_method_names_the_field(models_dir: Path, tmp_path: Path) -> None:
    cfg = json.loads((models_dir / "llama-3.1-70b" / "config.json").read_text())
    with pytest.raises(ConfigError) as err:
        load_model(_write(tmp_path / "m", {**cfg, "quantization_config": {"quant_method": "bitsandbytes"}}))
    assert err.value.field.endswith("quantization_config.quant_method") and "awq" in err.value.fix


def test_gpt_oss_mxfp4_padding_follows_vllms_backends(models_dir: Path) -> None:
    """vLLM 0.32 fused_moe/oracle/mxfp4.py: FlashInfer TRT-LLM on Blackwell rounds I to 128 and H to 256
    (2880 -> 2944 and 3072); the Triton kernels on Hopper round the per-partition I to 64 (2880 stays, 1440 at
    TP2 becomes 1472). The slow test below checks these against vLLM's own function."""
    big = load_model(models_dir / "gpt-oss-120b")

    def per_expert(i: int, h: int) -> float:
        return 3 * i * h * (1 / 2 + 1 / 32) + 2 * (2 * i + h)

    h100 = compute_memory(big, get_gpu("h100"), Topology(tp=1))
    assert h100.weights.expert_bytes == big.expert_bytes
    b200 = compute_memory(big, get_gpu("b200"), Topology(tp=1))
    assert b200.weights.expert_bytes == pytest.approx(big.expert_bytes * per_expert(2944, 3072)
                                                      / per_expert(2880, 2880), rel=1e-9)
    tp2 = compute_memory(big, get_gpu("h100"), Topology(tp=2))
    assert tp2.weights.expert_bytes == pytest.approx(big.expert_bytes / 2 * per_expert(1472, 2880)
                                                     / per_expert(1440, 2880), rel=1e-9)
    assert "MXFP4 padding of flashinfer-trtllm" in next(line.how for line in b200.lines
                                                        if line.label == "expert weights")


@pytest.mark.parametrize(("name", "logged_gib"), [("gpt-oss-120b", 65.9651), ("gpt-oss-20b", 13.7153)])
def test_marlin_weights_match_vllms_logged_figures(models_dir: Path, name: str, logged_gib: float) -> None:
    """vLLM before 0.12 ran MXFP4 experts on Hopper with Marlin (triton_kernels was not installed): its start-up
    log says "Model loading took 65.9651 GiB" for gpt-oss-120b on one H100 (vllm#23278, v0.10.1; the same figure
    in a v0.11.2 log) and 13.7153 GiB for gpt-oss-20b (A100, Marlin-padded w13 [32, 5888, 1536]). The memory
    model with `mxfp4_backend=marlin` must land within 0.5% of both; vLLM's current default (Triton) pads nothing
    for these shapes, and is smaller."""
    spec = load_model(models_dir / name)
    marlin = compute_memory(spec, get_gpu("h100"), Topology(tp=1), MemoryInputs(mxfp4_backend=Mxfp4Backend.MARLIN))
    assert marlin.weights.total_bytes / GIB == pytest.approx(logged_gib, rel=0.005)
    triton = compute_memory(spec, get_gpu("h100"), Topology(tp=1))
    assert triton.weights.total_bytes < marlin.weights.total_bytes * 0.95
    assert "MXFP4 padding of marlin" in next(line.how for line in marlin.lines if line.label == "expert weights")


def test_unknown_mxfp4_backend_names_the_field() -> None:
    assert MemoryInputs(mxfp4_backend="marlin").mxfp4_backend is Mxfp4Backend.MARLIN  # type: ignore[arg-type]
    with pytest.raises(ConfigError) as err:
        MemoryInputs(mxfp4_backend="cutlass")  # type: ignore[arg-type]
    assert err.value.field == "--mxfp4-backend" and "flashinfer-cutlass" in err.value.fix
