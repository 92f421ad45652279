"""A new model's guard: once its first trials are in, is what the cluster taught it better than the defaults?

The transferred prior (learnt calibration and per-layout offsets, tuner.cluster._knowledge) was fitted on other
models' runs only, so the new model's own first trials are held out from it. On them the guard scores the prior
(mean |log predicted/measured| of rate and latency, every level) against the documented default, then, part by part,
against the same prior with that part put back to its default: each transferred factor that moved, and the
per-layout offsets. A part whose default predicts these trials better by more than GUARD_MARGIN falls back (one at
a time, the largest gain first, each judged against what is left); if the prior is still worse than the documented
default as a whole, everything falls back. Each decision is kept with its figures, so `topotune calibrate
--storage` and the cluster page say what fell back and why.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner.cluster._fit import FitSample, _rows
from tuner.cluster._knowledge import ClusterKnowledge
from tuner.hardware import GpuSpec
from tuner.perf import Calibration

#: Measured trials of the new model before the guard decides (each has every concurrency level).
GUARD_TRIALS = 3
#: How much lower (mean |log|) a part's default must put the error on those trials before the part falls back: on
#: three trials a factor that does not matter moves the error by a few 1e-4 either way, which is noise, not evidence
#: (benchmarks/transfer.py on truths 0-2: without it, a third of the shared factors fell back for gains under 0.001).
GUARD_MARGIN = 0.005
OFFSETS = "layout offsets"


@dataclass(frozen=True)
class GuardCheck:
    """One transferred part on the new model's first trials: the error with it, and with its default instead."""

    part: str  # a factor's name, or OFFSETS
    error_transferred: float
    error_default: float
    kept: bool

    def reason(self) -> str:
        verb = "kept" if self.kept else "fell back to the default"
        return (f"{self.part}: {verb} (error {self.error_transferred:.3f} transferred, {self.error_default:.3f} "
                f"at the default)")


@dataclass(frozen=True)
class GuardVerdict:
    """What the guard decided for one model's study, on its first `trials` measured trials."""

    model: str
    trials: int
    error_prior: float  # the transferred prior on those trials
    error_default: float  # the documented calibration, no offsets
    error_after: float  # the prior after its fallbacks
    checks: tuple[GuardCheck, ...]
    whole_fallback: bool = False  # even after the per-part fallbacks the default was better: nothing transferred

    @property
    def fell_back(self) -> tuple[str, ...]:
        return tuple(c.part for c in self.checks if not c.kept)

    def summary(self) -> str:
        if self.whole_fallback:
            what = "the whole prior fell back to the documented default"
        elif self.fell_back:
            what = f"fell back: {', '.join(self.fell_back)}"
        else:
            what = "the transferred prior kept"
        return (f"{self.model}: {what} (first {self.trials} trials: error {self.error_prior:.3f} transferred, "
                f"{self.error_default:.3f} default, {self.error_after:.3f} after the guard)")

    def as_json(self) -> dict:
        return {"model": self.model, "trials": self.trials, "error_prior": _finite(self.error_prior),
                "error_default": _finite(self.error_default), "error_after": _finite(self.error_after),
                "whole_fallback": self.whole_fallback, "fell_back": list(self.fell_back),
                "checks": [{"part": c.part, "error_transferred": _finite(c.error_transferred),
                            "error_default": _finite(c.error_default), "kept": c.kept} for c in self.checks]}

    @classmethod
    def from_json(cls, data: dict) -> GuardVerdict:
        checks = tuple(GuardCheck(c["part"], _nan(c["error_transferred"]), _nan(c["error_default"]), c["kept"])
                       for c in data["checks"])
        return cls(data["model"], data["trials"], _nan(data["error_prior"]), _nan(data["error_default"]),
                   _nan(data["error_after"]), checks, data.get("whole_fallback", False))


def _finite(x: float) -> float | None:
    return None if math.isnan(x) else float(x)


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


def prior_error(samples: Sequence[FitSample], gpu: GpuSpec, calibration: Calibration,
                knowledge: ClusterKnowledge | None) -> float:
    """Mean |log predicted/measured| of the rate and the role's latency, every level, of a prior: `calibration`,
    and `knowledge`'s per-layout offsets when given (a log-factor on the rate, minus one on the latency)."""
    rows = _rows(samples, gpu, calibration)
    if not len(rows.values):
        return math.nan
    values = rows.values
    if knowledge is not None:
        shift = np.empty(len(values))
        for i, j in enumerate(rows.sample):
            s = samples[j]
            log_rate, log_speed = knowledge.offset(s.role, s.topology)
            shift[i] = log_rate if rows.sign[i] > 0 else -log_speed
        values = values + shift
    return float(np.mean(np.abs(values)))


def guard(knowledge: ClusterKnowledge, samples: Sequence[FitSample], gpu: GpuSpec,
          model: str) -> tuple[ClusterKnowledge, GuardVerdict]:
    """The knowledge the new model keeps after its first trials (`samples`, which the knowledge never saw), and
    why."""
    default = knowledge.default
    with_offsets = bool(knowledge.layout_offsets or knowledge.trends)
    error_default = prior_error(samples, gpu, default, None)
    error_prior = prior_error(samples, gpu, knowledge.calibration, knowledge if with_offsets else None)
    calibration, offsets_on = knowledge.calibration, with_offsets
    parts = [n for n, (a, b) in knowledge.moved().items() if not math.isclose(a, b, rel_tol=1e-9)]
    parts += [OFFSETS] if with_offsets else []
    current = error_prior
    checks: list[GuardCheck] = []
    remaining = list(parts)

    def without(part: str) -> tuple[Calibration, bool]:
        if part == OFFSETS:
            return calibration, False
        return calibration.model_copy(update={part: getattr(default, part)}), offsets_on

    while remaining:  # greedy: the fallback that helps most first, each judged against what is left
        scored = []
        for part in remaining:
            cal, on = without(part)
            scored.append((prior_error(samples, gpu, cal, knowledge if on else None), part))
        best_error, best = min(scored)
        if not best_error < current - GUARD_MARGIN:
            checks += [GuardCheck(p, current, e, True) for e, p in scored]
            break
        checks.append(GuardCheck(best, current, best_error, False))
        calibration, offsets_on = without(best)
        current = best_error
        remaining.remove(best)
    whole = bool(current > error_default)
    if whole:
        calibration, offsets_on, current = default, False, error_default
    verdict = GuardVerdict(model, len(samples), error_prior, error_default, current,
                           tuple(sorted(checks, key=lambda c: parts.index(c.part))), whole)
    kept = dataclasses.replace(
        knowledge, calibration=calibration,
        layout_offsets=knowledge.layout_offsets if offsets_on else {},
        trends=knowledge.trends if offsets_on else {})
    return kept, verdict

