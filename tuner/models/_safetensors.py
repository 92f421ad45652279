"""Exact bytes per tensor from safetensors headers (the 8-byte length + JSON header; tensors are not read)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from tuner.errors import ConfigError
from tuner.models._spec import TensorGroup, WeightFormat, WeightTensor
from tuner.models._tensors import classify, layer_index

_MAX_HEADER_BYTES = 100 * 1024 * 1024
_DTYPE_FORMAT = {"BF16": WeightFormat.BF16, "F16": WeightFormat.FP16, "F32": WeightFormat.FP32,
                 "F8_E4M3": WeightFormat.FP8, "U8": WeightFormat.NVFP4, "I8": WeightFormat.NVFP4}
_SCALE_SUFFIXES = ("_scale", "_scale_inv", "_scale_2", "input_scale", "_scales", ".scales", ".qzeros", ".g_idx",
                   "_zero_point", ".weight_shape", "_global_scale")
# Packed weights: values per stored element (gpt-oss MXFP4 *_blocks: 2 per uint8; int32-packed int4: 8 per word).
_PACKED = {"_blocks": (WeightFormat.MXFP4, 2), ".weight_packed": (WeightFormat.INT4, 8),
           ".qweight": (WeightFormat.INT4_ZP, 8)}


def _packed(name: str) -> tuple[WeightFormat, int] | None:
    return next((v for suffix, v in _PACKED.items() if name.endswith(suffix)), None)


def read_header(path: Path) -> dict[str, dict]:
    try:
        with path.open("rb") as fh:
            raw_len = fh.read(8)
            if len(raw_len) != 8:
                raise ConfigError(f"{path.name} is too short to be safetensors", field=str(path),
                                  fix="re-download the file")
            (length,) = struct.unpack("<Q", raw_len)
            if length > _MAX_HEADER_BYTES:
                raise ConfigError(f"{path.name} header claims {length} bytes", field=str(path),
                                  fix="the file is corrupt; re-download it")
            header = json.loads(fh.read(length))
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", field=str(path), fix="check permissions") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path.name} has a malformed header", field=str(path), fix="re-download it") from exc
    header.pop("__metadata__", None)
    return header


def tensors_from_safetensors(folder: Path, *, num_layers: int, packed_fp4: bool,
                             quantized: WeightFormat | None = None) -> tuple[WeightTensor, ...]:
    """One WeightTensor per stored tensor, with the exact bytes the file holds.

    Parameter counts undo the packing (NVFP4 uint8: 2 values; MXFP4 *_blocks: 2; int32-packed int4: 8) and
    scales, zero points and shapes count no parameters; `quantized` labels their format.
    """
    out: list[WeightTensor] = []
    for path in sorted(folder.glob("*.safetensors")):
        for name, info in read_header(path).items():
            start, end = info["data_offsets"]
            shape = tuple(int(d) for d in info["shape"])
            is_mtp = name.startswith(("mtp.", "model.mtp.")) or (layer_index(name) or 0) >= num_layers
            if is_mtp and ("embed_tokens" in name or "shared_head.head" in name):
                continue  # vLLM shares the target's embedding and head with the MTP drafter
            group, sharding = classify(name)
            fmt = _DTYPE_FORMAT.get(info["dtype"], WeightFormat.BF16)
            numel = 1
            for d in shape:
                numel *= d
            is_scale = name.endswith(_SCALE_SUFFIXES)
            packed = _packed(name)
            if packed:
                fmt, per_element = packed
                params = numel * per_element
            else:
                params = 0 if is_scale else numel * (2 if packed_fp4 and fmt is WeightFormat.NVFP4 else 1)
            if is_scale and group is TensorGroup.EXPERT:
                fmt = quantized or (WeightFormat.NVFP4 if packed_fp4 else WeightFormat.FP8_BLOCK)
            out.append(WeightTensor(name=name, shape=shape, group=group, sharding=sharding, fmt=fmt,
                                    nbytes=end - start, num_params=params, is_mtp=is_mtp))
    return tuple(out)
