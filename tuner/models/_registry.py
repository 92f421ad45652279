"""Model families register a builder per model_type; one file per family."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tuner.errors import UnsupportedModelError
from tuner.models._config import RawConfig
from tuner.models._quant import QuantPolicy, quant_policy
from tuner.models._spec import LayerKind, ModelSpec, WeightTensor

FamilyBuilder = Callable[[RawConfig, QuantPolicy, str], ModelSpec]
_FAMILIES: dict[str, tuple[str, FamilyBuilder]] = {}


def register_family(family: str, *model_types: str) -> Callable[[FamilyBuilder], FamilyBuilder]:
    def wrap(builder: FamilyBuilder) -> FamilyBuilder:
        for model_type in model_types:
            _FAMILIES[model_type] = (family, builder)
        return builder

    return wrap


def supported_model_types() -> list[str]:
    return sorted(_FAMILIES)


def build_spec(cfg: RawConfig, name: str) -> ModelSpec:
    model_type = str(cfg.get("model_type", ""))
    if model_type not in _FAMILIES:
        raise UnsupportedModelError(
            f"unknown architecture {model_type or '(no model_type)'!r}; supported model_type values: "
            f"{', '.join(supported_model_types())}",
            field=f"{cfg.source}: model_type",
            fix="add a family in tuner/models/ (one file per family) or use a supported model",
        )
    _family, builder = _FAMILIES[model_type]
    return builder(cfg, quant_policy(cfg), name)


def make_spec(cfg: RawConfig, policy: QuantPolicy, name: str, *, family: str, tensors: tuple[WeightTensor, ...],
              layer_kinds: list[LayerKind], moe_layers: list[bool], **parts: Any) -> ModelSpec:
    """The fields every family fills the same way."""
    return ModelSpec(
        name=name,
        model_type=str(cfg.get("model_type")),
        architecture=str((cfg.get("architectures") or ["?"])[0]),
        family=family,
        dtype=str(cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))),
        hidden_size=cfg.int("hidden_size"),
        vocab_size=cfg.int("vocab_size"),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=cfg.int("max_position_embeddings", 131072),
        layer_kinds=tuple(layer_kinds),
        moe_layers=tuple(moe_layers),
        quantization=policy.name,
        tensors=tensors,
        **parts,
    )
