"""Estimates of what vLLM measures at start-up (peak activations, CUDA-graph pool), used before any GPU runs.

They are estimates: pass measured values (--activation-gib, --cuda-graph-gib, --non-torch-gib) to replace them,
and every real trial stores vLLM's own figures beside these for comparison.
"""

from __future__ import annotations

from tuner.models import ModelSpec
from tuner.topology import Topology

ACT_BYTES = 2  # bf16 activations
# Bytes of CUDA-graph pool per captured batch size and decoder layer. vLLM reserves it before sizing the KV
# cache (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS) and the campaign kept the reserve conservative; with the
# reference model (92 layers, 51 sizes) this gives ~14 GiB, so non-weight memory totals ~20 GiB as measured.
CUDA_GRAPH_BYTES_PER_SIZE_AND_LAYER = 3 * 1024**2


def cudagraph_capture_sizes(topo: Topology) -> list[int]:
    """vLLM's default capture sizes: 1, 2, 4, then every 8 up to 256, then every 16, up to the cap."""
    cap = min(topo.max_num_seqs * (1 + topo.mtp), 512)
    sizes = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]
    return [s for s in sizes if s <= cap]


def activation_peak_bytes(model: ModelSpec, topo: Topology) -> int:
    """Peak torch memory of the profile run: one batch of max-num-batched-tokens, plus the sampler's logits."""
    tokens = topo.max_num_batched_tokens
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
    sampler = min(topo.max_num_seqs, tokens) * model.vocab_size * 4 * 2  # fp32 logits + probabilities
    return tokens * per_token * ACT_BYTES + sampler


def cuda_graph_bytes(model: ModelSpec, topo: Topology) -> int:
    layers = model.num_layers + (model.num_mtp_layers if topo.mtp else 0)
    return len(cudagraph_capture_sizes(topo)) * layers * CUDA_GRAPH_BYTES_PER_SIZE_AND_LAYER
