"""Parsing of human-readable sizes, as vLLM's flags accept them."""

from __future__ import annotations

import re

from tuner.errors import ConfigError

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT]?)(i?[bB])?\s*$")
_DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_bytes(text: str | int, field: str) -> int:
    """'40G' = 40 GiB, '40g' = 40e9 (vLLM's human_readable_int), plain integers are bytes."""
    if isinstance(text, int):
        value = text
    else:
        match = _SIZE_RE.match(str(text))
        if not match:
            raise ConfigError(f"cannot read {text!r} as a size", field=field,
                              fix="give bytes, or a number with K/M/G (binary) or k/m/g (decimal), e.g. 40G")
        number, unit, suffix = match.groups()
        binary = unit in _BINARY or bool(suffix and suffix.lower() == "ib" and unit)
        scale = _BINARY[unit.upper()] if binary else _DECIMAL[unit.lower()]
        value = int(float(number) * scale)
    if value <= 0:
        raise ConfigError(f"{text!r} must be positive", field=field, fix="give a positive size")
    return value
