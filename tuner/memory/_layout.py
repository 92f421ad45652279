"""KV-cache layout as vLLM builds it: per-token and per-state page sizes, hybrid block alignment, groups.

Sources: vllm/platforms/interface.py (_align_hybrid_block_size), vllm/v1/kv_cache_interface.py (page sizes,
max_memory_usage_bytes), vllm/v1/core/kv_cache_utils.py (grouping, num_blocks, max concurrency),
vllm/model_executor/layers/mamba/mamba_utils.py (GDN state shapes).
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.models import LayerKind, ModelSpec
from tuner.topology import Topology

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "fp8": 1, "fp8_e4m3": 1,
               "fp8_e5m2": 1, "auto": 2}
DEFAULT_BLOCK_SIZE = 16  # vllm CacheConfig.DEFAULT_BLOCK_SIZE; FlashAttention / FlashInfer kernels accept it


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def kernel_block_size(model: ModelSpec, architecture: str) -> int:
    """The attention backend's preferred block size (get_preferred_block_size)."""
    if architecture == "cpu":
        return 128  # vLLM's CPU attention backend
    if model.mla is not None and model.mla.index_head_dim:
        return 64  # FlashMLASparseBackend.get_supported_kernel_block_sizes() == [64] (DeepSeek-V3.2)
    if model.mla is not None:
        return 128 if architecture == "blackwell" else 64  # CUTLASS MLA on SM100, FlashMLA on SM90
    return DEFAULT_BLOCK_SIZE


@dataclass(frozen=True)
class KVLayout:
    """How one worker (GPU) of one DP rank lays out its KV cache."""

    block_size: int  # tokens per attention block
    attn_bytes_per_token: int  # one token, one attention layer, this GPU
    state_bytes: int  # one request, one GDN/mamba layer, this GPU, before padding (0 if none)
    conv_state_bytes: int
    ssm_state_bytes: int
    page_size_bytes: int  # one block of one layer (state pages padded up to this)
    layers_by_kind: dict[LayerKind, int]  # layers holding cache on this GPU (MTP layers included)
    group_size: int  # layers sharing one block pool tensor
    num_groups_by_kind: dict[LayerKind, int]
    sliding_window: int | None
    num_spec_tokens: int
    block_size_was_raised: bool
    kv_cache_dtype: str = "auto"  # as vLLM resolved it (fp8 on sparse MLA becomes fp8_ds_mla)
    indexer_bytes_per_token: int = 0  # DeepSeek-V3.2 indexer K cache, included in attn_bytes_per_token

    @property
    def num_groups(self) -> int:
        return sum(self.num_groups_by_kind.values())

    @property
    def state_padding_pct(self) -> float:
        if not self.state_bytes:
            return 0.0
        return 100.0 * (self.page_size_bytes - self.state_bytes) / self.state_bytes

    def bytes_per_block_all_layers(self) -> int:
        """Memory one block id costs: a page in each of group_size shared tensors."""
        return self.page_size_bytes * self.group_size

    def request_bytes(self, kind: LayerKind, tokens: int, max_num_batched_tokens: int) -> int:
        """max_memory_usage_bytes of one layer of `kind` for a request of `tokens` tokens."""
        page = self.page_size_bytes
        if kind in (LayerKind.FULL_ATTENTION, LayerKind.MLA):
            return cdiv(tokens, self.block_size) * page
        if kind is LayerKind.SLIDING_WINDOW:
            window = self.sliding_window or tokens
            return (cdiv(min(window - 1 + max_num_batched_tokens, tokens), self.block_size) + 1) * page
        return (1 + self.num_spec_tokens) * page  # mamba_cache_mode "none": 1 + speculative blocks

    def resident_blocks_per_request(self, tokens: int) -> int:
        """Blocks a running request holds between steps at `tokens` of context. A sliding-window layer keeps only
        its window: vLLM's SlidingWindowManager.remove_skipped_blocks frees every block before it as the request
        advances (vllm/v1/core/single_type_kv_cache_manager.py), so admission sees those blocks free.
        `blocks_per_request` is the worst case vLLM reports (a whole token budget in flight per request)."""
        total = 0
        for kind, n in self.num_groups_by_kind.items():
            if kind is LayerKind.SLIDING_WINDOW and self.sliding_window:
                total += n * (cdiv(min(self.sliding_window - 1, tokens), self.block_size) + 1) * self.page_size_bytes
            else:
                total += n * self.request_bytes(kind, tokens, 0)
        return cdiv(total, self.page_size_bytes)

    def chunk_blocks_in_flight(self, chunk_tokens: int) -> int:
        """Sliding-window blocks a prompt chunk being prefilled holds until its step ends (freed after it)."""
        groups = self.num_groups_by_kind.get(LayerKind.SLIDING_WINDOW, 0) if self.sliding_window else 0
        return groups * cdiv(chunk_tokens, self.block_size)

    def blocks_per_request(self, tokens: int, max_num_batched_tokens: int) -> int:
        """cdiv(sum over groups of max_memory_usage_bytes, page) as in get_max_concurrency_for_kv_cache_config."""
        total = sum(n * self.request_bytes(kind, tokens, max_num_batched_tokens)
                    for kind, n in self.num_groups_by_kind.items())
        return cdiv(total, self.page_size_bytes)


def gdn_state_bytes(model: ModelSpec, tp: int, num_spec: int) -> tuple[int, int]:
    """(conv, ssm) bytes of one request's Gated DeltaNet state on one GPU."""
    la = model.linear_attention
    if la is None:
        return 0, 0
    conv_dim = 2 * la.num_key_heads * la.key_head_dim + la.num_value_heads * la.value_head_dim
    conv = (la.conv_kernel - 1 + num_spec) * (conv_dim // tp) * DTYPE_BYTES[la.conv_state_dtype]
    ssm = (la.num_value_heads // tp) * la.value_head_dim * la.key_head_dim * DTYPE_BYTES[la.ssm_state_dtype]
    return conv, ssm


def mamba2_state_bytes(model: ModelSpec, tp: int, num_spec: int) -> tuple[int, int]:
    m = model.mamba
    if m is None:
        return 0, 0
    groups = m.num_groups + (0 if m.num_groups % tp == 0 else tp - m.num_groups)
    conv = (m.conv_kernel - 1 + num_spec) * ((m.intermediate_size + 2 * groups * m.state_size) // tp)
    ssm = (m.num_heads // tp) * m.head_dim * m.state_size
    return conv * DTYPE_BYTES[m.conv_state_dtype], ssm * DTYPE_BYTES[m.ssm_state_dtype]


INDEXER_QUANT_BLOCK = 128  # DeepSeek-V3.2 Indexer.quant_block_size: one fp32 scale per 128 fp8 values
DS_MLA_FP8_BYTES = 656  # fp8_ds_mla: 512 fp8 NoPE + 4 fp32 scales + 64 bf16 RoPE (flashmla_sparse.py)


def resolve_kv_cache_dtype(model: ModelSpec, kv_cache_dtype: str) -> str:
    """The cache dtype vLLM ends up with: sparse MLA turns any fp8 into fp8_ds_mla (FlashMLASparseBackend)."""
    if model.mla is not None and model.mla.index_head_dim and kv_cache_dtype.startswith("fp8"):
        return "fp8_ds_mla"
    return kv_cache_dtype


def kv_element_bytes(model: ModelSpec, kv_cache_dtype: str) -> int:
    """Bytes of one cached K/V element (get_kv_cache_torch_dtype: "auto" is the model dtype)."""
    if kv_cache_dtype == "auto":
        return DTYPE_BYTES[model.dtype]
    if kv_cache_dtype.startswith(("fp8", "int8")):
        return 1
    return DTYPE_BYTES[kv_cache_dtype]


def indexer_bytes_per_token(model: ModelSpec) -> int:
    """DeepSeek-V3.2's indexer K cache: head_dim fp8 values + one fp32 scale per 128, stored as uint8 whatever
    --kv-cache-dtype says (deepseek_v2.py Indexer: DeepseekV32IndexerCache(head_dim + head_dim // 128 * 4))."""
    if model.mla is None or not model.mla.index_head_dim:
        return 0
    head = model.mla.index_head_dim
    return head + head // INDEXER_QUANT_BLOCK * 4


def attention_bytes_per_token(model: ModelSpec, tp: int, kv_cache_dtype: str = "auto") -> int:
    """One token, one attention layer, one GPU: vllm/v1/kv_cache_interface.py page sizes divided by block_size."""
    dtype = resolve_kv_cache_dtype(model, kv_cache_dtype)
    if model.mla is not None:
        # MLAAttentionSpec: one latent (kv_lora_rank + rope), replicated on every TP rank, no K/V pair
        latent = DS_MLA_FP8_BYTES if dtype == "fp8_ds_mla" else model.mla.cache_dim * kv_element_bytes(model, dtype)
        return latent + indexer_bytes_per_token(model)
    attn = model.attention
    assert attn is not None
    kv_heads = max(1, attn.num_kv_heads // tp)
    if dtype == "nvfp4":  # FullAttentionSpec: packed fp4 data + fp8 block scales per head, K and V
        return kv_heads * 2 * (attn.head_dim // 2 + attn.head_dim // 16)
    per_token = 2 * kv_heads * attn.head_dim * kv_element_bytes(model, dtype)
    if dtype.endswith("_per_token_head"):  # AttentionSpec.page_size_bytes: fp32 K and V scale per token and head
        per_token += 2 * kv_heads * 4
    return per_token


def group_layers(layers_by_kind: dict[LayerKind, int]) -> tuple[int, dict[LayerKind, int]]:
    """_get_kv_cache_groups_uniform_page_size: group size, then groups per layer kind."""
    counts = [n for n in layers_by_kind.values() if n]
    if len(counts) == 1:
        kind = next(k for k, n in layers_by_kind.items() if n)
        return counts[0], {kind: 1}
    group_size = min(counts)
    if max(counts) < 1.5 * min(counts):
        group_size = max(counts)
    return group_size, {k: cdiv(n, group_size) for k, n in layers_by_kind.items() if n}


def kv_layout(model: ModelSpec, topo: Topology, *, architecture: str, block_size: int | None = None,
              kv_cache_dtype: str | None = None) -> KVLayout:
    """kv_cache_dtype defaults to the topology's (--kv-cache-dtype)."""
    tp = topo.tp
    num_spec = topo.mtp
    dtype = resolve_kv_cache_dtype(model, kv_cache_dtype or topo.kv_cache_dtype)
    attn_1tok = attention_bytes_per_token(model, tp, dtype)

    layers: dict[LayerKind, int] = {}
    for kind in model.layer_kinds:
        layers[kind] = layers.get(kind, 0) + 1
    if num_spec and model.mtp_layer_kind is not None:
        # The MTP drafter's own attention layers get KV cache specs too (same spec: merged into one type).
        layers[model.mtp_layer_kind] = layers.get(model.mtp_layer_kind, 0) + model.num_mtp_layers

    conv, ssm = gdn_state_bytes(model, tp, num_spec)
    if not conv and model.mamba is not None:
        conv, ssm = mamba2_state_bytes(model, tp, num_spec)
    state = conv + ssm

    size = block_size or kernel_block_size(model, architecture)
    raised = False
    if state:
        align = max(kernel_block_size(model, architecture), size)
        attn_block = align * cdiv(state, align * attn_1tok)
        if size < attn_block:
            size, raised = attn_block, True
    page = size * attn_1tok
    group_size, groups = group_layers(layers)
    window = model.attention.sliding_window if model.attention else None
    return KVLayout(block_size=size, attn_bytes_per_token=attn_1tok, state_bytes=state, conv_state_bytes=conv,
                    ssm_state_bytes=ssm, page_size_bytes=page, layers_by_kind=layers, group_size=group_size,
                    num_groups_by_kind=groups, sliding_window=window, num_spec_tokens=num_spec,
                    block_size_was_raised=raised, kv_cache_dtype=dtype,
                    indexer_bytes_per_token=indexer_bytes_per_token(model))
