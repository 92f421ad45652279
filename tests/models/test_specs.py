"""Model specs from config.json: the reference figures, every family, and clear errors."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from tuner.errors import ConfigError, UnsupportedModelError
from tuner.models import LayerKind, Sharding, TensorGroup, WeightFormat, load_model, supported_model_types
from tuner.models._tensors import classify

GIB = 1024**3


def test_reference_model_matches_published_figures(reference_model_path: Path) -> None:
    spec = load_model(reference_model_path)
    assert round(spec.non_expert_bytes / GIB, 1) == 91.0
    assert round(spec.expert_bytes / GIB, 1) == 1242.0
    assert round(spec.active_params / 1e9, 1) == 95.2
    assert spec.count_layers(LayerKind.LINEAR_ATTENTION) == 69
    assert spec.count_layers(LayerKind.FULL_ATTENTION) == 23
    # the MTP layer is counted apart: it loads only when MTP is on
    assert spec.num_mtp_layers == 1 and spec.mtp_bytes > 0
    assert all(t.is_mtp for t in spec.tensors if t.name.startswith("mtp."))
    assert spec.linear_attention is not None and spec.linear_attention.ssm_state_dtype == "float32"


def test_reference_model_formats_follow_the_ignore_list(reference_model_path: Path) -> None:
    spec = load_model(reference_model_path)
    by_name = {t.name: t for t in spec.tensors}
    assert by_name["model.layers.0.mlp.experts.E.gate_proj.weight"].fmt is WeightFormat.NVFP4
    assert by_name["model.layers.3.self_attn.q_proj.weight"].fmt is WeightFormat.BF16  # *self_attn*
    assert by_name["model.layers.0.linear_attn.in_proj_qkvz.weight"].fmt is WeightFormat.BF16  # *linear_attn*
    assert by_name["model.layers.0.mlp.shared_expert.up_proj.weight"].fmt is WeightFormat.BF16
    assert by_name["model.layers.0.mlp.gate.weight"].fmt is WeightFormat.BF16
    # NVFP4: 4.5 bits per parameter (4-bit value + one FP8 scale per 16) + two fp32 global scales
    expert = by_name["model.layers.0.mlp.experts.E.down_proj.weight"]
    assert expert.nbytes == expert.count * (expert.num_params // expert.count * 9 // 16 + 8)


def test_deepseek_v3_mla_and_fp8_blocks(models_dir: Path) -> None:
    spec = load_model(models_dir / "deepseek-v3")
    assert spec.mla is not None and spec.mla.cache_dim == 576
    assert round(spec.total_params / 1e9) == 671  # published: 671B (+ MTP)
    assert 37.0 <= spec.active_params / 1e9 <= 38.0  # published: 37B activated
    assert sum(spec.moe_layers) == 58  # first 3 layers dense
    q_b = next(t for t in spec.tensors if t.name == "model.layers.0.self_attn.q_b_proj.weight")
    assert q_b.fmt is WeightFormat.FP8_BLOCK
    # 24576 x 1536 fp8 + one fp32 scale per 128x128 block
    assert q_b.nbytes == 24576 * 1536 + 4 * (24576 // 128) * (1536 // 128)
    assert spec.mtp_layer_kind is LayerKind.MLA and spec.mtp_bytes > 0


def test_llama_70b_dense(models_dir: Path) -> None:
    spec = load_model(models_dir / "llama-3.1-70b")
    assert spec.moe is None and spec.expert_bytes == 0
    assert round(spec.total_params / 1e9, 1) == 70.6
    assert spec.non_expert_bytes == 2 * spec.total_params


def test_qwen3_next_hybrid(models_dir: Path) -> None:
    spec = load_model(models_dir / "qwen3-next-80b-a3b")
    assert spec.is_hybrid and spec.count_layers(LayerKind.FULL_ATTENTION) == 12
    assert round(spec.total_params / 1e9) == 80
    assert spec.linear_attention is not None and spec.linear_attention.ssm_state_dtype == "bfloat16"


def test_text_config_is_read(tmp_path: Path, models_dir: Path) -> None:
    inner = json.loads((models_dir / "llama-3.1-70b" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llava", "text_config": inner,
                                                       "architectures": ["LlavaForConditionalGeneration"]}))
    spec = load_model(tmp_path)
    assert spec.model_type == "llama" and spec.num_layers == 80


def test_unknown_architecture_names_the_field(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "rwkv7", "hidden_size": 8}))
    with pytest.raises(UnsupportedModelError) as err:
        load_model(tmp_path)
    assert "model_type" in str(err.value) and "llama" in str(err.value)


def test_missing_fields_are_all_named(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3_next", "hidden_size": 8}))
    with pytest.raises(UnsupportedModelError) as err:
        load_model(tmp_path)
    text = str(err.value)
    for name in ("num_hidden_layers", "linear_num_value_heads", "vocab_size"):
        assert name in text


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"model_type": "llama", "hidden_size": -4, '
                                     '"num_hidden_layers": 2, "num_attention_heads": 2, "vocab_size": 8, '
                                     '"intermediate_size": 8}'])
def test_bad_files_give_config_errors(tmp_path: Path, content: str) -> None:
    (tmp_path / "config.json").write_text(content)
    with pytest.raises(ConfigError):
        load_model(tmp_path)


def test_missing_path() -> None:
    with pytest.raises(ConfigError, match="no such file"):
        load_model("/nonexistent/model")


def _write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int], int]]) -> None:
    header, offset = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_safetensors_headers_give_exact_bytes(tmp_path: Path, models_dir: Path) -> None:
    config = json.loads((models_dir / "llama-3.1-70b" / "config.json").read_text())
    config.update(num_hidden_layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=100)
    (tmp_path / "config.json").write_text(json.dumps(config))
    from_config = load_model(tmp_path)
    _write_safetensors(tmp_path / "model.safetensors", {
        "model.embed_tokens.weight": ("BF16", [100, 64], 12800),
        "model.layers.0.self_attn.q_proj.weight": ("BF16", [64, 64], 8192),
        "model.layers.0.mlp.experts.0.up_proj.weight": ("U8", [128, 32], 4096),
        "lm_head.weight": ("BF16", [100, 64], 12800),
    })
    spec = load_model(tmp_path)
    assert spec.weights_source == "safetensors headers"
    assert spec.non_expert_bytes == 12800 + 8192 + 12800
    assert spec.expert_bytes == 4096
    assert spec.non_expert_bytes != from_config.non_expert_bytes
    assert load_model(tmp_path, use_safetensors=False).weights_source == "config.json"


def test_truncated_safetensors_is_a_clear_error(tmp_path: Path, models_dir: Path) -> None:
    (tmp_path / "config.json").write_text((models_dir / "llama-3.1-70b" / "config.json").read_text())
    (tmp_path / "model.safetensors").write_bytes(b"\x01\x02")
    with pytest.raises(ConfigError, match="too short"):
        load_model(tmp_path)


@pytest.mark.parametrize(("name", "group", "sharding"), [
    ("model.layers.3.mlp.experts.17.down_proj.weight", TensorGroup.EXPERT, Sharding.EXPERTS),
    ("model.layers.3.mlp.gate.weight", TensorGroup.ROUTER, Sharding.REPLICATED),
    ("model.layers.3.self_attn.k_proj.weight", TensorGroup.ATTENTION, Sharding.KV_HEADS),
    ("model.layers.3.self_attn.kv_a_proj_with_mqa.weight", TensorGroup.ATTENTION, Sharding.REPLICATED),
    ("model.layers.3.linear_attn.out_proj.weight", TensorGroup.LINEAR_ATTENTION, Sharding.SPLIT),
    ("model.layers.3.input_layernorm.weight", TensorGroup.NORM, Sharding.REPLICATED),
    ("model.embed_tokens.weight", TensorGroup.EMBEDDING, Sharding.VOCAB),
    ("model.layers.3.block_sparse_moe.experts.2.w1.weight", TensorGroup.EXPERT, Sharding.EXPERTS),
    ("model.layers.3.mlp.shared_experts.up_proj.weight", TensorGroup.SHARED_EXPERT, Sharding.SPLIT),
])
def test_classifier(name: str, group: TensorGroup, sharding: Sharding) -> None:
    assert classify(name) == (group, sharding)


def test_registry_lists_the_families() -> None:
    types = supported_model_types()
    for t in ("qwen3_next", "qwen3_5_moe", "deepseek_v3", "qwen3_moe", "mixtral", "llama", "qwen2", "qwen3"):
        assert t in types


def test_mixtral_and_qwen3_moe(tmp_path: Path) -> None:
    mixtral = {"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": 8, "vocab_size": 32000, "intermediate_size": 14336,
               "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None}
    (tmp_path / "config.json").write_text(json.dumps(mixtral))
    spec = load_model(tmp_path)
    assert round(spec.total_params / 1e9, 1) == 46.7  # Mixtral-8x7B: 46.7B
    assert round(spec.active_params / 1e9, 1) == 12.9  # 12.9B active


def test_safetensors_of_mxfp4_and_int4_checkpoints(tmp_path: Path, models_dir: Path) -> None:
    """gpt-oss stores experts as *_blocks (2 values per uint8) and *_scales; compressed-tensors W4A16 as
    weight_packed (8 values per int32) + weight_scale + weight_shape: bytes are the file's, params unpacked."""
    oss = json.loads((models_dir / "gpt-oss-20b" / "config.json").read_text())
    oss.update(num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"])
    (tmp_path / "oss").mkdir()
    (tmp_path / "oss" / "config.json").write_text(json.dumps(oss))
    _write_safetensors(tmp_path / "oss" / "model.safetensors", {
        "model.layers.0.mlp.experts.gate_up_proj_blocks": ("U8", [32, 5760, 90, 16], 32 * 5760 * 90 * 16),
        "model.layers.0.mlp.experts.gate_up_proj_scales": ("U8", [32, 5760, 90], 32 * 5760 * 90),
        "model.layers.0.mlp.experts.gate_up_proj_bias": ("BF16", [32, 5760], 32 * 5760 * 2),
        "model.layers.0.mlp.router.weight": ("BF16", [32, 2880], 32 * 2880 * 2),
    })
    spec = load_model(tmp_path / "oss")
    blocks = next(t for t in spec.tensors if t.name.endswith("_blocks"))
    scales = next(t for t in spec.tensors if t.name.endswith("_scales"))
    assert blocks.is_expert and blocks.fmt is WeightFormat.MXFP4 and blocks.num_params == 32 * 5760 * 2880
    assert scales.num_params == 0 and scales.fmt is WeightFormat.MXFP4
    assert spec.expert_bytes == 32 * 5760 * (90 * 16 + 90 + 2)
    router = next(t for t in spec.tensors if t.name.endswith("router.weight"))
    assert router.group is TensorGroup.ROUTER and router.sharding is Sharding.REPLICATED
    kimi = json.loads((models_dir / "kimi-k2-thinking" / "config.json").read_text())
    kimi.update(num_hidden_layers=2)
    (tmp_path / "kimi").mkdir()
    (tmp_path / "kimi" / "config.json").write_text(json.dumps(kimi))
    _write_safetensors(tmp_path / "kimi" / "model.safetensors", {
        "model.layers.1.mlp.experts.0.up_proj.weight_packed": ("I32", [2048, 896], 2048 * 896 * 4),
        "model.layers.1.mlp.experts.0.up_proj.weight_scale": ("BF16", [2048, 224], 2048 * 224 * 2),
        "model.layers.1.mlp.experts.0.up_proj.weight_shape": ("I64", [2], 16),
    })
    spec = load_model(tmp_path / "kimi")
    packed = next(t for t in spec.tensors if t.name.endswith("weight_packed"))
    assert packed.fmt is WeightFormat.INT4 and packed.num_params == 2048 * 7168 and packed.is_expert
    assert spec.expert_params == 2048 * 7168  # scale and shape count no parameters
