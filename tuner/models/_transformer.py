"""Plain decoder transformers: dense llama / qwen2 / qwen3 / mistral and MoE qwen3_moe / mixtral."""

from __future__ import annotations

from tuner.models._config import RawConfig
from tuner.models._quant import QuantPolicy
from tuner.models._registry import make_spec, register_family
from tuner.models._spec import AttentionSpec, LayerKind, ModelSpec, MoESpec
from tuner.models._tensors import InventoryBuilder

_BASE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
_QK_NORM = {"qwen3", "qwen3_moe"}
_QKV_BIAS = {"qwen2", "qwen2_moe"}


def _attention(cfg: RawConfig) -> AttentionSpec:
    hidden, heads = cfg.int("hidden_size"), cfg.int("num_attention_heads")
    window = cfg.get("sliding_window")
    uses_window = window and cfg.get("use_sliding_window", cfg.get("model_type") in ("mistral", "mixtral"))
    return AttentionSpec(num_heads=heads, num_kv_heads=cfg.int("num_key_value_heads", heads),
                         head_dim=cfg.int("head_dim", hidden // heads),
                         sliding_window=int(window) if uses_window else None)


def _layer_kinds(cfg: RawConfig, attn: AttentionSpec) -> list[LayerKind]:
    n = cfg.int("num_hidden_layers")
    if "layer_types" in cfg:
        return [LayerKind.SLIDING_WINDOW if t == "sliding_attention" else LayerKind.FULL_ATTENTION
                for t in cfg.get("layer_types")]
    return [LayerKind.SLIDING_WINDOW if attn.sliding_window else LayerKind.FULL_ATTENTION] * n


def _build(cfg: RawConfig, policy: QuantPolicy, name: str, *, moe: MoESpec | None, family: str,
           expert_block: str = "mlp", expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
           moe_layers: list[bool] | None = None) -> ModelSpec:
    hidden = cfg.int("hidden_size")
    attn = _attention(cfg)
    kinds = _layer_kinds(cfg, attn)
    moe_layers = moe_layers or [False] * len(kinds)
    dense_inter = cfg.int("intermediate_size", 0) or None
    model_type = str(cfg.get("model_type"))
    b = InventoryBuilder(policy)
    b.embeddings(cfg.int("vocab_size"), hidden, bool(cfg.get("tie_word_embeddings", False)))
    for i in range(len(kinds)):
        prefix = f"model.layers.{i}"
        b.norm(f"{prefix}.input_layernorm", hidden)
        b.norm(f"{prefix}.post_attention_layernorm", hidden)
        b.gqa_attention(prefix, hidden, attn, qk_norm=model_type in _QK_NORM, qkv_bias=model_type in _QKV_BIAS)
        if moe_layers[i] and moe:
            b.moe(f"{prefix}.{expert_block}", hidden, moe, expert_names=expert_names)
        else:
            b.mlp(f"{prefix}.mlp", hidden, dense_inter or 0)
    return make_spec(cfg, policy, name, family=family, tensors=b.build(), layer_kinds=kinds,
                     moe_layers=moe_layers, attention=attn, mla=None, linear_attention=None, mamba=None, moe=moe,
                     dense_intermediate_size=dense_inter, num_mtp_layers=0, mtp_layer_kind=None)


@register_family("dense", "llama", "qwen2", "qwen3", "mistral")
def build_dense(cfg: RawConfig, policy: QuantPolicy, name: str) -> ModelSpec:
    cfg.require("dense", (*_BASE, "intermediate_size"))
    return _build(cfg, policy, name, moe=None, family="dense")


@register_family("qwen3_moe", "qwen3_moe", "qwen2_moe")
def build_qwen3_moe(cfg: RawConfig, policy: QuantPolicy, name: str) -> ModelSpec:
    cfg.require("qwen3_moe", (*_BASE, "num_experts", "num_experts_per_tok", "moe_intermediate_size"))
    shared = cfg.int("shared_expert_intermediate_size", 0)
    moe = MoESpec(num_experts=cfg.int("num_experts"), experts_per_token=cfg.int("num_experts_per_tok"),
                  expert_intermediate_size=cfg.int("moe_intermediate_size"), shared_intermediate_size=shared,
                  num_shared_experts=1 if shared else 0)
    n = cfg.int("num_hidden_layers")
    mlp_only = set(cfg.get("mlp_only_layers", []))
    step = cfg.int("decoder_sparse_step", 1)
    moe_layers = [i not in mlp_only and (i + 1) % step == 0 for i in range(n)]
    return _build(cfg, policy, name, moe=moe, family="qwen3_moe", moe_layers=moe_layers)


@register_family("mixtral", "mixtral")
def build_mixtral(cfg: RawConfig, policy: QuantPolicy, name: str) -> ModelSpec:
    cfg.require("mixtral", (*_BASE, "num_local_experts", "num_experts_per_tok", "intermediate_size"))
    moe = MoESpec(num_experts=cfg.int("num_local_experts"), experts_per_token=cfg.int("num_experts_per_tok"),
                  expert_intermediate_size=cfg.int("intermediate_size"))
    n = cfg.int("num_hidden_layers")
    return _build(cfg, policy, name, moe=moe, family="mixtral", expert_block="block_sparse_moe",
                  expert_names=("w1", "w3", "w2"), moe_layers=[True] * n)
