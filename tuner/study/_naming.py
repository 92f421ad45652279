"""Predictable study names: one Optuna study per (model, hardware, workload, phase)."""

from __future__ import annotations

import re

from tuner.errors import ConfigError

_SAFE = re.compile(r"[^A-Za-z0-9._\-]+")


def study_name(model: str, gpu: str, isl: int, osl: int, phase: str) -> str:
    return f"{_SAFE.sub('-', model)}@{gpu}/{isl}x{osl}/{phase}"


def campaign_name(model: str, gpu: str, isl: int, osl: int) -> str:
    """The prefix shared by a campaign's phase studies (what `topotune show` accepts)."""
    return f"{_SAFE.sub('-', model)}@{gpu}/{isl}x{osl}"


def split_name(name: str) -> tuple[str, str | None]:
    """'m@g/8192x1024/decode' -> ('m@g/8192x1024', 'decode'); a campaign name has no phase."""
    head, _, tail = name.rpartition("/")
    if tail in ("prefill", "decode", "aggregated"):
        return head, tail
    if "@" not in name:
        raise ConfigError(f"{name!r} is not a study name", field="STUDY",
                          fix="use a name from `topotune studies`, e.g. model@gpu/8192x1024")
    return name, None
