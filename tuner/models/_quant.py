"""Which tensor is stored in which format, from quantization_config."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

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

    def format_for(self, module: str, group: TensorGroup, shape: tuple[int, ...]) -> WeightFormat:
        if self.quantized is self.base or group in _NEVER_QUANTIZED or len(shape) != 2:
            return self.base
        if any(fnmatchcase(module, pattern) or module == pattern for pattern in self.ignore):
            return self.base
        return self.quantized


def _base_format(cfg: RawConfig) -> WeightFormat:
    dtype = str(cfg.get("torch_dtype", cfg.get("dtype", "bfloat16"))).lower()
    return {"float16": WeightFormat.FP16, "float32": WeightFormat.FP32}.get(dtype, WeightFormat.BF16)


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
        algo = str(qc.get("quant_algo") or (qc.get("quantization") or {}).get("quant_algo", "")).upper()
        ignore = ignore or tuple((qc.get("quantization") or {}).get("exclude_modules") or ())
        if algo == "NVFP4":
            return QuantPolicy(name="nvfp4 (modelopt)", base=base, quantized=WeightFormat.NVFP4,
                               ignore=ignore, group_size=int(qc.get("group_size", 16)))
        if algo == "FP8":
            return QuantPolicy(name="fp8 (modelopt)", base=base, quantized=WeightFormat.FP8, ignore=ignore)
        raise ConfigError(f"modelopt quant_algo {algo!r} is not supported",
                          field=f"{cfg.source}: quantization_config.quant_algo", fix="use NVFP4 or FP8")
    raise ConfigError(f"quant_method {method!r} is not supported yet",
                      field=f"{cfg.source}: quantization_config.quant_method",
                      fix="supported: fp8 (block or per-tensor), modelopt NVFP4/FP8; or drop the field for BF16")
