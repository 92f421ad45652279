"""What a model's kernels are: the part of a model that decides which GEMM and attention kernels vLLM runs for it.

A cluster's learnt efficiencies (tuner.cluster) carry from one model to the next only where both run the same kernels:
an MXFP4 expert GEMM and an FP8 block-scaled one reach different fractions of the peak on the same GPU, MLA's decode
kernel another share of HBM bandwidth than a sliding-window kernel with sinks. This is the one place that reads a
ModelSpec for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tuner.models._spec import LayerKind, ModelSpec, TensorGroup, WeightFormat

_FORMAT_KIND = {WeightFormat.FP8: "fp8", WeightFormat.FP8_BLOCK: "fp8", WeightFormat.FP8_CHANNEL: "fp8",
                WeightFormat.BF16: "bf16", WeightFormat.FP16: "bf16", WeightFormat.FP32: "bf16",
                WeightFormat.NVFP4: "nvfp4", WeightFormat.MXFP4: "mxfp4", WeightFormat.INT4: "int4",
                WeightFormat.INT4_ZP: "int4"}


@dataclass(frozen=True, order=True)
class KernelKind:
    """The kernels a model runs: dense (attention, dense MLP, shared expert) GEMM precision, the expert GEMM backend
    ("none" for a dense model), the KV cache precision it runs with by default, and the attention kernel (mla, gqa,
    swa-sinks, hybrid-linear, hybrid-mamba)."""

    dense_weights: str
    expert_weights: str
    kv_cache: str
    attention: str

    def label(self) -> str:
        experts = f"{self.expert_weights} experts" if self.expert_weights != "none" else "dense"
        return f"{self.dense_weights} weights, {experts}, {self.kv_cache} KV, {self.attention}"


def _dominant(model: ModelSpec, groups: frozenset[TensorGroup]) -> str | None:
    """The format holding most parameters of these tensor groups (None when the model has none)."""
    params: dict[str, int] = {}
    for t in model.tensors:
        if t.group in groups and not t.is_mtp:
            kind = _FORMAT_KIND[t.fmt]
            params[kind] = params.get(kind, 0) + t.num_params
    return max(params, key=lambda k: params[k]) if params else None


_DENSE = frozenset({TensorGroup.ATTENTION, TensorGroup.LINEAR_ATTENTION, TensorGroup.DENSE_MLP,
                    TensorGroup.SHARED_EXPERT})


def kernel_kind(model: ModelSpec) -> KernelKind:
    """The model's KernelKind, from its weight tensors and layer kinds."""
    dense = _dominant(model, _DENSE) or "bf16"
    experts = _dominant(model, frozenset({TensorGroup.EXPERT})) if model.moe is not None else None
    kinds = set(model.layer_kinds)
    if LayerKind.LINEAR_ATTENTION in kinds:
        attention = "hybrid-linear"
    elif LayerKind.MAMBA in kinds:
        attention = "hybrid-mamba"
    elif LayerKind.MLA in kinds:
        attention = "mla"
    elif LayerKind.SLIDING_WINDOW in kinds:
        sinks = any(t.name.endswith(".sinks") for t in model.tensors)
        attention = "swa-sinks" if sinks else "swa"
    else:
        attention = "gqa"
    return KernelKind(dense_weights=dense, expert_weights=experts or "none", kv_cache=_kv_default(model.dtype),
                      attention=attention)


def _kv_default(dtype: str) -> str:
    """vLLM's --kv-cache-dtype auto: the model's activation dtype."""
    return {"bfloat16": "bf16", "float16": "bf16", "float32": "bf16"}.get(dtype, dtype)
