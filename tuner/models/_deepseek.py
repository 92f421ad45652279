"""DeepSeek-V3 style: multi-head latent attention, first-k dense layers, routed + shared experts, MTP."""

from __future__ import annotations

import dataclasses

from tuner.models._config import RawConfig
from tuner.models._quant import QuantPolicy
from tuner.models._registry import make_spec, register_family
from tuner.models._spec import LayerKind, MLASpec, ModelSpec, MoESpec
from tuner.models._tensors import InventoryBuilder

_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim",
             "qk_rope_head_dim", "v_head_dim", "vocab_size", "intermediate_size")


@register_family("deepseek_v3", "deepseek_v3", "deepseek_v2", "kimi_k2", "deepseek_v32")
def build(cfg: RawConfig, policy: QuantPolicy, name: str) -> ModelSpec:
    """DeepSeek-V2/V3, Kimi-K2 (same layout) and DeepSeek-V3.2 (adds the sparse-attention indexer per layer).

    One pass over the config's fields in the order of the model's layers, so it reads against vLLM's
    deepseek_v2.py; the shared pieces (MLA, MoE, tensors) are already helpers."""
    cfg.require("deepseek_v3", _REQUIRED)
    hidden = cfg.int("hidden_size")
    num_layers = cfg.int("num_hidden_layers")
    q_lora = cfg.get("q_lora_rank")
    index_dim = cfg.int("index_head_dim", 0) if cfg.get("model_type") == "deepseek_v32" else 0
    mla = MLASpec(num_heads=cfg.int("num_attention_heads"), q_lora_rank=int(q_lora) if q_lora else None,
                  kv_lora_rank=cfg.int("kv_lora_rank"), qk_nope_head_dim=cfg.int("qk_nope_head_dim"),
                  qk_rope_head_dim=cfg.int("qk_rope_head_dim"), v_head_dim=cfg.int("v_head_dim"),
                  index_head_dim=index_dim or None, index_n_heads=cfg.int("index_n_heads", 64) if index_dim else None,
                  index_topk=cfg.int("index_topk") if index_dim else None)
    if index_dim:  # vLLM's Indexer.weights_proj is a ReplicatedLinear with quant_config=None: stays BF16
        policy = dataclasses.replace(policy, ignore=(*policy.ignore, "*.indexer.weights_proj"))
    num_experts = cfg.int("n_routed_experts", 0)
    moe = None
    if num_experts:
        n_shared = cfg.int("n_shared_experts", 0)
        moe_inter = cfg.int("moe_intermediate_size")
        moe = MoESpec(num_experts=num_experts, experts_per_token=cfg.int("num_experts_per_tok"),
                      expert_intermediate_size=moe_inter, shared_intermediate_size=n_shared * moe_inter,
                      num_shared_experts=n_shared)
    first_dense = cfg.int("first_k_dense_replace", 0)
    freq = cfg.int("moe_layer_freq", 1)
    moe_layers = [bool(moe) and i >= first_dense and i % freq == 0 for i in range(num_layers)]
    dense_inter = cfg.int("intermediate_size")

    b = InventoryBuilder(policy)
    b.embeddings(cfg.int("vocab_size"), hidden, bool(cfg.get("tie_word_embeddings", False)))

    def decoder_layer(prefix: str, is_moe: bool, mtp: bool = False) -> None:
        b.norm(f"{prefix}.input_layernorm", hidden, mtp=mtp)
        b.norm(f"{prefix}.post_attention_layernorm", hidden, mtp=mtp)
        b.mla_attention(prefix, hidden, mla, mtp=mtp)
        if mla.index_head_dim and mla.index_n_heads:
            ix = f"{prefix}.self_attn.indexer"
            b.linear(f"{ix}.wq_b", mla.index_n_heads * mla.index_head_dim, mla.q_lora_rank or hidden, mtp=mtp)
            b.linear(f"{ix}.wk", mla.index_head_dim, hidden, mtp=mtp)
            b.add(f"{ix}.k_norm.weight", (mla.index_head_dim,), mtp=mtp)
            b.add(f"{ix}.k_norm.bias", (mla.index_head_dim,), mtp=mtp)
            b.linear(f"{ix}.weights_proj", mla.index_n_heads, hidden, mtp=mtp)
        if is_moe and moe:
            b.moe(f"{prefix}.mlp", hidden, moe, shared_name="shared_experts", score_bias=True, mtp=mtp)
        else:
            b.mlp(f"{prefix}.mlp", hidden, dense_inter, mtp=mtp)

    for i in range(num_layers):
        decoder_layer(f"model.layers.{i}", moe_layers[i])
    num_mtp = cfg.int("num_nextn_predict_layers", 0)
    b.nextn_layers(num_layers, num_mtp, hidden, lambda prefix: decoder_layer(prefix, bool(moe), mtp=True))

    return make_spec(cfg, policy, name, family="deepseek_v3", tensors=b.build(),
                     layer_kinds=[LayerKind.MLA] * num_layers, moe_layers=moe_layers, attention=None, mla=mla,
                     linear_attention=None, mamba=None, moe=moe, dense_intermediate_size=dense_inter,
                     num_mtp_layers=num_mtp, mtp_layer_kind=LayerKind.MLA if num_mtp else None)
