"""Live progress of a phase run: the events the CLI's progress view and the service hear, as trials move."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuner.study._trial_record import EventKind
from tuner.topology import Topology


@dataclass
class TrialEvent:
    """What the progress view and the API hear about."""

    phase: str
    number: int
    kind: EventKind
    label: str
    detail: str = ""
    values: tuple[float, float] | None = None


ProgressCallback = Callable[[TrialEvent], None]


def trial_label(params: dict[str, Any]) -> str:
    """A trial's config in one line, as a person reads it (e.g. `TP4DP2+EP MTP1 seqs=64 util=0.9`)."""
    tp, dp = params.get("tp", 1), params.get("dp", 1)
    name = Topology(tp=tp, dp=dp, ep=bool(params.get("ep"))).name  # EP on one GPU names no EP
    mtp = f" MTP{params['mtp']}" if params.get("mtp") else ""
    return f"{name}{mtp} seqs={params.get('max_num_seqs')} util={params.get('gpu_memory_utilization')}"
