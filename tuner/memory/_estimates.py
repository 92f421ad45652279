"""Estimates of what vLLM measures at start-up (peak activations, CUDA-graph pool), used before any GPU runs.

They are estimates: pass measured values (--activation-gib, --cuda-graph-gib, --non-torch-gib) to replace them,
and every real trial stores vLLM's own figures beside these for comparison.
"""

from __future__ import annotations

from functools import lru_cache

from tuner.models import ModelSpec
from tuner.topology import Topology

ACT_BYTES = 2  # bf16 activations
MIB = 1024**2
# vLLM's profile_cudagraph_memory (vllm/v1/worker/gpu_model_runner.py) captures the two largest sizes of each
# cudagraph mode and reserves `first capture + max(second capture, 1 MiB) x (graphs - 1)`. The first capture
# holds the pool's activation buffers for the largest size; every further graph costs its kernel nodes, which
# grow with the layers a graph spans. Per-layer bytes of one further graph: an estimate chosen so the two public
# anchors hold (GB300 reference campaign: ~20 GiB of non-weight memory; Qwen3-235B-A22B BF16 TP8 served by vLLM
# at 0.90 with 32k context on H100). Replace it with the measured figure (--cuda-graph-gib) when you have one.
CUDA_GRAPH_BYTES_PER_GRAPH_LAYER = 0.75 * MIB
MIN_BYTES_PER_GRAPH = MIB  # "Use at least 1 MiB per graph for driver overhead"


def _request_counts(max_reqs: int) -> list[int]:
    counts = [n for n in (1, 2, 4) if n <= max_reqs]
    counts += list(range(8, min(max_reqs + 1, 256), 8)) + list(range(256, max_reqs + 1, 16))
    return sorted({*counts, max_reqs})


def cudagraph_capture_sizes(topo: Topology, architecture: str = "hopper") -> list[int]:
    """vllm/config/vllm.py VllmConfig._set_cudagraph_sizes, default compilation config.

    1, 2, 4, every 8 below 256, every 16 from 256, up to max_cudagraph_capture_size (default: min(2 x max-num-seqs x
    (1 + mtp), 1024 on SM10x = the catalog's blackwell GPUs, 512 elsewhere), then capped
    by max-num-batched-tokens, which is itself added when it fits); with MTP the uniform-decode sizes
    n x (1 + mtp) for n up to max-num-seqs are added too. An explicit --max-cudagraph-capture-size replaces the
    default cap: launch plans set Topology.cudagraph_capture_tokens (the searched knob, or by default the decode
    batch x (1 + MTP) on decoding instances; None on prefill, where vLLM's default applies).
    """
    return list(_capture_sizes(topo.cudagraph_capture_tokens, topo.max_num_seqs, topo.mtp,
                               topo.max_num_batched_tokens, architecture))


@lru_cache(maxsize=4096)
def _capture_sizes(explicit: int | None, max_num_seqs: int, mtp: int, max_tokens: int,
                   architecture: str) -> tuple[int, ...]:
    """Pure and cached: a sweep asks for the same few engine settings thousands of times."""
    if architecture == "cpu":
        return ()  # the CPU backend runs eagerly
    # vllm/config/vllm.py: 1024 if current_platform.is_device_capability_family(100) else 512. The catalog's
    # "blackwell" GPUs (B200, GB200, GB300) are all SM10x.
    platform_max = 1024 if architecture == "blackwell" else 512
    qlen = 1 + mtp
    cap = explicit if explicit is not None else min(max_num_seqs * qlen * 2, platform_max)
    uniform_decode: list[int] = []
    if explicit is None and qlen > 1:
        uniform_decode = [n * qlen for n in _request_counts(min(max_num_seqs, platform_max)) if n * qlen <= cap]
    cap = min(cap, max_tokens)
    if cap < 1:
        return ()
    sizes = [s for s in (1, 2, 4) if s <= cap]
    sizes += list(range(8, min(cap + 1, 256), 8)) + list(range(256, cap + 1, 16))
    if max_tokens <= cap:
        sizes.append(max_tokens)
    sizes += [s for s in uniform_decode if s <= max_tokens]
    return tuple(sorted(set(sizes)))


def activation_bytes_per_token(model: ModelSpec, topo: Topology) -> int:
    """Live activation bytes per token of one forward pass on one GPU (the largest layer's intermediates)."""
    hidden = model.hidden_size
    per_token = 4 * hidden  # residual, normed input, attention output, MLP output
    if model.attention:
        a = model.attention
        q_width = a.num_heads * a.head_dim * (2 if a.output_gate else 1)
        per_token += (q_width + 2 * a.num_kv_heads * a.head_dim) // topo.tp
    elif model.mla:
        per_token += model.mla.num_heads * (model.mla.qk_nope_head_dim + model.mla.qk_rope_head_dim) // topo.tp
    if model.linear_attention:
        la = model.linear_attention
        per_token += (2 * la.num_key_heads * la.key_head_dim + 2 * la.num_value_heads * la.value_head_dim) // topo.tp
    dense = model.dense_intermediate_size or 0
    if model.moe:
        moe = model.moe
        local_inter = moe.expert_intermediate_size if topo.ep else moe.expert_intermediate_size // topo.ep_size
        # fused-MoE workspaces: (tokens x top-k) rows of the gate/up output and of the down output
        per_token += moe.experts_per_token * (2 * local_inter + hidden)
        dense_layers_exist = model.num_moe_layers != model.num_layers
        dense = max(dense if dense_layers_exist else 0, moe.shared_intermediate_size)
    per_token += 2 * dense // topo.tp
    return per_token * ACT_BYTES


def activation_peak_bytes(model: ModelSpec, topo: Topology) -> int:
    """Peak torch memory of the profile run: one batch of max-num-batched-tokens, plus the sampler's logits."""
    tokens = topo.max_num_batched_tokens
    sampler = min(topo.max_num_seqs, tokens) * model.vocab_size * 4 * 2  # fp32 logits + probabilities
    return tokens * activation_bytes_per_token(model, topo) + sampler


def cuda_graph_bytes(model: ModelSpec, topo: Topology, architecture: str = "hopper") -> int:
    """vLLM's CUDA-graph reserve under the default FULL_AND_PIECEWISE mode.

    PIECEWISE graphs for every capture size, FULL graphs for the uniform-decode sizes (at most max-num-seqs x
    (1 + mtp) tokens). Reserve = the largest size's activation buffers (shared pool, captured first) + one
    per-graph cost for every further graph, as profile_cudagraph_memory extrapolates.
    """
    sizes = _capture_sizes(topo.cudagraph_capture_tokens, topo.max_num_seqs, topo.mtp,
                           topo.max_num_batched_tokens, architecture)
    if not sizes:
        return 0
    qlen = 1 + topo.mtp
    full = sum(1 for s in sizes if s % qlen == 0 and s <= topo.max_num_seqs * qlen)
    layers = model.num_layers + (model.num_mtp_layers if topo.mtp else 0)
    per_graph = max(MIN_BYTES_PER_GRAPH, round(layers * CUDA_GRAPH_BYTES_PER_GRAPH_LAYER))
    first_capture = sizes[-1] * activation_bytes_per_token(model, topo)
    return first_capture + per_graph * (len(sizes) - 1 + max(0, full - 1))
