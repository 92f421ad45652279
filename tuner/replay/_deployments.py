"""`--deployment` strings: "2P:TP4,1D:TP8" (PD: prefill and decode instances) or "2x:TP8" (replicas)."""

from __future__ import annotations

import re

from tuner.deployment import Deployment
from tuner.errors import ConfigError
from tuner.topology import Role, Topology

_PART = re.compile(r"^\s*(?:(\d+)\s*([PDX])\s*:)?\s*([A-Z0-9+]+)\s*$")
_FIX = 'write it like "2P:TP4,1D:TP8" (prefill and decode instances) or "2x:TP8" (replicas of one)'


def parse_deployment(text: str, **topology_fields: object) -> Deployment:
    """The deployment a string names; each topology takes the serve options in `topology_fields`."""
    parts = [p for p in text.upper().split(",") if p.strip()]
    if not parts:
        raise ConfigError("empty deployment", field="--deployment", fix=_FIX)
    groups: dict[str, tuple[int, Topology]] = {}
    for part in parts:
        match = _PART.match(part)
        if not match:
            raise ConfigError(f"cannot read {part.strip()!r}", field="--deployment", fix=_FIX)
        count = int(match.group(1) or 1)
        kind = match.group(2) or "X"
        if count < 1 or count > 4096:
            raise ConfigError(f"{count} instances in {part.strip()!r}", field="--deployment",
                              fix="give 1..4096 instances per role")
        if kind in groups:
            raise ConfigError(f"role {kind} given twice", field="--deployment", fix=_FIX)
        role = {"P": Role.PREFILL, "D": Role.DECODE, "X": Role.BOTH}[kind]
        try:
            topo = Topology.parse(match.group(3), role=role, **topology_fields)
        except ConfigError as exc:
            raise ConfigError(exc.message, field="--deployment", fix=exc.fix or _FIX) from None
        groups[kind] = (count, topo)
    if "X" in groups and len(groups) > 1:
        raise ConfigError("replicas (x) and PD roles (P, D) in one deployment", field="--deployment", fix=_FIX)
    if "X" in groups:
        count, topo = groups["X"]
        return Deployment.single(topo, count)
    if set(groups) != {"P", "D"}:
        raise ConfigError("a PD deployment needs prefill (P) and decode (D) instances", field="--deployment",
                          fix=_FIX)
    (np_, p), (nd, d) = groups["P"], groups["D"]
    return Deployment.disaggregated(p, np_, d, nd)
