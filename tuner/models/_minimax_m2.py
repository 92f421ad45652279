"""MiniMax-M2 (MiniMaxM2ForCausalLM): full GQA attention with per-layer q/k RMSNorm, 256 routed experts with a
sigmoid router and score-correction bias, no shared expert (vllm/model_executor/models/minimax_m2.py).

The checkpoint's MTP modules (use_mtp, num_mtp_modules) are not loaded by vLLM's MiniMaxM2ForCausalLM, so they
are not counted."""

from __future__ import annotations

from tuner.models._config import RawConfig
from tuner.models._quant import QuantPolicy
from tuner.models._registry import make_spec, register_family
from tuner.models._spec import AttentionSpec, LayerKind, ModelSpec, MoESpec
from tuner.models._tensors import InventoryBuilder

_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
             "num_local_experts", "num_experts_per_tok", "intermediate_size", "vocab_size")


@register_family("minimax_m2", "minimax_m2")
def build(cfg: RawConfig, policy: QuantPolicy, name: str) -> ModelSpec:
    cfg.require("minimax_m2", _REQUIRED)
    hidden = cfg.int("hidden_size")
    num_layers = cfg.int("num_hidden_layers")
    attn = AttentionSpec(num_heads=cfg.int("num_attention_heads"), num_kv_heads=cfg.int("num_key_value_heads"),
                         head_dim=cfg.int("head_dim"))
    moe = MoESpec(num_experts=cfg.int("num_local_experts"), experts_per_token=cfg.int("num_experts_per_tok"),
                  expert_intermediate_size=cfg.int("intermediate_size"))
    b = InventoryBuilder(policy)
    b.embeddings(cfg.int("vocab_size"), hidden, bool(cfg.get("tie_word_embeddings", False)))
    for i in range(num_layers):
        p = f"model.layers.{i}"
        b.norm(f"{p}.input_layernorm", hidden)
        b.norm(f"{p}.post_attention_layernorm", hidden)
        b.gqa_attention(p, hidden, attn, qk_norm=False)
        if cfg.get("use_qk_norm", True):  # qk_norm_type per_layer: one norm over all heads
            b.norm(f"{p}.self_attn.q_norm", attn.num_heads * attn.head_dim)
            b.norm(f"{p}.self_attn.k_norm", attn.num_kv_heads * attn.head_dim)
        b.moe(f"{p}.block_sparse_moe", hidden, moe, score_bias=False, expert_names=("w1", "w3", "w2"))
        if cfg.get("use_routing_bias", True):
            b.add(f"{p}.block_sparse_moe.e_score_correction_bias", (moe.num_experts,))
    return make_spec(cfg, policy, name, family="minimax_m2", tensors=b.build(),
                     layer_kinds=[LayerKind.FULL_ATTENTION] * num_layers, moe_layers=[True] * num_layers,
                     attention=attn, mla=None, linear_attention=None, mamba=None, moe=moe,
                     dense_intermediate_size=None, num_mtp_layers=0, mtp_layer_kind=None)
