"""The weight-tensor inventory: one classifier for generated names and safetensors headers alike."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from tuner.models._quant import QuantPolicy
from tuner.models._spec import (
    AttentionSpec,
    LinearAttentionSpec,
    MLASpec,
    MoESpec,
    Sharding,
    TensorGroup,
    WeightFormat,
    WeightTensor,
)

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_SUFFIXES = (".weight", ".bias", ".weight_scale_inv", ".weight_scale_2", ".weight_scale", ".input_scale",
             ".e_score_correction_bias", ".weight_packed", ".weight_shape", ".weight_global_scale",
             ".input_global_scale", ".weight_zero_point", ".qweight", ".qzeros", ".scales", ".g_idx",
             "_blocks", "_scales", "_bias")


def module_name(tensor_name: str) -> str:
    for suffix in _SUFFIXES:
        if tensor_name.endswith(suffix):
            return tensor_name[: -len(suffix)]
    return tensor_name


def classify(name: str) -> tuple[TensorGroup, Sharding]:
    """Role and TP sharding of a checkpoint tensor, from its Hugging Face name (vLLM's layer classes)."""
    module = module_name(name)
    leaf = module.rsplit(".", 1)[-1]
    if ".experts." in module or module.endswith(".experts"):
        return TensorGroup.EXPERT, Sharding.EXPERTS
    if leaf in ("shared_expert_gate", "gate", "router") or name.endswith("e_score_correction_bias"):
        return TensorGroup.ROUTER, Sharding.REPLICATED
    if ".shared_expert." in module or ".shared_experts." in module:
        return TensorGroup.SHARED_EXPERT, Sharding.SPLIT
    if "embed_tokens" in module:
        return TensorGroup.EMBEDDING, Sharding.VOCAB
    if leaf == "lm_head" or module.endswith("shared_head.head"):
        return TensorGroup.LM_HEAD, Sharding.VOCAB
    if "norm" in leaf and "linear_attn" not in module:
        return TensorGroup.NORM, Sharding.REPLICATED
    if ".indexer." in module:
        return TensorGroup.ATTENTION, Sharding.REPLICATED  # DeepSeek-V3.2 Indexer: ReplicatedLinear layers
    if ".self_attn." in module:
        if leaf in ("k_proj", "v_proj"):
            return TensorGroup.ATTENTION, Sharding.KV_HEADS
        if leaf in ("q_a_proj", "kv_a_proj_with_mqa"):
            return TensorGroup.ATTENTION, Sharding.REPLICATED  # vLLM: fused_qkv_a_proj, disable_tp=True
        return TensorGroup.ATTENTION, Sharding.SPLIT
    if ".linear_attn." in module:
        if leaf == "norm":
            return TensorGroup.LINEAR_ATTENTION, Sharding.REPLICATED
        return TensorGroup.LINEAR_ATTENTION, Sharding.SPLIT
    if leaf == "eh_proj":
        return TensorGroup.DENSE_MLP, Sharding.REPLICATED  # DeepSeek MTP: plain nn.Linear
    return TensorGroup.DENSE_MLP, Sharding.SPLIT


def layer_index(name: str) -> int | None:
    match = _LAYER_RE.search(name)
    return int(match.group(1)) if match else None


@dataclass
class InventoryBuilder:
    """Collects tensors with their format and exact bytes under a quantization policy."""

    policy: QuantPolicy
    tensors: list[WeightTensor] = field(default_factory=list)

    def add(self, name: str, shape: tuple[int, ...], *, count: int = 1, mtp: bool = False) -> None:
        group, sharding = classify(name)
        fmt = self.policy.format_for(module_name(name), group, shape)
        n = 1
        for d in shape:
            n *= d
        one = fmt.nbytes(shape, self.policy.block, self.policy.group_size)
        self.tensors.append(WeightTensor(name=name, shape=shape, group=group, sharding=sharding, fmt=fmt,
                                         nbytes=one * count, num_params=n * count, count=count, is_mtp=mtp))

    # -- building blocks shared by the families (Hugging Face tensor names) ------------------------
    def norm(self, name: str, dim: int, *, mtp: bool = False) -> None:
        self.add(f"{name}.weight", (dim,), mtp=mtp)

    def linear(self, name: str, out_dim: int, in_dim: int, *, bias: bool = False, count: int = 1,
               mtp: bool = False) -> None:
        self.add(f"{name}.weight", (out_dim, in_dim), count=count, mtp=mtp)
        if bias:
            self.add(f"{name}.bias", (out_dim,), count=count, mtp=mtp)

    def gqa_attention(self, prefix: str, hidden: int, attn: AttentionSpec, *, qk_norm: bool,
                      qkv_bias: bool = False, mtp: bool = False) -> None:
        q_out = attn.num_heads * attn.head_dim * (2 if attn.output_gate else 1)
        kv_out = attn.num_kv_heads * attn.head_dim
        self.linear(f"{prefix}.self_attn.q_proj", q_out, hidden, bias=qkv_bias, mtp=mtp)
        self.linear(f"{prefix}.self_attn.k_proj", kv_out, hidden, bias=qkv_bias, mtp=mtp)
        self.linear(f"{prefix}.self_attn.v_proj", kv_out, hidden, bias=qkv_bias, mtp=mtp)
        self.linear(f"{prefix}.self_attn.o_proj", hidden, attn.num_heads * attn.head_dim, mtp=mtp)
        if qk_norm:
            self.norm(f"{prefix}.self_attn.q_norm", attn.head_dim, mtp=mtp)
            self.norm(f"{prefix}.self_attn.k_norm", attn.head_dim, mtp=mtp)

    def mla_attention(self, prefix: str, hidden: int, mla: MLASpec, *, mtp: bool = False) -> None:
        qk_head = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        if mla.q_lora_rank:
            self.linear(f"{prefix}.self_attn.q_a_proj", mla.q_lora_rank, hidden, mtp=mtp)
            self.norm(f"{prefix}.self_attn.q_a_layernorm", mla.q_lora_rank, mtp=mtp)
            self.linear(f"{prefix}.self_attn.q_b_proj", mla.num_heads * qk_head, mla.q_lora_rank, mtp=mtp)
        else:
            self.linear(f"{prefix}.self_attn.q_proj", mla.num_heads * qk_head, hidden, mtp=mtp)
        self.linear(f"{prefix}.self_attn.kv_a_proj_with_mqa", mla.cache_dim, hidden, mtp=mtp)
        self.norm(f"{prefix}.self_attn.kv_a_layernorm", mla.kv_lora_rank, mtp=mtp)
        self.linear(f"{prefix}.self_attn.kv_b_proj", mla.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim),
                    mla.kv_lora_rank, mtp=mtp)
        self.linear(f"{prefix}.self_attn.o_proj", hidden, mla.num_heads * mla.v_head_dim, mtp=mtp)

    def gated_delta_net(self, prefix: str, hidden: int, la: LinearAttentionSpec) -> None:
        key_dim = la.num_key_heads * la.key_head_dim
        value_dim = la.num_value_heads * la.value_head_dim
        p = f"{prefix}.linear_attn"
        self.linear(f"{p}.in_proj_qkvz", 2 * key_dim + 2 * value_dim, hidden)
        self.linear(f"{p}.in_proj_ba", 2 * la.num_value_heads, hidden)
        self.add(f"{p}.conv1d.weight", (2 * key_dim + value_dim, 1, la.conv_kernel))
        self.add(f"{p}.dt_bias", (la.num_value_heads,))
        self.add(f"{p}.A_log", (la.num_value_heads,))
        self.norm(f"{p}.norm", la.value_head_dim)
        self.linear(f"{p}.out_proj", hidden, value_dim)

    def mlp(self, prefix: str, hidden: int, intermediate: int, *, names: tuple[str, str, str] = (
            "gate_proj", "up_proj", "down_proj"), count: int = 1, mtp: bool = False) -> None:
        gate, up, down = names
        self.linear(f"{prefix}.{gate}", intermediate, hidden, count=count, mtp=mtp)
        self.linear(f"{prefix}.{up}", intermediate, hidden, count=count, mtp=mtp)
        self.linear(f"{prefix}.{down}", hidden, intermediate, count=count, mtp=mtp)

    def moe(self, prefix: str, hidden: int, moe: MoESpec, *, shared_name: str = "shared_expert",
            shared_gate: bool = False, score_bias: bool = False, expert_names: tuple[str, str, str] = (
                "gate_proj", "up_proj", "down_proj"), mtp: bool = False) -> None:
        self.linear(f"{prefix}.gate", moe.num_experts, hidden, mtp=mtp)
        if score_bias:
            self.add(f"{prefix}.gate.e_score_correction_bias", (moe.num_experts,), mtp=mtp)
        self.mlp(f"{prefix}.experts.E", hidden, moe.expert_intermediate_size, names=expert_names,
                 count=moe.num_experts, mtp=mtp)
        if moe.shared_intermediate_size:
            self.mlp(f"{prefix}.{shared_name}", hidden, moe.shared_intermediate_size, mtp=mtp)
            if shared_gate:
                self.linear(f"{prefix}.shared_expert_gate", 1, hidden, mtp=mtp)

    def nextn_layers(self, first: int, count: int, hidden: int, decoder_layer: Callable[[str], None]) -> None:
        """DeepSeek-style MTP layers (vLLM deepseek_mtp.py DeepSeekMultiTokenPredictorLayer, which glm4_moe_mtp.py
        copies): `count` of them after the target's `first` layers, model.layers.{first + j}, each its own enorm,
        hnorm, eh_proj (2 x hidden -> hidden) and shared_head.norm, then one decoder layer (`decoder_layer(prefix)`,
        the family's, in MTP mode); their embed_tokens / shared_head.head are the target model's, shared by vLLM."""
        for j in range(count):
            prefix = f"model.layers.{first + j}"
            self.norm(f"{prefix}.enorm", hidden, mtp=True)
            self.norm(f"{prefix}.hnorm", hidden, mtp=True)
            self.linear(f"{prefix}.eh_proj", hidden, 2 * hidden, mtp=True)
            self.norm(f"{prefix}.shared_head.norm", hidden, mtp=True)
            decoder_layer(prefix)

    def embeddings(self, vocab: int, hidden: int, tied: bool) -> None:
        self.add("model.embed_tokens.weight", (vocab, hidden))
        self.norm("model.norm", hidden)
        if not tied:
            self.add("lm_head.weight", (vocab, hidden))

    def build(self) -> tuple[WeightTensor, ...]:
        return tuple(self.tensors)


def fmt_for_dtype(dtype: str) -> WeightFormat:
    return {"F16": WeightFormat.FP16, "F32": WeightFormat.FP32, "F8_E4M3": WeightFormat.FP8,
            "U8": WeightFormat.NVFP4, "I8": WeightFormat.NVFP4}.get(dtype, WeightFormat.BF16)
