"""Model specs read from Hugging Face config.json files (and safetensors headers when present)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

# Importing the family modules registers them.
from tuner.models import _deepseek, _glm4_moe, _gpt_oss, _minimax_m2, _qwen3_next, _transformer  # noqa: F401
from tuner.models._config import read_config
from tuner.models._kind import KernelKind, kernel_kind
from tuner.models._registry import build_spec, supported_model_types
from tuner.models._revision import UNKNOWN_REVISION, model_revision
from tuner.models._safetensors import tensors_from_safetensors
from tuner.models._spec import (
    AttentionSpec,
    LayerKind,
    LinearAttentionSpec,
    MambaSpec,
    MLASpec,
    ModelSpec,
    MoESpec,
    Sharding,
    TensorGroup,
    WeightFormat,
    WeightTensor,
)

__all__ = [
    "UNKNOWN_REVISION",
    "AttentionSpec",
    "KernelKind",
    "LayerKind",
    "LinearAttentionSpec",
    "MLASpec",
    "MambaSpec",
    "MoESpec",
    "ModelSpec",
    "Sharding",
    "TensorGroup",
    "WeightFormat",
    "WeightTensor",
    "kernel_kind",
    "load_model",
    "model_revision",
    "supported_model_types",
]


def load_model(path: str | Path, *, use_safetensors: bool = True) -> ModelSpec:
    """Read a config.json file or a model folder into a ModelSpec.

    When the folder holds *.safetensors files their headers give the exact bytes of every tensor and
    replace the bytes computed from the config (the layer structure always comes from config.json).
    """
    cfg, folder = read_config(path)
    name = (folder or Path(path).expanduser().resolve().parent).name
    spec = build_spec(cfg, name)
    if use_safetensors and folder is not None and any(folder.glob("*.safetensors")):
        quantized = next((t.fmt for t in spec.tensors if t.is_expert and t.fmt is not WeightFormat.BF16), None)
        tensors = tensors_from_safetensors(folder, num_layers=spec.num_layers,
                                           packed_fp4=spec.quantization.startswith("nvfp4"), quantized=quantized)
        spec = dataclasses.replace(spec, tensors=tensors, weights_source="safetensors headers")
    return spec
