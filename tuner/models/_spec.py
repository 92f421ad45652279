"""The typed model spec every other module reads (never the raw config.json)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property

GIB = 1024**3


class LayerKind(StrEnum):
    FULL_ATTENTION = "full_attention"
    SLIDING_WINDOW = "sliding_window"
    LINEAR_ATTENTION = "linear_attention"  # Gated DeltaNet
    MAMBA = "mamba"
    MLA = "mla"

    @property
    def has_kv_cache(self) -> bool:
        """Token-indexed KV (grows with sequence length), as opposed to a fixed per-request state."""
        return self in (LayerKind.FULL_ATTENTION, LayerKind.SLIDING_WINDOW, LayerKind.MLA)


class WeightFormat(StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"
    FP8 = "fp8"  # per-tensor scale
    FP8_BLOCK = "fp8_block"  # one fp32 scale per 128x128 block
    NVFP4 = "nvfp4"  # 4-bit values + one fp8 scale per 16 values + fp32 global scales
    FP8_CHANNEL = "fp8_channel"  # compressed-tensors FP8, one fp32 scale per output row
    MXFP4 = "mxfp4"  # gpt-oss: 4-bit values (2 per byte) + one uint8 E8M0 scale per 32 values
    INT4 = "int4"  # compressed-tensors W4A16 pack-quantized, symmetric: packed int4 + bf16 scale per group
    INT4_ZP = "int4_zp"  # AWQ / GPTQ: packed int4 + fp16 scale + packed int4 zero point per group

    @property
    def compute_dtype(self) -> str:
        """The tensor-core rate this format runs at (for the performance model).

        Weight-only 4-bit formats (INT4, AWQ, MXFP4 on Hopper's Marlin/Triton kernels) dequantize to BF16.
        """
        return {"fp8": "fp8", "fp8_block": "fp8", "fp8_channel": "fp8", "nvfp4": "fp4"}.get(self.value, "bf16")

    def nbytes(self, shape: tuple[int, ...], block: tuple[int, int] = (128, 128), group: int = 16) -> int:
        """Exact on-GPU bytes of one tensor of this shape stored in this format, scales included."""
        n = 1
        for d in shape:
            n *= d
        match self:
            case WeightFormat.BF16 | WeightFormat.FP16:
                return 2 * n
            case WeightFormat.FP32:
                return 4 * n
            case WeightFormat.FP8:
                return n + 4
            case WeightFormat.FP8_BLOCK:
                rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (n, 1)
                scales = -(-rows // block[0]) * -(-cols // block[1])
                return n + 4 * scales
            case WeightFormat.NVFP4:
                # packed uint8 (2 values/byte) + fp8 block scale per `group` values + weight_scale_2 + input_scale
                return n // 2 + -(-n // group) + 4 + 4
            case WeightFormat.FP8_CHANNEL:
                return n + 4 * (shape[0] if len(shape) == 2 else 1)
            case WeightFormat.MXFP4:
                # quantization/mxfp4.py: uint8 weight [.., K // 2] + uint8 E8M0 scale [.., K // 32]
                return n // 2 + -(-n // 32)
            case WeightFormat.INT4:
                # compressed_tensors_wNa16: weight_packed int32 (8 per word), weight_scale bf16 per group,
                # weight_shape int64[2]
                return n // 2 + 2 * -(-n // group) + 16
            case WeightFormat.INT4_ZP:
                # awq.py / gptq.py: qweight int32, scales fp16 [K / group, N], qzeros int32 packed 8 per word
                return n // 2 + 2 * -(-n // group) + -(-n // group) // 2


class TensorGroup(StrEnum):
    """What a weight tensor is for: decides how it shards and whether it counts as expert weight."""

    EMBEDDING = "embedding"
    LM_HEAD = "lm_head"
    ATTENTION = "attention"
    LINEAR_ATTENTION = "linear_attention"
    DENSE_MLP = "dense_mlp"
    SHARED_EXPERT = "shared_expert"
    ROUTER = "router"
    EXPERT = "expert"
    NORM = "norm"


class Sharding(StrEnum):
    """How vLLM splits a tensor over the tensor-parallel group."""

    SPLIT = "split"  # column- or row-parallel: 1/TP per GPU
    REPLICATED = "replicated"  # every GPU holds it (norms, router, MLA's q_a/kv_a)
    KV_HEADS = "kv_heads"  # split by KV head, replicated once TP > num KV heads
    VOCAB = "vocab"  # vocab-parallel: padded to 64 rows, then 1/TP
    EXPERTS = "experts"  # over the whole EP (or MoE-TP) group: 1/(TP x DP)


@dataclass(frozen=True, slots=True)
class WeightTensor:
    """One checkpoint tensor (or `count` identical ones, e.g. the same projection of every expert)."""

    name: str
    shape: tuple[int, ...]
    group: TensorGroup
    sharding: Sharding
    fmt: WeightFormat
    nbytes: int  # all `count` copies
    num_params: int  # all `count` copies
    count: int = 1
    is_mtp: bool = False

    @property
    def is_expert(self) -> bool:
        return self.group is TensorGroup.EXPERT


@dataclass(frozen=True, slots=True)
class AttentionSpec:
    """Multi-head / grouped-query attention (full or sliding window)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None = None
    output_gate: bool = False


@dataclass(frozen=True, slots=True)
class MLASpec:
    """DeepSeek multi-head latent attention: the cache holds one compressed latent per token."""

    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    index_head_dim: int | None = None  # DeepSeek-V3.2 sparse-attention indexer (its own K cache per layer)
    index_n_heads: int | None = None
    index_topk: int | None = None  # context tokens each query's sparse attention reads (DSA top-k)

    @property
    def cache_dim(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True)
class LinearAttentionSpec:
    """Gated DeltaNet: a fixed-size recurrent state per request and layer (conv + SSM)."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int
    conv_state_dtype: str = "bfloat16"
    ssm_state_dtype: str = "bfloat16"
    # vLLM's mamba_type for this mixer (MambaAttentionBackendEnum, lower case): NIXL's conv-state transfer
    # supports only mamba1, mamba2 and gdn_attn (kv_connector/v1/ssm_conv_transfer_utils.py)
    kind: str = "gdn_attn"


@dataclass(frozen=True, slots=True)
class MambaSpec:
    """Mamba-2 mixer state (for hybrid families added later; the memory model already sizes it)."""

    num_heads: int
    head_dim: int
    state_size: int
    num_groups: int
    conv_kernel: int
    intermediate_size: int
    conv_state_dtype: str = "bfloat16"
    ssm_state_dtype: str = "bfloat16"
    kind: str = "mamba2"  # vLLM's mamba_type (see LinearAttentionSpec.kind)


@dataclass(frozen=True, slots=True)
class MoESpec:
    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_intermediate_size: int = 0  # all shared experts together
    num_shared_experts: int = 0


@dataclass(frozen=True)
class ModelSpec:
    """Everything topotune needs to know about a model, read from config.json (and safetensors headers)."""

    name: str
    model_type: str
    architecture: str
    family: str
    dtype: str
    hidden_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    layer_kinds: tuple[LayerKind, ...]
    moe_layers: tuple[bool, ...]
    attention: AttentionSpec | None
    mla: MLASpec | None
    linear_attention: LinearAttentionSpec | None
    mamba: MambaSpec | None
    moe: MoESpec | None
    dense_intermediate_size: int | None
    num_mtp_layers: int
    mtp_layer_kind: LayerKind | None
    quantization: str
    tensors: tuple[WeightTensor, ...] = field(repr=False)
    weights_source: str = "config.json"  # or "safetensors headers"

    # -- layer structure -------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return len(self.layer_kinds)

    def count_layers(self, kind: LayerKind) -> int:
        return sum(1 for k in self.layer_kinds if k is kind)

    @property
    def is_hybrid(self) -> bool:
        return any(not k.has_kv_cache for k in self.layer_kinds)

    @property
    def state_kind(self) -> str | None:
        """vLLM's mamba_type of the recurrent layers (gdn_attn, mamba2, ...), None without any: the PD pairing
        check reads it (only some families transfer over NIXL)."""
        if self.linear_attention is not None:
            return self.linear_attention.kind
        return self.mamba.kind if self.mamba is not None else None

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layers)

    # -- weights ---------------------------------------------------------------------------------
    def _sum(self, *, expert: bool | None = None, mtp: bool = False, attr: str = "nbytes") -> int:
        total = 0
        for t in self.tensors:
            if t.is_mtp != mtp:
                continue
            if expert is not None and t.is_expert != expert:
                continue
            total += getattr(t, attr)
        return total

    @cached_property
    def expert_bytes(self) -> int:
        return self._sum(expert=True)

    @cached_property
    def non_expert_bytes(self) -> int:
        return self._sum(expert=False)

    @cached_property
    def mtp_bytes(self) -> int:
        """Weights of the MTP layers, loaded only when MTP speculative decoding is on."""
        return self._sum(mtp=True)

    @cached_property
    def mtp_expert_bytes(self) -> int:
        return self._sum(expert=True, mtp=True)

    @cached_property
    def expert_params(self) -> int:
        return self._sum(expert=True, attr="num_params")

    @cached_property
    def non_expert_params(self) -> int:
        return self._sum(expert=False, attr="num_params")

    @property
    def total_params(self) -> int:
        return self.expert_params + self.non_expert_params

    @cached_property
    def active_params(self) -> int:
        """Parameters one token touches: all non-expert weights plus top-k experts per MoE layer."""
        if self.moe is None:
            return self.total_params
        share = self.moe.experts_per_token / self.moe.num_experts
        return self.non_expert_params + round(self.expert_params * share)

    @cached_property
    def bytes_by_sharding(self) -> dict[tuple[Sharding, bool], int]:
        """(sharding, is_mtp) -> bytes: all the memory model needs to place weights on GPUs quickly."""
        out: dict[tuple[Sharding, bool], int] = {}
        for t in self.tensors:
            key = (t.sharding, t.is_mtp)
            out[key] = out.get(key, 0) + t.nbytes
        return out

    def bytes_by_format(self) -> dict[tuple[str, str], int]:
        """(group, format) -> bytes, MTP excluded: which tensors are stored in which format."""
        out: dict[tuple[str, str], int] = {}
        for t in self.tensors:
            if not t.is_mtp:
                key = (t.group.value, t.fmt.value)
                out[key] = out.get(key, 0) + t.nbytes
        return out

    def summary(self) -> dict[str, object]:
        return {
            "name": self.name,
            "model_type": self.model_type,
            "family": self.family,
            "layers": self.num_layers,
            "layer_kinds": {k.value: self.count_layers(k) for k in LayerKind if self.count_layers(k)},
            "moe_layers": self.num_moe_layers,
            "experts": self.moe.num_experts if self.moe else 0,
            "experts_per_token": self.moe.experts_per_token if self.moe else 0,
            "mtp_layers": self.num_mtp_layers,
            "quantization": self.quantization,
            "total_params_b": round(self.total_params / 1e9, 2),
            "active_params_b": round(self.active_params / 1e9, 2),
            "non_expert_weights_gib": round(self.non_expert_bytes / GIB, 2),
            "expert_weights_gib": round(self.expert_bytes / GIB, 2),
            "mtp_weights_gib": round(self.mtp_bytes / GIB, 2),
            "weights_source": self.weights_source,
        }
