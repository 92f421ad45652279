"""gpt-oss (openai/gpt-oss-120b, -20b): alternating sliding-window / full attention with attention sinks,
MXFP4 experts with biases (vllm/model_executor/models/gpt_oss.py)."""

from __future__ import annotations

from tuner.models._config import RawConfig
from tuner.models._quant import QuantPolicy
from tuner.models._registry import make_spec, register_family
from tuner.models._spec import AttentionSpec, LayerKind, ModelSpec, MoESpec
from tuner.models._tensors import InventoryBuilder

_REQUIRED = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
             "num_local_experts", "num_experts_per_tok", "intermediate_size", "vocab_size")


def _layer_kinds(cfg: RawConfig, num_layers: int) -> list[LayerKind]:
    names = cfg.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention"
                                       for i in range(num_layers)]
    return [LayerKind.SLIDING_WINDOW if n == "sliding_attention" else LayerKind.FULL_ATTENTION for n in names]


@register_family("gpt_oss", "gpt_oss")
def build(cfg: RawConfig, policy: QuantPolicy, name: str) -> ModelSpec:
    cfg.require("gpt_oss", _REQUIRED)
    hidden = cfg.int("hidden_size")
    num_layers = cfg.int("num_hidden_layers")
    attn = AttentionSpec(num_heads=cfg.int("num_attention_heads"), num_kv_heads=cfg.int("num_key_value_heads"),
                         head_dim=cfg.int("head_dim"), sliding_window=cfg.int("sliding_window", 128))
    moe = MoESpec(num_experts=cfg.int("num_local_experts"), experts_per_token=cfg.int("num_experts_per_tok"),
                  expert_intermediate_size=cfg.int("intermediate_size"))
    inter = moe.expert_intermediate_size
    b = InventoryBuilder(policy)
    b.embeddings(cfg.int("vocab_size"), hidden, bool(cfg.get("tie_word_embeddings", False)))
    for i in range(num_layers):
        p = f"model.layers.{i}"
        b.norm(f"{p}.input_layernorm", hidden)
        b.norm(f"{p}.post_attention_layernorm", hidden)
        b.gqa_attention(p, hidden, attn, qk_norm=False, qkv_bias=bool(cfg.get("attention_bias", True)))
        b.add(f"{p}.self_attn.o_proj.bias", (hidden,))
        b.add(f"{p}.self_attn.sinks", (attn.num_heads,))  # one learned sink logit per head, split over TP
        b.linear(f"{p}.mlp.router", moe.num_experts, hidden, bias=True)  # ReplicatedLinear
        # FusedMoE with has_bias: fused gate_up [2I, H] and down [H, I] per expert, MXFP4, bf16 biases
        b.add(f"{p}.mlp.experts.E.gate_up_proj", (2 * inter, hidden), count=moe.num_experts)
        b.add(f"{p}.mlp.experts.E.gate_up_proj_bias", (2 * inter,), count=moe.num_experts)
        b.add(f"{p}.mlp.experts.E.down_proj", (hidden, inter), count=moe.num_experts)
        b.add(f"{p}.mlp.experts.E.down_proj_bias", (hidden,), count=moe.num_experts)
    return make_spec(cfg, policy, name, family="gpt_oss", tensors=b.build(), layer_kinds=_layer_kinds(cfg, num_layers),
                     moe_layers=[True] * num_layers, attention=attn, mla=None, linear_attention=None, mamba=None,
                     moe=moe, dense_intermediate_size=None, num_mtp_layers=0, mtp_layer_kind=None)
