"""The memory model: from model, GPU and topology to a per-GPU breakdown that shows its arithmetic."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from tuner.errors import ConfigError
from tuner.hardware import GpuSpec
from tuner.memory._estimates import activation_peak_bytes, cuda_graph_bytes, cudagraph_capture_sizes
from tuner.memory._layout import KVLayout, kv_layout
from tuner.memory._weights import (
    Mxfp4Backend,
    WeightsPerGpu,
    local_experts,
    mxfp4_backend,
    mxfp4_padding_factor,
    weights_per_gpu,
)
from tuner.models import ModelSpec
from tuner.topology import Topology
from tuner.workload import Workload, served_context_tokens

GIB = 1024**3
MIB = 1024**2


@dataclass(frozen=True)
class MemoryInputs:
    """The workload and any measured figures that replace the estimates."""

    isl: int = 8192
    osl: int = 1024
    max_model_len: int | None = None  # defaults to isl + osl plus the plan's headroom (served_context_tokens)
    kv_cache_memory_bytes: int | None = None  # vLLM's --kv-cache-memory-bytes: the KV budget, exactly
    non_torch_gib: float | None = None  # defaults to the GPU's catalog figure
    activation_gib: float | None = None  # measured peak activations; default: estimate
    cuda_graph_gib: float | None = None  # measured CUDA-graph reserve; default: estimate
    block_size: int | None = None  # --block-size; default: the attention backend's
    kv_cache_dtype: str | None = None  # default: the topology's --kv-cache-dtype
    mxfp4_backend: Mxfp4Backend | None = None  # MXFP4 MoE kernels (their padding); default: vLLM's for the GPU

    def __post_init__(self) -> None:
        for name in ("isl", "max_model_len", "block_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"must be positive, got {value}", field=f"--{name.replace('_', '-')}",
                                  fix="give a positive integer")
        if self.osl < 0:
            raise ConfigError(f"must not be negative, got {self.osl}", field="--osl", fix="give 0 or more")
        if self.max_model_len is not None and self.max_model_len < self.tokens_per_request:
            raise ConfigError(f"max-model-len {self.max_model_len:,} is shorter than isl + osl = "
                              f"{self.tokens_per_request:,}", field="--max-model-len",
                              fix="raise --max-model-len or shorten --isl/--osl")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes <= 0:
            raise ConfigError("must be positive", field="--kv-cache-memory-bytes", fix="give e.g. 40G")
        if self.mxfp4_backend is not None:
            try:
                object.__setattr__(self, "mxfp4_backend", Mxfp4Backend(self.mxfp4_backend))
            except ValueError:
                raise ConfigError(f"unknown MXFP4 MoE backend {self.mxfp4_backend!r}", field="--mxfp4-backend",
                                  fix="one of " + ", ".join(b.value for b in Mxfp4Backend)) from None

    @property
    def tokens_per_request(self) -> int:
        return self.isl + self.osl

    @classmethod
    def for_workload(cls, workload: Workload, **measured: object) -> MemoryInputs:
        """The typical request for the KV arithmetic, and a served context that holds the longest one."""
        return cls(isl=workload.isl, osl=workload.osl, max_model_len=workload.max_model_len, **measured)


@dataclass(frozen=True)
class Line:
    label: str
    gib: float | None
    how: str


@dataclass(frozen=True)
class MemoryBreakdown:
    """Per GPU (one worker of one DP rank) unless a name says otherwise."""

    model: str
    gpu: str
    topology: str
    num_gpus: int
    total_gib: float
    gpu_memory_utilization: float
    requested_gib: float
    weights: WeightsPerGpu
    non_torch_gib: float
    activation_gib: float
    cuda_graph_gib: float
    kv_budget_bytes: int
    kv_budget_overridden: bool
    layout: KVLayout
    num_gpu_blocks: int
    tokens_per_request: int
    max_model_len: int
    blocks_per_request: int
    blocks_per_request_max_model_len: int
    dp: int
    max_num_seqs: int
    lines: list[Line] = field(default_factory=list)

    # -- derived figures ---------------------------------------------------------------------------
    @property
    def weights_gib(self) -> float:
        return self.weights.total_bytes / GIB

    @property
    def kv_cache_gib(self) -> float:
        """KV cache actually allocated: whole blocks in every shared tensor."""
        return self.num_gpu_blocks * self.layout.bytes_per_block_all_layers() / GIB

    @property
    def max_concurrency(self) -> float:
        """Requests of isl+osl tokens one DP rank can hold at once."""
        return self.num_gpu_blocks / self.blocks_per_request if self.blocks_per_request else 0.0

    @property
    def max_concurrency_instance(self) -> float:
        return self.max_concurrency * self.dp

    @property
    def max_concurrency_at_max_model_len(self) -> float:
        """What vLLM logs as 'Maximum concurrency for {max_model_len} tokens per request'."""
        return self.num_gpu_blocks / self.blocks_per_request_max_model_len

    @property
    def running_requests_cap(self) -> int:
        """Requests that can run at once per DP rank: KV capacity and max-num-seqs, whichever is lower."""
        return min(int(self.max_concurrency), self.max_num_seqs)

    @property
    def kv_cache_tokens(self) -> int:
        """What vLLM logs as 'GPU KV cache size: N tokens'."""
        return self.num_gpu_blocks // self.layout.num_groups * self.layout.block_size

    @property
    def fits(self) -> bool:
        """One request of the workload fits, and so does one of max-model-len (vLLM refuses to start otherwise)."""
        return self.kv_budget_bytes > 0 and self.num_gpu_blocks >= max(self.blocks_per_request,
                                                                       self.blocks_per_request_max_model_len)

    @property
    def shortfall_gib(self) -> float:
        """How much more KV budget vLLM would need to start (0 when it fits): one request of the workload and one
        of max-model-len, whichever needs more blocks."""
        blocks = max(self.blocks_per_request, self.blocks_per_request_max_model_len)
        return max(0.0, (blocks * self.layout.bytes_per_block_all_layers() - self.kv_budget_bytes) / GIB)

    def verdict(self) -> str:
        if self.fits:
            return (f"fits: {self.max_concurrency:.2f} requests of {self.tokens_per_request:,} tokens per DP rank, "
                    f"{self.max_concurrency_instance:.1f} per instance")
        if self.kv_budget_bytes > 0 and self.num_gpu_blocks >= self.blocks_per_request:
            return (f"does not fit: {self.topology} on {self.gpu} holds a request of {self.tokens_per_request:,} "
                    f"tokens but lacks {self.shortfall_gib:.2f} GiB per GPU for one of max-model-len "
                    f"{self.max_model_len:,}, which vLLM needs to start (a smaller --max-model-len fixes it)")
        return (f"does not fit: {self.topology} on {self.gpu} lacks {self.shortfall_gib:.2f} GiB per GPU for one "
                f"request of {self.tokens_per_request:,} tokens")

    def to_dict(self) -> dict[str, object]:
        lay = self.layout
        return {
            "model": self.model,
            "gpu": self.gpu,
            "topology": self.topology,
            "num_gpus": self.num_gpus,
            "fits": self.fits,
            "shortfall_gib": round(self.shortfall_gib, 3),
            "total_gib_per_gpu": self.total_gib,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "requested_gib_per_gpu": round(self.requested_gib, 3),
            "weights_gib_per_gpu": round(self.weights_gib, 3),
            "non_expert_weights_gib_per_gpu": round(self.weights.non_expert_bytes / GIB, 3),
            "expert_weights_gib_per_gpu": round(self.weights.expert_bytes / GIB, 3),
            "mtp_weights_gib_per_gpu": round(self.weights.mtp_bytes / GIB, 3),
            "non_torch_gib_per_gpu": round(self.non_torch_gib, 3),
            "activation_gib_per_gpu": round(self.activation_gib, 3),
            "cuda_graph_gib_per_gpu": round(self.cuda_graph_gib, 3),
            "kv_budget_gib_per_gpu": round(self.kv_budget_bytes / GIB, 3),
            "kv_budget_overridden": self.kv_budget_overridden,
            "kv_cache_gib_per_gpu": round(self.kv_cache_gib, 3),
            "block_size": lay.block_size,
            "page_size_bytes": lay.page_size_bytes,
            "attn_bytes_per_token_per_layer": lay.attn_bytes_per_token,
            "kv_cache_dtype": lay.kv_cache_dtype,
            "state_bytes_per_request_per_layer": lay.state_bytes,
            "state_padding_pct": round(lay.state_padding_pct, 2),
            "kv_cache_groups": lay.num_groups,
            "group_size": lay.group_size,
            "num_gpu_blocks": self.num_gpu_blocks,
            "kv_cache_tokens": self.kv_cache_tokens,
            "tokens_per_request": self.tokens_per_request,
            "blocks_per_request": self.blocks_per_request,
            "max_model_len": self.max_model_len,
            "max_concurrency": round(self.max_concurrency, 3),
            "max_concurrency_instance": round(self.max_concurrency_instance, 3),
            "max_concurrency_at_max_model_len": round(self.max_concurrency_at_max_model_len, 3),
            "max_num_seqs": self.max_num_seqs,
            "running_requests_cap": self.running_requests_cap,
        }


def _expert_how(model: ModelSpec, topo: Topology, backend: Mxfp4Backend | None) -> str:
    if model.moe is None:
        return "dense model"
    note = _padding_note(model, topo, backend)
    if not topo.ep:
        return f"{model.expert_bytes / GIB:.2f} GiB over MoE-TP{topo.ep_size}" + note
    physical = model.moe.num_experts + topo.num_redundant_experts
    extra = f" ({topo.num_redundant_experts} redundant, EPLB)" if topo.num_redundant_experts else ""
    return (f"{model.expert_bytes / GIB:.2f} GiB over EP{topo.ep_size}: {physical} physical experts{extra}, "
            f"{local_experts(model.moe.num_experts, topo)} on the fullest rank" + note)


def _padding_note(model: ModelSpec, topo: Topology, backend: Mxfp4Backend | None) -> str:
    factor = mxfp4_padding_factor(model, topo, backend)
    return f"; MXFP4 padding of {backend} x{factor:.3f}" if factor != 1.0 else ""


def compute_memory(
    model: ModelSpec, gpu: GpuSpec, topo: Topology, inputs: MemoryInputs | None = None
) -> MemoryBreakdown:
    """vLLM's determine_available_memory + KV-cache config, for the fullest GPU of the instance.

    One straight run of arithmetic in vLLM's own order (requested, weights, non-torch, activations, CUDA graphs,
    KV budget, pages, blocks), so each line can be read against the vLLM source it names; split up, the order
    that makes it checkable would be lost."""
    inputs = inputs or MemoryInputs()
    total_bytes = gpu.memory_bytes
    requested = math.ceil(total_bytes * topo.gpu_memory_utilization)
    mxfp4 = mxfp4_backend(gpu.architecture, inputs.mxfp4_backend)
    weights = weights_per_gpu(model, topo, mxfp4)
    non_torch = inputs.non_torch_gib if inputs.non_torch_gib is not None else gpu.non_torch_memory_gib
    activation = (inputs.activation_gib if inputs.activation_gib is not None
                  else activation_peak_bytes(model, topo) / GIB)
    graphs = (inputs.cuda_graph_gib if inputs.cuda_graph_gib is not None
              else cuda_graph_bytes(model, topo, gpu.architecture) / GIB)
    reserved = weights.total_bytes + round((non_torch + activation + graphs) * GIB)
    overridden = inputs.kv_cache_memory_bytes is not None
    budget = int(inputs.kv_cache_memory_bytes) if overridden else requested - reserved  # type: ignore[arg-type]

    layout = kv_layout(model, topo, architecture=gpu.architecture, block_size=inputs.block_size,
                       kv_cache_dtype=inputs.kv_cache_dtype)
    num_blocks = max(0, budget // layout.page_size_bytes // layout.group_size)
    tokens = inputs.tokens_per_request
    max_len = inputs.max_model_len or served_context_tokens(inputs.isl, inputs.osl)
    per_request = layout.blocks_per_request(tokens, topo.max_num_batched_tokens)
    per_request_max = layout.blocks_per_request(max_len, topo.max_num_batched_tokens)

    b = MemoryBreakdown(
        model=model.name, gpu=gpu.name, topology=topo.label(), num_gpus=topo.num_gpus, total_gib=gpu.memory_gib,
        gpu_memory_utilization=topo.gpu_memory_utilization, requested_gib=requested / GIB, weights=weights,
        non_torch_gib=non_torch, activation_gib=activation, cuda_graph_gib=graphs, kv_budget_bytes=budget,
        kv_budget_overridden=overridden, layout=layout, num_gpu_blocks=num_blocks, tokens_per_request=tokens,
        max_model_len=max_len, blocks_per_request=per_request, blocks_per_request_max_model_len=per_request_max,
        dp=topo.dp, max_num_seqs=topo.max_num_seqs,
    )
    return replace(b, lines=_explained(b, model, gpu, topo, inputs, mxfp4))


def _explained(b: MemoryBreakdown, model: ModelSpec, gpu: GpuSpec, topo: Topology, inputs: MemoryInputs,
               mxfp4: Mxfp4Backend | None) -> list[Line]:
    """The breakdown's lines in vLLM's order, each with how it was worked out."""
    weights, layout, budget, num_blocks = b.weights, b.layout, b.kv_budget_bytes, b.num_gpu_blocks
    per_request, tokens = b.blocks_per_request, b.tokens_per_request
    return [
        Line("total memory", gpu.memory_gib, f"{gpu.name} as the driver reports it"),
        Line("requested", b.requested_gib,
             f"ceil(total x gpu-memory-utilization {topo.gpu_memory_utilization:g})"),
        Line("non-expert weights", weights.non_expert_bytes / GIB,
             f"{model.non_expert_bytes / GIB:.2f} GiB split by TP{topo.tp} (norms, router replicated; "
             f"KV heads max(1, kv/TP))"),
        Line("expert weights", weights.expert_bytes / GIB,
             _expert_how(model, topo, mxfp4)),
        Line("MTP weights", weights.mtp_bytes / GIB,
             f"{model.num_mtp_layers} MTP layer(s), loaded with MTP{topo.mtp}" if topo.mtp else "MTP off"),
        Line("non-torch memory", b.non_torch_gib, "measured input" if inputs.non_torch_gib is not None
             else "driver + CUDA context (catalog)"),
        Line("peak activations", b.activation_gib, "measured input" if inputs.activation_gib is not None
             else f"estimate: profile run of {topo.max_num_batched_tokens} tokens + sampler"),
        Line("CUDA-graph reserve", b.cuda_graph_gib, "measured input" if inputs.cuda_graph_gib is not None
             else f"estimate: {len(cudagraph_capture_sizes(topo, gpu.architecture))} capture sizes, "
             "first capture + per-graph cost"),
        Line("KV budget", budget / GIB, "--kv-cache-memory-bytes" if b.kv_budget_overridden
             else "requested - weights - non-torch - activations - CUDA graphs"),
        Line("block size (tokens)", None,
             f"{layout.block_size}" + (" (raised so one attention page holds a GDN/mamba state)"
                                       if layout.block_size_was_raised else "")),
        Line("page size", None,
             f"{layout.block_size} tokens x {layout.attn_bytes_per_token} B = {layout.page_size_bytes:,} B "
             f"({layout.page_size_bytes / MIB:.3f} MiB); KV cache dtype {layout.kv_cache_dtype}"
             + (f", incl. {layout.indexer_bytes_per_token} B/token of sparse-attention indexer"
                if layout.indexer_bytes_per_token else "")),
        Line("KV cache groups", None,
             ", ".join(f"{n} x {k.value}" for k, n in layout.num_groups_by_kind.items())
             + f" of {layout.group_size} layers"),
        Line("blocks", None, f"{budget:,} B // {layout.page_size_bytes:,} B // {layout.group_size} = {num_blocks:,}"),
        Line("blocks per request", None, f"{per_request} for {tokens:,} tokens"),
        Line("max concurrency", None, f"{num_blocks:,} / {per_request} = "
             f"{(num_blocks / per_request) if per_request else 0:.2f} per DP rank x DP{topo.dp}"),
    ]
