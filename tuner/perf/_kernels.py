"""Kernels per decoder layer: the fixed cost of a forward pass scales with them, not with parameters.

At small batches a decode step is a chain of small kernels whose latency (launch + tail, even under CUDA graphs)
dominates. Counting them per layer type makes one `kernel_latency_us` per GPU class transfer between a 36-layer
dense model and a 92-layer hybrid MoE. Counts follow vLLM's decode path with its default torch.compile fusions
(fused add + RMSNorm, fused SiLU-and-mul, fused top-k); collectives are charged separately in `_comm`.
"""

from __future__ import annotations

from tuner.models import LayerKind, ModelSpec

NORMS = 2  # fused residual-add + RMSNorm before the mixer and before the MLP
MIXER_KERNELS: dict[LayerKind, int] = {
    LayerKind.FULL_ATTENTION: 5,  # QKV GEMM, q/k norm + RoPE, KV-cache write, paged attention, O projection
    LayerKind.SLIDING_WINDOW: 5,  # the same kernels over a window
    LayerKind.MLA: 9,  # q_a, q_b (+ norm), kv_a (+ norm), RoPE, cache write, absorbed q bmm, attention, v bmm + O
    LayerKind.LINEAR_ATTENTION: 7,  # two input projections, causal conv1d, gating, delta-rule recurrence,
    #                                  gated RMSNorm, output projection
    LayerKind.MAMBA: 6,  # input projection, conv1d, selective scan, gated norm, output projection, dt/bias
}
INDEXER_KERNELS = 8  # DeepSeek-V3.2 indexer: wq_b and wk / weights_proj GEMMs, K LayerNorm, RoPE, FP8 quant of
#                      q, indexer K-cache write, fp8_mqa_logits, per-row top-k (vLLM deepseek_v2.py Indexer)
DENSE_MLP_KERNELS = 3  # gate_up GEMM, SiLU-and-mul, down GEMM
MOE_KERNELS = 7  # router GEMM, top-k/softmax, align/permute, two grouped GEMMs, activation, unpermute + reduce
SHARED_EXPERT_KERNELS = 4  # gate_up GEMM, activation, down GEMM, sigmoid gate / add


def layer_kernels(model: ModelSpec, kind: LayerKind, moe: bool) -> int:
    """Kernels one decoder layer of this kind launches per forward pass."""
    mlp = DENSE_MLP_KERNELS
    if moe and model.moe is not None:
        mlp = MOE_KERNELS + (SHARED_EXPERT_KERNELS if model.moe.shared_intermediate_size else 0)
    mixer = MIXER_KERNELS.get(kind, 5)
    if kind is LayerKind.MLA and model.mla is not None and model.mla.index_head_dim:
        mixer += INDEXER_KERNELS
    return NORMS + mixer + mlp


def pass_kernels(model: ModelSpec, kinds: tuple[LayerKind, ...], moe_flags: tuple[bool, ...]) -> int:
    """Kernels of one forward pass over these layers."""
    return sum(layer_kernels(model, kind, moe) for kind, moe in zip(kinds, moe_flags, strict=True))
