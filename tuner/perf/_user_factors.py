"""A user's calibration factors over the GPU's defaults: a mapping, or a YAML/JSON file of one.

The file is read like every YAML a user hands topotune (tuner/files.py: a regular file under its size bound;
tuner/_yaml.py: aliases, merge keys and nesting bounded before anything walks it). Every factor is checked
strictly (a number, finite; not a string or a boolean YAML would coerce), so a typo or a quoted value is an error
naming `calibration.<factor>` and the fix, never a silent default. The CLI renames `calibration` to its flag.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from tuner._yaml import safe_load_bounded
from tuner.errors import ConfigError, config_error
from tuner.files import read_text
from tuner.perf._calibration import Calibration, default_calibration

MAX_CALIBRATION_FILE_BYTES = 64 * 1024  # a mapping of two dozen factors
FACTOR_LIST = "the factor list in docs/perf-model.md"
_MAPPING_FIX = "write a mapping of factor: value, e.g. `hbm_efficiency: 0.8`"

CalibrationSource = Mapping[str, float] | str | Path


def read_calibration_file(path: str | Path) -> dict[str, object]:
    """The mapping a calibration file holds (factors not checked yet: `calibrated` checks them)."""
    text = read_text(path, max_bytes=MAX_CALIBRATION_FILE_BYTES, field="calibration",
                     fix="a calibration file is a short YAML or JSON mapping of factor: value",
                     what="a calibration file (YAML or JSON)")
    try:
        data = safe_load_bounded(text, str(path), what="the calibration file", example=FACTOR_LIST)
    except ConfigError as exc:  # the guard names the file (and line): keep it, under the request's field
        raise ConfigError(f"{exc.field}: {exc.message}", field="calibration", fix=exc.fix) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds {_kind(data)}, not a mapping of factor: value",
                          field="calibration", fix=_MAPPING_FIX)
    return data


def calibrated(gpu_name: str, factors: CalibrationSource | None) -> Calibration:
    """The GPU's default calibration with `factors` (a mapping, or a calibration file's path) over it; an error
    names `calibration.<factor>` and the fix."""
    base = default_calibration(gpu_name)
    if isinstance(factors, str | Path):
        factors = read_calibration_file(factors)
    if not factors:
        return base
    if not isinstance(factors, Mapping):
        raise ConfigError(f"expected a mapping of factor: value, got {_kind(factors)}",
                          field="calibration", fix=_MAPPING_FIX)
    for name, value in factors.items():
        _check_factor(name, value, base)
    try:
        return Calibration.model_validate({**base.model_dump(), **factors}, strict=True)
    except ValidationError as exc:  # a bound: every name and type was checked above
        plain = config_error(exc, "calibration")
        name = (plain.field or "").removeprefix("calibration.")
        raise ConfigError(plain.message, field=plain.field, fix=_default_fix(name, base, gpu_name)) from exc


def _check_factor(name: object, value: object, base: Calibration) -> None:
    """A known factor name and a finite number (pydantic's own checks then apply the bounds)."""
    if not isinstance(name, str):
        raise ConfigError(f"a factor is named by text, got {name!r}", field=f"calibration.{name}",
                          fix=f"use a factor name from {FACTOR_LIST}")
    if name not in Calibration.model_fields:
        near = difflib.get_close_matches(name, list(Calibration.model_fields), n=1)
        hint = f"did you mean `{near[0]}`? " if near else ""
        raise ConfigError(f"unknown factor {name!r}", field=f"calibration.{name}",
                          fix=f"{hint}the factors: {', '.join(Calibration.model_fields)}")
    optional = Calibration.model_fields[name].default is None
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"must be a number, got {_kind(value)}", field=f"calibration.{name}",
                          fix=f"write it unquoted, e.g. `{name}: {base.factor(name):g}`"
                              + (" (or null: the default)" if optional else ""))
    if not math.isfinite(value):
        raise ConfigError(f"must be finite, got {value}", field=f"calibration.{name}",
                          fix=f"e.g. `{name}: {base.factor(name):g}` (see {FACTOR_LIST} for its bounds)")


def _kind(value: object) -> str:
    """A value as YAML spells its kind, for messages."""
    if value is None:
        return "null"
    kind = {bool: "a boolean", str: "text", list: "a list", dict: "a mapping"}.get(type(value))
    return f"{kind} ({value!r})" if kind and not isinstance(value, list | dict) else kind or repr(value)


def _default_fix(name: str, base: Calibration, gpu_name: str) -> str:
    if name in Calibration.model_fields:
        return f"keep it within its bounds ({FACTOR_LIST}); {gpu_name}'s default is {base.factor(name):g}"
    return f"see {FACTOR_LIST}"
