"""A study's history per vLLM version (and model revision): which measurement of a config is current, and the
front each version measured.

Every measured trial is tagged with what it ran on (TrialAttrs.vllm_version / model_revision; "unknown" for
trials stored before). A re-verification (`topotune reverify`, kind "reverify") measures a config again: from
then on the config's current points are that measurement's (none when it no longer starts), and its older points
are history, kept for the per-version fronts and never on the current front or in an export. A study that was
never re-verified is unchanged by this: every point is current.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tuner.frontier import pareto_front
from tuner.study._records import StoredPoint
from tuner.study._trial_record import UNKNOWN_VERSION, TrialKind, TrialRecord


def config_key(params: dict[str, Any]) -> tuple:
    """A configuration, whatever concurrency level a trial of it reports (the driver's dedupe key)."""
    return tuple(sorted((k, v) for k, v in params.items() if k != "concurrency"))


@dataclass(frozen=True)
class VersionTag:
    """What a measurement ran on."""

    vllm_version: str = UNKNOWN_VERSION
    model_revision: str = UNKNOWN_VERSION

    @property
    def label(self) -> str:
        """"vLLM 0.32.0" (plus the model revision when known): the legend of a per-version front."""
        if self.vllm_version == UNKNOWN_VERSION and self.model_revision == UNKNOWN_VERSION:
            return "version unknown (stored before versions were kept)"
        rev = "" if self.model_revision == UNKNOWN_VERSION else f" · model {self.model_revision[:7]}"
        return f"vLLM {self.vllm_version}{rev}"

    @classmethod
    def of(cls, item: StoredPoint | TrialRecord) -> VersionTag:
        return cls(item.vllm_version, item.model_revision)


def latest_reverification(records: list[TrialRecord]) -> dict[tuple, int]:
    """Config key -> the number of its newest re-verification trial (measured, or failed to start)."""
    out: dict[tuple, int] = {}
    for r in records:
        if r.kind is TrialKind.REVERIFY:
            key = config_key(r.params)
            out[key] = max(out.get(key, -1), r.number)
    return out


def split_current(points: list[StoredPoint], records: list[TrialRecord]
                  ) -> tuple[list[StoredPoint], list[StoredPoint]]:
    """(current points, superseded points): a point is superseded when its config was re-verified after it."""
    latest = latest_reverification(records)
    if not latest:
        return points, []
    current, old = [], []
    for p in points:
        newest = latest.get(config_key(p.params))
        (old if newest is not None and p.trial < newest else current).append(p)
    return current, old


def version_fronts(points: list[StoredPoint]) -> dict[VersionTag, list[StoredPoint]]:
    """The feasible front of what each version measured (current and superseded points alike), oldest first."""
    by_tag: dict[VersionTag, list[StoredPoint]] = {}
    for p in sorted(points, key=lambda p: p.trial):
        if p.feasible:
            by_tag.setdefault(VersionTag.of(p), []).append(p)
    return {tag: pareto_front(pts, x=lambda q: q.values[0], y=lambda q: q.values[1]) for tag, pts in by_tag.items()}


def current_tag(records: list[TrialRecord]) -> VersionTag | None:
    """What the study's newest measurement ran on (None: nothing measured yet)."""
    measured = [r for r in records if r.kind in (TrialKind.SAMPLED, TrialKind.REVERIFY) and r.attrs.outcome]
    return VersionTag.of(max(measured, key=lambda r: r.number)) if measured else None
