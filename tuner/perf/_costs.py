"""Per-GPU constants of one (model, GPU, topology): bytes, FLOPs and message sizes before the batch is known.

Computed once per topology so that evaluating a concurrency level is a handful of multiplications.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.hardware import GpuSpec
from tuner.memory import kv_layout, shard_fraction
from tuner.models import LayerKind, ModelSpec, Sharding, TensorGroup, WeightFormat, WeightTensor
from tuner.perf._kernels import pass_kernels
from tuner.perf._wire import dispatch_bytes, expert_format
from tuner.topology import Topology

GB = 1e9
ACT_BYTES = 2  # bf16 activations on the wire (all-reduce, combine)
COMPUTE_DTYPES = ("bf16", "fp8", "fp4")
_NO_COMPUTE = (TensorGroup.EMBEDDING, TensorGroup.NORM)  # a gather and elementwise ops: no GEMM FLOPs


def local_fraction(t: WeightTensor, model: ModelSpec, topo: Topology) -> float:
    """Share of a tensor one GPU holds (and multiplies): the same split the memory model applies."""
    return shard_fraction(t.sharding, model, topo)


@dataclass(frozen=True, slots=True)
class FlopsByDtype:
    """FLOPs split by the tensor-core rate they run at."""

    bf16: float = 0.0
    fp8: float = 0.0
    fp4: float = 0.0
    attn: float = 0.0  # attention score/value FLOPs (BF16 tensor cores, flash-attention kernels)

    def add(self, dtype: str, flops: float) -> FlopsByDtype:
        if dtype == "bf16":
            return FlopsByDtype(self.bf16 + flops, self.fp8, self.fp4, self.attn)
        if dtype == "fp8":
            return FlopsByDtype(self.bf16, self.fp8 + flops, self.fp4, self.attn)
        if dtype == "fp4":
            return FlopsByDtype(self.bf16, self.fp8, self.fp4 + flops, self.attn)
        raise ValueError(f"unknown compute dtype {dtype!r}")

    def scaled(self, factor: float) -> FlopsByDtype:
        return FlopsByDtype(self.bf16 * factor, self.fp8 * factor, self.fp4 * factor, self.attn * factor)

    @property
    def total(self) -> float:
        return self.bf16 + self.fp8 + self.fp4 + self.attn

    def seconds(self, gpu: GpuSpec, efficiency: float, fp8_efficiency: float = 1.0,
                attention_efficiency: float | None = None) -> float:
        """Time at `efficiency` of each dtype's peak; FP8 GEMMs reach a further `fp8_efficiency` of that;
        attention runs at `attention_efficiency` of the BF16 peak (default: `efficiency`)."""
        total = 0.0
        if self.attn:
            total += self.attn / (gpu.tflops("bf16") * 1e12 * (attention_efficiency or efficiency))
        if self.bf16:
            total += self.bf16 / (gpu.tflops("bf16") * 1e12 * efficiency)
        if self.fp8:
            total += self.fp8 / (gpu.tflops("fp8") * 1e12 * efficiency * fp8_efficiency)
        if self.fp4:
            total += self.fp4 / (gpu.tflops("fp4") * 1e12 * efficiency)
        return total


@dataclass(frozen=True, slots=True)
class PassCosts:
    """One forward pass over a set of layers (the target model, or the MTP drafter) on one GPU."""

    num_layers: int
    num_moe_layers: int
    dense_bytes: float  # non-expert weights read once per pass (embedding gather excluded)
    expert_bytes: float  # every local expert of these layers; scaled by the activated fraction
    dense_flops_per_token: FlopsByDtype  # non-expert GEMMs, per token, this GPU (lm_head excluded)
    expert_flops_per_token: FlopsByDtype  # one token's top-k experts, all of them (divide by EP to place)
    attn_flops_per_token_ctx: float  # full-attention score+value FLOPs per query token per context token
    index_flops_per_token_ctx: float  # DeepSeek-V3.2 indexer logits (FP8, every context token), per query token
    window_attn_flops_per_token_ctx: float  # same over the sliding-window layers (context capped at the window)
    gdn_flops_per_token: float  # recurrent-state update FLOPs per token (linear attention layers)
    kv_bytes_per_token: float  # KV bytes per context token over the full-attention layers (this GPU)
    index_kv_bytes_per_token: float  # indexer K cache per context token (read for every context token)
    window_kv_bytes_per_token: float  # same, sliding-window layers (read up to the window)
    state_bytes: float  # GDN / mamba state per request over these layers (this GPU)
    num_kernels: int  # small kernels one forward pass launches (tuner/perf/_kernels.py)
    sparse_topk: int | None = None  # DSA: context tokens the attention reads per query (None = all)
    sparse_math_all_slots: bool = False  # DSA on a BF16 KV cache: the kernel's math runs over every top-k slot
    split_attention: bool = False  # a mixed batch's prefill and decode attention run as two kernels in turn


@dataclass(frozen=True, slots=True)
class InstanceCosts:
    """Everything a step needs for one topology, per GPU."""

    tp: int
    dp: int
    ep_size: int
    expert_parallel: bool
    hidden_size: int
    topk_fraction: float  # k / E (0 for a dense model)
    target: PassCosts
    draft: PassCosts | None  # the MTP layer(s), when the topology runs MTP
    lm_head_bytes: float
    lm_head_flops_per_token: FlopsByDtype
    sliding_window: int | None
    tp_link_bytes_s: float  # per-direction bandwidth of the TP group's link
    ep_link_bytes_s: float  # per-direction bandwidth of the EP group's link
    kv_link_bytes_s: float  # prefill -> decode transfer link
    a2a_remote_ranks: float  # expected EP ranks (other than its own) one token is sent to
    a2a_routed: bool = True  # False: gathered on every rank (allgather_reducescatter), volume blind to routing
    num_experts: int = 0  # routed experts (0 for a dense model)
    experts_per_token: int = 0
    redundant_experts: int = 0  # EPLB replicas spread over the EP ranks
    dbo: bool = False  # dual-batch overlap of the EP all-to-all with compute (vLLM --enable-dbo)
    dispatch_bytes: float = ACT_BYTES  # per hidden element sent to the experts (tuner/perf/_wire.py)
    all2all_backend: str = "allgather_reducescatter"  # vLLM --all2all-backend (tuner/topology.py)
    ep_domains: int = 1  # NVLink domains (hosts, on HGX) the EP group spans; 1 = it never crosses the network
    ep_ranks_per_domain: int = 1  # EP ranks inside one NVLink domain
    nvlink_bytes_s: float = 0.0  # per-direction NVLink bandwidth of one GPU
    scale_out_bytes_s: float = 0.0  # per-direction RDMA bandwidth of one GPU (its share of the host's NICs)
    a2a_sm_share: float = 0.0  # share of the GPU's SMs the all-to-all kernels hold while they run

    @property
    def all2all(self) -> bool:
        """vLLM dispatches tokens with all-to-all kernels only with EP over DP ranks (use_all2all_kernels);
        TEP (EP with DP 1) keeps the all-reduce path and only moves where the experts live."""
        return self.expert_parallel and self.dp > 1

    @property
    def experts_activated_all(self) -> bool:
        return self.topk_fraction >= 1.0

    def expert_active_fraction(self, tokens: float) -> float:
        """Expected fraction of a GPU's local experts that `tokens` routed tokens touch (uniform routing)."""
        if self.topk_fraction <= 0 or tokens <= 0:
            return 0.0
        return 1.0 - (1.0 - self.topk_fraction) ** tokens


@dataclass(frozen=True, slots=True)
class _TensorClass:
    """Tensors that shard, compute and count alike, summed (hundreds of per-layer tensors become a dozen)."""

    is_mtp: bool
    is_expert: bool
    gemm: bool  # multiplies every token (not a gather or an elementwise norm)
    sharding: Sharding
    compute_dtype: str
    nbytes: float
    num_params: float


_CLASSES: dict[int, tuple[ModelSpec, tuple[_TensorClass, ...]]] = {}


def _tensor_classes(model: ModelSpec) -> tuple[_TensorClass, ...]:
    """The model's layer tensors (embedding and lm_head excluded) grouped once per model."""
    hit = _CLASSES.get(id(model))
    if hit is not None and hit[0] is model:
        return hit[1]
    sums: dict[tuple[bool, bool, bool, Sharding, str], list[float]] = {}
    for t in model.tensors:
        if t.group in (TensorGroup.EMBEDDING, TensorGroup.LM_HEAD):
            continue
        gemm = t.group not in _NO_COMPUTE and len(t.shape) == 2
        acc = sums.setdefault((t.is_mtp, t.is_expert, gemm, t.sharding, t.fmt.compute_dtype), [0.0, 0.0])
        acc[0] += t.nbytes
        acc[1] += t.num_params
    classes = tuple(_TensorClass(*key, nbytes=b, num_params=n) for key, (b, n) in sums.items())
    _CLASSES[id(model)] = (model, classes)
    return classes


_HEADS: dict[int, tuple[ModelSpec, tuple[WeightTensor, ...]]] = {}


def _heads(model: ModelSpec) -> tuple[WeightTensor, ...]:
    """The embedding and lm_head tensors (found once per model: the tensor list holds every layer's)."""
    hit = _HEADS.get(id(model))
    if hit is None or hit[0] is not model:
        heads = tuple(t for t in model.tensors if t.group in (TensorGroup.EMBEDDING, TensorGroup.LM_HEAD))
        hit = _HEADS[id(model)] = (model, heads)
    return hit[1]


# FlashMLA's sparse prefill kernel needs the heads of a rank in a multiple of 64 on Hopper and 128 on Blackwell:
# vLLM pads q with empty heads (v1/attention/backends/mla/flashmla_sparse.py `_bf16_flash_mla_kernel`,
# `self.padding = 128 if is_device_capability_family(100) else 64`, v0.13.0).
_SPARSE_HEAD_MULTIPLE = {"hopper": 64, "blackwell": 128}


def _sparse_heads(num_heads_rank: float, architecture: str, kv_cache_is_fp8: bool) -> float:
    """Heads the sparse MLA kernel computes on one rank: the BF16-cache path pads them; the FP8 (fp8_ds_mla)
    path's decode kernel is not padded there."""
    multiple = _SPARSE_HEAD_MULTIPLE.get(architecture)
    if kv_cache_is_fp8 or not multiple:
        return num_heads_rank
    return multiple * math.ceil(num_heads_rank / multiple)


def expert_gemm_dtype(model: ModelSpec, topo: Topology, architecture: str, compute_dtype: str) -> str:
    """The peak a routed expert's GEMMs run at. On Hopper, block-FP8 experts sharded by tensor (no EP) run
    vLLM's Triton `fused_moe` (w8a8, 128x128 block scales): DeepGEMM's grouped GEMM is skipped for these narrow
    per-rank slices (`_valid_deep_gemm` in fused_moe/deep_gemm_moe.py requires N > 512; DeepSeek's 2048 columns
    over TP8 are 256) and FlashInfer's CUTLASS experts are vLLM's Hopper choice only with EP (oracle/fp8.py). That
    kernel dequantises a scale per K block in its inner loop and reaches the BF16 kernel's rate, not twice it:
    aiconfigurator's public H200 measurements of vLLM's Triton experts (systems/data/h200_sxm/moe/vllm/0.24.0)
    give 304 TFLOP/s for DeepSeek's FP8-block TP8 shape at 8,192 tokens and 290 for Qwen3-235B's BF16 TP8 shape."""
    if (compute_dtype == "fp8" and architecture == "hopper" and not topo.ep
            and expert_format(model) is WeightFormat.FP8_BLOCK):
        return "bf16"
    return compute_dtype


def _pass_costs(model: ModelSpec, topo: Topology, *, mtp: bool, kinds: tuple[LayerKind, ...],
                moe_flags: tuple[bool, ...], kv_bytes_per_layer: float, state_bytes_per_layer: float,
                index_bytes_per_layer: float = 0.0, architecture: str = "other") -> PassCosts:
    dense_bytes = expert_bytes = 0.0
    dense_flops = FlopsByDtype()
    expert_flops = FlopsByDtype()
    share = model.moe.experts_per_token / model.moe.num_experts if model.moe else 0.0
    for c in _tensor_classes(model):
        if c.is_mtp != mtp:
            continue
        frac = shard_fraction(c.sharding, model, topo)
        if c.is_expert:
            expert_bytes += c.nbytes * frac
            expert_flops = expert_flops.add(expert_gemm_dtype(model, topo, architecture, c.compute_dtype),
                                            2.0 * c.num_params * share)
            continue
        dense_bytes += c.nbytes * frac
        if c.gemm:
            dense_flops = dense_flops.add(c.compute_dtype, 2.0 * c.num_params * frac)
    full = sum(1 for k in kinds if k in (LayerKind.FULL_ATTENTION, LayerKind.MLA))
    window = sum(1 for k in kinds if k is LayerKind.SLIDING_WINDOW)
    recurrent = sum(1 for k in kinds if k in (LayerKind.LINEAR_ATTENTION, LayerKind.MAMBA))
    per_layer = 0.0  # QK^T and PV: 2 FLOPs per multiply-add each
    if model.attention:
        per_layer = 4.0 * model.attention.num_heads / topo.tp * model.attention.head_dim
    elif model.mla:
        m = model.mla
        per_layer = 2.0 * m.num_heads / topo.tp * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
    index = 0.0
    topk = None
    all_slots = False
    if model.mla and model.mla.index_head_dim and model.mla.index_n_heads and model.mla.index_topk:
        m = model.mla
        # DeepSeek Sparse Attention: FlashMLA's sparse kernels run MLA in its absorbed (MQA) form on the latent
        # cache (QK over kv_lora + rope dims, PV over kv_lora) for prefill and decode alike, over index_topk
        # tokens only; the indexer scores every context token (fp8_mqa_logits) with its heads replicated on
        # every TP rank (vLLM's Indexer is ReplicatedLinear). With a BF16 cache every token, prefill and decode,
        # goes through the sparse prefill kernel (`_forward_bf16_kv`), which pads the rank's heads and runs its
        # masked math over all index_topk slots even when the context is shorter (FlashMLA
        # csrc/sm90/prefill/sparse/fwd.cu: num_topk_blocks = topk / B_TOPK; invalid slots are masked, not skipped).
        heads = _sparse_heads(m.num_heads / topo.tp, architecture, topo.kv_cache_is_fp8)
        per_layer = 2.0 * heads * (2 * m.kv_lora_rank + m.qk_rope_head_dim)
        all_slots = not topo.kv_cache_is_fp8
        index = 2.0 * m.index_n_heads * m.index_head_dim
        topk = m.index_topk
    gdn = 0.0
    if model.linear_attention:
        la = model.linear_attention
        # decay, k^T v outer-product update and S q read-out: ~8 FLOPs per state element per token
        gdn = 8.0 * la.num_value_heads / topo.tp * la.key_head_dim * la.value_head_dim * recurrent
    return PassCosts(num_layers=len(kinds), num_moe_layers=sum(moe_flags), dense_bytes=dense_bytes,
                     expert_bytes=expert_bytes, dense_flops_per_token=dense_flops,
                     expert_flops_per_token=expert_flops, attn_flops_per_token_ctx=per_layer * full,
                     index_flops_per_token_ctx=index * full,
                     window_attn_flops_per_token_ctx=per_layer * window,
                     gdn_flops_per_token=gdn, kv_bytes_per_token=(kv_bytes_per_layer - index_bytes_per_layer) * full,
                     index_kv_bytes_per_token=index_bytes_per_layer * full,
                     window_kv_bytes_per_token=kv_bytes_per_layer * window,
                     state_bytes=state_bytes_per_layer * recurrent,
                     num_kernels=pass_kernels(model, kinds, moe_flags), sparse_topk=topk,
                     sparse_math_all_slots=all_slots,
                     split_attention=splits_mixed_attention(model, architecture, sparse=topk is not None))


def splits_mixed_attention(model: ModelSpec, architecture: str, *, sparse: bool = False) -> bool:
    """Whether vLLM's attention backend runs a mixed step's prefill tokens and decode tokens as two kernels, one
    after the other (their times add), rather than one kernel over the whole batch (the longer part hides the
    shorter). MLA always splits: `MLACommonImpl.forward` (v1/attention/backends/mla/common.py) runs
    `_forward_prefill` (the compute-friendly form) and then the decode kernel. Standard attention splits on
    Blackwell, where vLLM's default backend is FlashInfer (`_get_backend_priorities` in platforms/cuda.py puts
    FLASHINFER first for device capability 10.x), whose `FlashInferImpl.forward` (v1/attention/backends/
    flashinfer.py) runs the prefill wrapper (or TRT-LLM context kernel) over the prefill tokens and then the
    decode wrapper (or TRT-LLM decode kernel) over the decode tokens; elsewhere FLASH_ATTN comes first, whose
    forward is one `flash_attn_varlen_func` over every token of the step. DeepSeek's sparse attention runs
    every token through one FlashMLA sparse kernel."""
    if sparse:
        return False
    if model.mla is not None:
        return True
    return model.attention is not None and architecture == "blackwell"


def _link_bytes_s(gpu: GpuSpec, group_gpus: int) -> float:
    """Per-direction bandwidth of a group: NVLink inside the NVLink domain, the host network outside it."""
    if group_gpus <= gpu.nvlink_domain_gpus:
        return gpu.nvlink_bandwidth_gb_s / 2 * GB
    return gpu.inter_host_bandwidth_gb_s * GB


def ep_domains(gpu: GpuSpec, group_gpus: int) -> tuple[int, int]:
    """(NVLink domains, ranks per domain) an EP group of `group_gpus` spans: (1, group) inside one domain."""
    if group_gpus <= gpu.nvlink_domain_gpus:
        return 1, group_gpus
    return math.ceil(group_gpus / gpu.nvlink_domain_gpus), gpu.nvlink_domain_gpus


def instance_costs(model: ModelSpec, gpu: GpuSpec, topo: Topology) -> InstanceCosts:
    """Precompute the per-GPU constants of one topology (called once per topology, then cached)."""
    layout = kv_layout(model, topo, architecture=gpu.architecture)
    state_per_layer = layout.conv_state_bytes + layout.ssm_state_bytes
    attn_per_token = layout.attn_bytes_per_token if (model.attention or model.mla) else 0
    index_per_token = layout.indexer_bytes_per_token
    target = _pass_costs(model, topo, mtp=False, kinds=model.layer_kinds, moe_flags=model.moe_layers,
                         kv_bytes_per_layer=attn_per_token, state_bytes_per_layer=state_per_layer,
                         index_bytes_per_layer=index_per_token, architecture=gpu.architecture)
    draft = None
    if topo.mtp and model.num_mtp_layers and model.mtp_layer_kind is not None:
        kinds = (model.mtp_layer_kind,) * model.num_mtp_layers
        draft = _pass_costs(model, topo, mtp=True, kinds=kinds, moe_flags=(model.moe is not None,) * len(kinds),
                            kv_bytes_per_layer=attn_per_token, state_bytes_per_layer=state_per_layer,
                            index_bytes_per_layer=index_per_token, architecture=gpu.architecture)
    lm_bytes = 0.0
    lm_flops = FlopsByDtype()
    for t in _heads(model):
        if t.group is TensorGroup.LM_HEAD and not t.is_mtp:
            frac = local_fraction(t, model, topo)
            lm_bytes += t.nbytes * frac
            lm_flops = lm_flops.add(t.fmt.compute_dtype, 2.0 * t.num_params * frac)
    if model.tie_word_embeddings and not lm_bytes:
        emb = next(t for t in _heads(model) if t.group is TensorGroup.EMBEDDING)
        lm_bytes = emb.nbytes / topo.tp
        lm_flops = lm_flops.add(emb.fmt.compute_dtype, 2.0 * emb.num_params / topo.tp)
    ep = topo.ep_size
    k_share = model.moe.experts_per_token / model.moe.num_experts if model.moe else 0.0
    # A token's top-k experts land on a given other rank with probability 1 - (1 - 1/EP)^k.
    remote = (ep - 1) * (1.0 - (1.0 - 1.0 / ep) ** model.moe.experts_per_token) if model.moe and ep > 1 else 0.0
    if topo.ep and topo.dp > 1 and not topo.all2all_routed:
        # allgather_reducescatter (vLLM's default): every token is gathered on every other EP rank
        remote = float(ep - 1) if model.moe else 0.0
    domains, per_domain = ep_domains(gpu, topo.num_gpus)
    return InstanceCosts(
        all2all_backend=topo.all2all_backend, ep_domains=domains, ep_ranks_per_domain=per_domain,
        nvlink_bytes_s=gpu.nvlink_bandwidth_gb_s / 2 * GB, scale_out_bytes_s=gpu.inter_host_bandwidth_gb_s * GB,
        tp=topo.tp, dp=topo.dp, ep_size=ep, expert_parallel=topo.ep, hidden_size=model.hidden_size,
        topk_fraction=k_share, target=target, draft=draft, lm_head_bytes=lm_bytes,
        lm_head_flops_per_token=lm_flops, sliding_window=layout.sliding_window,
        tp_link_bytes_s=_link_bytes_s(gpu, topo.tp), ep_link_bytes_s=_link_bytes_s(gpu, topo.num_gpus),
        kv_link_bytes_s=_link_bytes_s(gpu, 2 * topo.num_gpus),  # a peer instance of the same size
        a2a_remote_ranks=remote, a2a_routed=topo.all2all_routed, num_experts=model.moe.num_experts if model.moe else 0,
        experts_per_token=model.moe.experts_per_token if model.moe else 0,
        redundant_experts=redundant_experts(topo), dbo=topo.dbo, a2a_sm_share=a2a_sm_share(topo.all2all_backend, gpu),
        dispatch_bytes=dispatch_bytes(expert_format(model), topo.all2all_backend, expert_parallel=topo.ep,
                                      architecture=gpu.architecture))


#: SMs vLLM gives DeepEP's normal (high-throughput) kernels: `DeepEPAll2AllManagerBase.num_sms = 20` ("This is
#: the DeepEP default", vllm/distributed/device_communicators/all2all.py). Its low-latency kernels hold none while
#: they wait (`DeepEPLLAll2AllManager.max_sms_used` returns 0: "DeepEP LL uses RDMA so no SMs are used").
DEEPEP_HT_SMS = 20


def a2a_sm_share(backend: str, gpu: GpuSpec) -> float:
    """Share of the GPU's SMs the EP all-to-all kernels hold while they run: compute overlapping them (dual-batch
    overlap) runs on the rest. 0 where the backend holds none, or the GPU's SM count is unknown."""
    if backend != "deepep_high_throughput" or not gpu.sm_count:
        return 0.0
    return min(1.0, DEEPEP_HT_SMS / gpu.sm_count)


def redundant_experts(topo: Topology) -> int:
    """EPLB redundant experts of a topology (they only exist with expert parallelism)."""
    return topo.num_redundant_experts if topo.ep else 0
