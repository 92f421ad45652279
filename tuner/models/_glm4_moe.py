"""GLM-4.5 / GLM-4.6 (zai-org, Glm4MoeForCausalLM): GQA attention with qkv bias, first-k dense layers, routed +
shared experts with a score-correction bias, MTP layer(s) (vllm/model_executor/models/glm4_moe.py, glm4_moe_mtp.py)."""

from __future__ import annotations

from tuner.models._config import RawConfig
from tuner.models._quant import QuantPolicy
from tuner.models._registry import make_spec, register_family
from tuner.models._spec import AttentionSpec, LayerKind, ModelSpec, MoESpec
from tuner.models._tensors import InventoryBuilder

_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "vocab_size",
             "intermediate_size", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size")


@register_family("glm4_moe", "glm4_moe")
def build(cfg: RawConfig, policy: QuantPolicy, name: str) -> ModelSpec:
    cfg.require("glm4_moe", _REQUIRED)
    hidden = cfg.int("hidden_size")
    num_layers = cfg.int("num_hidden_layers")
    heads = cfg.int("num_attention_heads")
    attn = AttentionSpec(num_heads=heads, num_kv_heads=cfg.int("num_key_value_heads"),
                         head_dim=cfg.int("head_dim", hidden // heads))
    n_shared = cfg.int("n_shared_experts", 0)
    moe_inter = cfg.int("moe_intermediate_size")
    moe = MoESpec(num_experts=cfg.int("n_routed_experts"), experts_per_token=cfg.int("num_experts_per_tok"),
                  expert_intermediate_size=moe_inter, shared_intermediate_size=n_shared * moe_inter,
                  num_shared_experts=n_shared)
    first_dense = cfg.int("first_k_dense_replace", 0)
    moe_layers = [i >= first_dense for i in range(num_layers)]
    dense_inter = cfg.int("intermediate_size")
    qk_norm = bool(cfg.get("use_qk_norm", False))
    bias = bool(cfg.get("attention_bias", True))

    b = InventoryBuilder(policy)
    b.embeddings(cfg.int("vocab_size"), hidden, bool(cfg.get("tie_word_embeddings", False)))

    def decoder_layer(prefix: str, is_moe: bool, mtp: bool = False) -> None:
        b.norm(f"{prefix}.input_layernorm", hidden, mtp=mtp)
        b.norm(f"{prefix}.post_attention_layernorm", hidden, mtp=mtp)
        b.gqa_attention(prefix, hidden, attn, qk_norm=qk_norm, qkv_bias=bias, mtp=mtp)
        if is_moe:
            b.moe(f"{prefix}.mlp", hidden, moe, shared_name="shared_experts", score_bias=True, mtp=mtp)
        else:
            b.mlp(f"{prefix}.mlp", hidden, dense_inter, mtp=mtp)

    for i in range(num_layers):
        decoder_layer(f"model.layers.{i}", moe_layers[i])
    num_mtp = cfg.int("num_nextn_predict_layers", 0)
    b.nextn_layers(num_layers, num_mtp, hidden, lambda prefix: decoder_layer(prefix, True, mtp=True))  # one MoE layer
    return make_spec(cfg, policy, name, family="glm4_moe", tensors=b.build(),
                     layer_kinds=[LayerKind.FULL_ATTENTION] * num_layers, moe_layers=moe_layers, attention=attn,
                     mla=None, linear_attention=None, mamba=None, moe=moe, dense_intermediate_size=dense_inter,
                     num_mtp_layers=num_mtp, mtp_layer_kind=LayerKind.FULL_ATTENTION if num_mtp else None)
