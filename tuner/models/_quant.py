"""Which tensor is stored in which format, from quantization_config (or a ModelOpt hf_quant_config.json).

Each method follows the vLLM quantization config that loads it (vllm/model_executor/layers/quantization/):
fp8.py, modelopt.py, compressed_tensors/, awq.py / awq_marlin.py, gptq.py / gptq_marlin.py, mxfp4.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from tuner.errors import ConfigError
from tuner.models._config import RawConfig
from tuner.models._spec import TensorGroup, WeightFormat

_NEVER_QUANTIZED = (TensorGroup.EMBEDDING, TensorGroup.LM_HEAD, TensorGroup.NORM, TensorGroup.ROUTER)


@dataclass(frozen=True)
class QuantPolicy:
    name: str  # e.g. "bf16", "fp8 block 128x128", "nvfp4 (modelopt)"
    base: WeightFormat  # unquantized tensors
    quantized: WeightFormat  # linear weights not on the ignore list
    ignore: tuple[str, ...] = ()
    block: tuple[int, int] = (128, 128)
    group_size: int = 16
    ignore_substrings: bool = False  # AWQ/GPTQ modules_to_not_convert: a name part, not a pattern
    experts_only: bool = False  # MXFP4 (gpt-oss): vLLM quantizes only the fused-MoE experts

    def _ignored(self, module: str) -> bool:
        for pattern in self.ignore:
            if pattern.startswith("re:"):  # compressed-tensors regex targets
                if re.match(pattern[3:], module):
                    return True
            elif self.ignore_substrings:
                if pattern in module:
                    return True
            elif fnmatchcase(module, pattern) or module == pattern or module.endswith("." + pattern):
                return True
        return False

    def format_for(self, module: str, group: TensorGroup, shape: tuple[int, ...]) -> WeightFormat:
        if self.quantized is self.base or group in _NEVER_QUANTIZED or len(shape) != 2:
            return self.base
        if self.experts_only and group is not TensorGroup.EXPERT:
            return self.base
        if self._ignored(module):
            return self.base
        return self.quantized


def _base_format(cfg: RawConfig) -> WeightFormat:
    dtype = str(cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))).lower()
    return {"float16": WeightFormat.FP16, "float32": WeightFormat.FP32}.get(dtype, WeightFormat.BF16)


def _unsupported(cfg: RawConfig, what: str, key: str = "quant_method") -> ConfigError:
    return ConfigError(f"{what} is not supported yet", field=f"{cfg.source}: quantization_config.{key}",
                       fix="supported: fp8 (block or per-tensor), modelopt NVFP4/FP8, compressed-tensors "
                           "(FP8, NVFP4, W4A16), awq, gptq (4-bit), mxfp4; or drop the field for BF16")


def _compressed_tensors(cfg: RawConfig, qc: dict[str, Any], base: WeightFormat) -> QuantPolicy:
    """compressed_tensors.py: one weights scheme for the Linear targets (the schemes topotune knows)."""
    groups = [g for g in (qc.get("config_groups") or {}).values() if isinstance(g, dict) and g.get("weights")]
    if not groups:
        raise _unsupported(cfg, "compressed-tensors without config_groups weights", "config_groups")
    w = groups[0]["weights"]
    bits, kind, strategy = int(w.get("num_bits", 0)), str(w.get("type", "int")), str(w.get("strategy", ""))
    ignore = tuple(qc.get("ignore") or ())
    fmt_name = str(qc.get("format", ""))
    if bits == 8 and kind == "float":
        if strategy == "block":
            block = w.get("block_structure") or [128, 128]
            return QuantPolicy(name=f"fp8 block {block[0]}x{block[1]} (compressed-tensors)", base=base,
                               quantized=WeightFormat.FP8_BLOCK, ignore=ignore, block=(block[0], block[1]))
        quantized = WeightFormat.FP8_CHANNEL if strategy == "channel" else WeightFormat.FP8
        return QuantPolicy(name=f"fp8 per-{strategy or 'tensor'} (compressed-tensors)", base=base,
                           quantized=quantized, ignore=ignore)
    if bits == 4 and kind == "float" and (fmt_name.startswith("nvfp4") or int(w.get("group_size") or 0) == 16):
        return QuantPolicy(name="nvfp4 (compressed-tensors)", base=base, quantized=WeightFormat.NVFP4,
                           ignore=ignore, group_size=16)
    if bits == 4 and kind == "int":
        group = int(w.get("group_size") or 128)
        zp = not bool(w.get("symmetric", True))
        return QuantPolicy(name=f"w4a16 int4 g{group} (compressed-tensors)", base=base,
                           quantized=WeightFormat.INT4_ZP if zp else WeightFormat.INT4, ignore=ignore,
                           group_size=group)
    raise _unsupported(cfg, f"compressed-tensors {bits}-bit {kind} ({strategy or fmt_name})", "config_groups")


def _modelopt(cfg: RawConfig, qc: dict[str, Any], base: WeightFormat) -> QuantPolicy:
    inner = qc.get("quantization") or {}
    algo = str(qc.get("quant_algo") or inner.get("quant_algo", "")).upper()
    ignore = tuple(qc.get("ignore") or qc.get("exclude_modules") or inner.get("exclude_modules") or ())
    if algo == "NVFP4":
        return QuantPolicy(name="nvfp4 (modelopt)", base=base, quantized=WeightFormat.NVFP4, ignore=ignore,
                           group_size=int(qc.get("group_size") or inner.get("group_size") or 16))
    if algo == "FP8":
        return QuantPolicy(name="fp8 (modelopt)", base=base, quantized=WeightFormat.FP8, ignore=ignore)
    raise ConfigError(f"modelopt quant_algo {algo!r} is not supported",
                      field=f"{cfg.source}: quantization_config.quant_algo", fix="use NVFP4 or FP8")


def quant_policy(cfg: RawConfig) -> QuantPolicy:
    base = _base_format(cfg)
    qc = cfg.get("quantization_config")
    if not qc:
        return QuantPolicy(name=base.value, base=base, quantized=base)
    if not isinstance(qc, dict):
        raise ConfigError("quantization_config must be an object", field=f"{cfg.source}: quantization_config",
                          fix="use the checkpoint's original config.json")
    method = str(qc.get("quant_method", "")).lower()
    ignore = tuple(qc.get("ignore") or qc.get("modules_to_not_convert") or qc.get("ignored_layers") or ())
    if method == "fp8":
        block = qc.get("weight_block_size")
        if block:
            return QuantPolicy(name=f"fp8 block {block[0]}x{block[1]}", base=base,
                               quantized=WeightFormat.FP8_BLOCK, ignore=ignore, block=(block[0], block[1]))
        return QuantPolicy(name="fp8", base=base, quantized=WeightFormat.FP8, ignore=ignore)
    if method == "modelopt":
        return _modelopt(cfg, qc, base)
    if method == "compressed-tensors":
        return _compressed_tensors(cfg, qc, base)
    if method in ("awq", "gptq"):
        bits = int(qc.get("bits", qc.get("w_bit", 4)))
        if bits != 4:
            raise _unsupported(cfg, f"{method} with {bits} bits", "bits")
        group = int(qc.get("group_size", qc.get("q_group_size", 128)))
        return QuantPolicy(name=f"{method} int4 g{group}", base=base, quantized=WeightFormat.INT4_ZP,
                           ignore=ignore, group_size=group, ignore_substrings=True)
    if method == "mxfp4":
        return QuantPolicy(name="mxfp4", base=base, quantized=WeightFormat.MXFP4, ignore=ignore, experts_only=True)
    raise _unsupported(cfg, f"quant_method {method!r}")
