"""Qwen3-Next / Qwen3.5 hybrids: Gated DeltaNet layers with a full-attention layer every N, MoE or dense."""

from __future__ import annotations

from tuner.models._config import RawConfig
from tuner.models._quant import QuantPolicy
from tuner.models._registry import make_spec, register_family
from tuner.models._spec import AttentionSpec, LayerKind, LinearAttentionSpec, ModelSpec, MoESpec
from tuner.models._tensors import InventoryBuilder

_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
             "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
             "linear_conv_kernel_dim", "vocab_size")


def _layer_kinds(cfg: RawConfig, num_layers: int) -> list[LayerKind]:
    if "layer_types" in cfg:
        names = cfg.get("layer_types")
        return [LayerKind.FULL_ATTENTION if n == "full_attention" else LayerKind.LINEAR_ATTENTION for n in names]
    interval = cfg.int("full_attention_interval", 4)
    return [LayerKind.FULL_ATTENTION if (i + 1) % interval == 0 else LayerKind.LINEAR_ATTENTION
            for i in range(num_layers)]


@register_family("qwen3_next", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")
def build(cfg: RawConfig, policy: QuantPolicy, name: str) -> ModelSpec:
    cfg.require("qwen3_next", _REQUIRED)
    hidden = cfg.int("hidden_size")
    num_layers = cfg.int("num_hidden_layers")
    heads = cfg.int("num_attention_heads")
    attn = AttentionSpec(num_heads=heads, num_kv_heads=cfg.int("num_key_value_heads"),
                         head_dim=cfg.int("head_dim", hidden // heads),
                         output_gate=bool(cfg.get("attn_output_gate", True)))
    dtype = str(cfg.get("torch_dtype", "bfloat16"))
    ssm_dtype = str(cfg.get("mamba_ssm_dtype", "auto"))
    la = LinearAttentionSpec(
        num_key_heads=cfg.int("linear_num_key_heads"), num_value_heads=cfg.int("linear_num_value_heads"),
        key_head_dim=cfg.int("linear_key_head_dim"), value_head_dim=cfg.int("linear_value_head_dim"),
        conv_kernel=cfg.int("linear_conv_kernel_dim"), conv_state_dtype=dtype,
        ssm_state_dtype=dtype if ssm_dtype == "auto" else ssm_dtype)
    num_experts = cfg.int("num_experts", 0)
    moe = None
    if num_experts:
        moe = MoESpec(num_experts=num_experts, experts_per_token=cfg.int("num_experts_per_tok"),
                      expert_intermediate_size=cfg.int("moe_intermediate_size"),
                      shared_intermediate_size=cfg.int("shared_expert_intermediate_size", 0),
                      num_shared_experts=1 if cfg.int("shared_expert_intermediate_size", 0) else 0)
    dense_inter = cfg.int("intermediate_size", 0) or None
    kinds = _layer_kinds(cfg, num_layers)
    mlp_only = set(cfg.get("mlp_only_layers", []))
    step = cfg.int("decoder_sparse_step", 1)
    moe_layers = [bool(moe) and i not in mlp_only and (i + 1) % step == 0 for i in range(num_layers)]

    b = InventoryBuilder(policy)
    b.embeddings(cfg.int("vocab_size"), hidden, bool(cfg.get("tie_word_embeddings", False)))

    def decoder_layer(prefix: str, kind: LayerKind, is_moe: bool, mtp: bool = False) -> None:
        b.norm(f"{prefix}.input_layernorm", hidden, mtp=mtp)
        b.norm(f"{prefix}.post_attention_layernorm", hidden, mtp=mtp)
        if kind is LayerKind.FULL_ATTENTION:
            b.gqa_attention(prefix, hidden, attn, qk_norm=True, mtp=mtp)
        else:
            b.gated_delta_net(prefix, hidden, la)
        if is_moe and moe:
            b.moe(f"{prefix}.mlp", hidden, moe, shared_gate=True, mtp=mtp)
        else:
            b.mlp(f"{prefix}.mlp", hidden, dense_inter or 0, mtp=mtp)

    for i, kind in enumerate(kinds):
        decoder_layer(f"model.layers.{i}", kind, moe_layers[i])
    num_mtp = cfg.int("mtp_num_hidden_layers", cfg.int("num_nextn_predict_layers", 0))
    if num_mtp:
        b.linear("mtp.fc", hidden, 2 * hidden, mtp=True)
        b.norm("mtp.pre_fc_norm_embedding", hidden, mtp=True)
        b.norm("mtp.pre_fc_norm_hidden", hidden, mtp=True)
        b.norm("mtp.norm", hidden, mtp=True)
        for j in range(num_mtp):
            decoder_layer(f"mtp.layers.{j}", LayerKind.FULL_ATTENTION, bool(moe), mtp=True)

    return make_spec(cfg, policy, name, family="qwen3_next", tensors=b.build(), layer_kinds=kinds,
                     moe_layers=moe_layers, attention=attn, mla=None, linear_attention=la, mamba=None, moe=moe,
                     dense_intermediate_size=dense_inter, num_mtp_layers=num_mtp,
                     mtp_layer_kind=LayerKind.FULL_ATTENTION if num_mtp else None)
