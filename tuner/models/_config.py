"""Reading config.json (file or model folder, nested text_config) into a checked mapping."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tuner.errors import ConfigError, UnsupportedModelError
from tuner.files import read_text

MAX_CONFIG_BYTES = 16 * 2**20  # a config.json is a few KiB; the service refuses larger ones too

# Sizes every layer, head or token is divided by or counted in: 0 is no model (the memory model would divide by it),
# while counts such as n_shared_experts, first_k_dense_replace or num_nextn_predict_layers may be 0.
POSITIVE_FIELDS = frozenset({
    "hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
    "max_position_embeddings", "kv_lora_rank", "qk_rope_head_dim", "v_head_dim", "num_local_experts",
    "num_experts_per_tok", "moe_intermediate_size", "moe_layer_freq", "decoder_sparse_step", "sliding_window",
    "full_attention_interval", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
    "linear_value_head_dim", "linear_conv_kernel_dim", "index_n_heads", "index_topk",
})


class RawConfig:
    """A config.json mapping that reports every missing field at once, with the field names."""

    def __init__(self, data: dict[str, Any], source: str, root: dict[str, Any] | None = None) -> None:
        self.data = data
        self.source = source
        self.root = root if root is not None else data

    def __contains__(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value

    def require(self, family: str, keys: Iterable[str]) -> None:
        missing = [k for k in keys if self.data.get(k) is None]
        if missing:
            raise UnsupportedModelError(
                f"config for the {family} family lacks {', '.join(missing)}",
                field=f"{self.source}: {missing[0]}",
                fix="use the model's original config.json (these fields are required for this architecture)",
            )

    def int(self, key: str, default: int | None = None) -> int:
        value = self.data.get(key, default)
        if value is None:
            raise UnsupportedModelError(f"missing {key}", field=f"{self.source}: {key}",
                                        fix="use the model's original config.json")
        least = 1 if key in POSITIVE_FIELDS else 0
        if isinstance(value, bool) or not isinstance(value, int | float) or int(value) != value or value < least:
            kind = "a positive" if least else "a non-negative"
            raise ConfigError(f"{key} must be {kind} integer, got {value!r}",
                              field=f"{self.source}: {key}", fix=f"correct {key} in config.json (the model's "
                                                                 "original value)")
        return int(value)


def read_config(path: str | Path) -> tuple[RawConfig, Path | None]:
    """Return the (text) config and the model folder when `path` is a folder."""
    try:
        path = Path(path).expanduser()
        folder = path if path.is_dir() else None
    except (OSError, RuntimeError) as exc:  # a name too long for the filesystem, "~user" of no user, ...
        raise ConfigError(f"cannot use the path {str(path)[:120]!r}: {exc}", field="MODEL",
                          fix="give a config.json file or a model folder that contains one") from exc
    if folder is not None:
        path = folder / "config.json"
    if not path.exists():
        raise ConfigError(f"no such file {path}", field="MODEL",
                          fix="give a config.json file or a model folder that contains one")
    # a regular file under its bound (a FIFO or /dev/zero named as the model would block or never end)
    text = read_text(path, max_bytes=MAX_CONFIG_BYTES, field="MODEL", what="a config.json file or a model folder",
                     fix="a model config is a few KiB: give the model's config.json")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path} is not valid JSON (line {exc.lineno}: {exc.msg})", field="MODEL",
                          fix="wait until the file is completely written, or repair it") from exc
    except (ValueError, RecursionError) as exc:  # an integer of more than 4,300 digits, absurd nesting
        raise ConfigError(f"{path} is not a usable JSON config ({str(exc)[:200] or type(exc).__name__})",
                          field="MODEL", fix="use the model's original config.json") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a JSON object", field="MODEL", fix="use a Hugging Face config.json")
    source = str(path)
    _merge_modelopt_quant_config(data, path.parent)
    text_config = data.get("text_config")
    if isinstance(text_config, dict):
        merged = dict(text_config)
        for key in ("quantization_config", "architectures", "tie_word_embeddings", "torch_dtype"):
            if key not in merged and key in data:
                merged[key] = data[key]
        merged.setdefault("model_type", data.get("model_type"))
        return RawConfig(merged, f"{source} (text_config)", root=data), folder
    return RawConfig(data, source), folder


def _merge_modelopt_quant_config(data: dict[str, Any], folder: Path) -> None:
    """ModelOpt checkpoints may describe their quantization only in hf_quant_config.json.

    vLLM reads that file when config.json has no quantization_config
    (vllm/model_executor/model_loader/weight_utils.py get_quant_config; ModelOptNvFp4Config.from_config takes
    its "quantization" section: quant_algo, group_size, exclude_modules).
    """
    if data.get("quantization_config"):
        return
    extra = folder / "hf_quant_config.json"
    if not extra.is_file():
        return
    try:
        quant = json.loads(read_text(extra, max_bytes=MAX_CONFIG_BYTES, field=str(extra), what="a JSON file",
                                     fix="restore the checkpoint's hf_quant_config.json"))
    except (ValueError, RecursionError) as exc:
        raise ConfigError(f"{extra} is not readable JSON ({exc})", field=str(extra),
                          fix="restore the checkpoint's hf_quant_config.json") from exc
    section = quant.get("quantization") if isinstance(quant, dict) else None
    if not isinstance(section, dict) or not section.get("quant_algo"):
        raise ConfigError(f"{extra} has no quantization.quant_algo", field=f"{extra}: quantization.quant_algo",
                          fix="restore the checkpoint's hf_quant_config.json")
    data["quantization_config"] = {"quant_method": "modelopt", **section}
