"""Did a re-measured config change? A Welch test on log throughput that cannot be fooled by a lucky run.

Throughput noise is multiplicative (a busy node slows every request by a share), so runs are compared as logs.
The stored measurement is usually one run, and repeated runs on a quiet (or simulated) cluster can agree to the
last digit: neither then estimates the run-to-run spread. Each side's standard deviation is therefore at least
NOISE_FLOOR, the log-sd of one AIPerf run on a warm server (a few percent); a side whose spread comes from the
floor is treated as known (normal quantiles), otherwise Welch's t with Welch-Satterthwaite degrees of freedom.
A change is reported when it is significant at ALPHA (two-sided) and at least MIN_EFFECT in size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from tuner.errors import ConfigError

NOISE_FLOOR = 0.03  # log-sd of one run's throughput when the samples cannot tell (one run, identical repeats)
ALPHA = 0.01  # two-sided significance of a reported change
MIN_EFFECT = 0.03  # smaller changes are "unchanged" even when significant: not worth re-opening a search


class Verdict(StrEnum):
    UNCHANGED = "unchanged"
    FASTER = "faster"
    SLOWER = "slower"
    NO_LONGER_STARTS = "no longer starts"


@dataclass(frozen=True)
class NoiseTest:
    """The test's settings (what `topotune reverify` and the API accept)."""

    noise_floor: float = NOISE_FLOOR
    alpha: float = ALPHA
    min_effect: float = MIN_EFFECT

    def __post_init__(self) -> None:
        if not 0 < self.noise_floor < 1:
            raise ConfigError(f"must be in (0, 1), got {self.noise_floor}", field="noise_floor",
                              fix="give a log-sd such as 0.03 (3% run-to-run spread)")
        if not 0 < self.alpha < 0.5:
            raise ConfigError(f"must be in (0, 0.5), got {self.alpha}", field="alpha", fix="e.g. 0.01")
        if not 0 <= self.min_effect < 1:
            raise ConfigError(f"must be in [0, 1), got {self.min_effect}", field="min_effect", fix="e.g. 0.03")

    def compare(self, old_tok_s: Sequence[float], new_tok_s: Sequence[float]) -> Comparison:
        """Stored runs vs new runs of one config at one concurrency level (throughput, any positive unit)."""
        if not old_tok_s or not new_tok_s or min(*old_tok_s, *new_tok_s) <= 0:
            raise ConfigError("each side needs at least one positive throughput", field="runs",
                              fix="compare measured (non-failed) runs")
        a, b = [math.log(v) for v in old_tok_s], [math.log(v) for v in new_tok_s]
        (ma, va, fa), (mb, vb, fb) = self._side(a), self._side(b)
        se = math.sqrt(va / len(a) + vb / len(b))
        t = (mb - ma) / se
        if fa or fb:
            df = math.inf
        else:
            df = (va / len(a) + vb / len(b)) ** 2 / ((va / len(a)) ** 2 / (len(a) - 1) + (vb / len(b)) ** 2
                                                      / (len(b) - 1))
        from scipy import stats  # ~0.45 s to import: paid by a comparison, not by every `import tuner.study`

        p = float(2 * (stats.norm.sf(abs(t)) if math.isinf(df) else stats.t.sf(abs(t), df)))
        ratio = math.exp(mb - ma)
        changed = p < self.alpha and abs(ratio - 1) >= self.min_effect
        verdict = Verdict.UNCHANGED if not changed else Verdict.FASTER if ratio > 1 else Verdict.SLOWER
        return Comparison(old_tok_s=math.exp(ma), new_tok_s=math.exp(mb), ratio=ratio, t=t, df=df, p_value=p,
                          old_runs=len(a), new_runs=len(b), verdict=verdict)

    def _side(self, logs: list[float]) -> tuple[float, float, bool]:
        """(mean, variance used, whether the floor set it)."""
        mean = sum(logs) / len(logs)
        var = sum((x - mean) ** 2 for x in logs) / (len(logs) - 1) if len(logs) > 1 else 0.0
        floor = self.noise_floor ** 2
        return (mean, floor, True) if var <= floor else (mean, var, False)

    def detectable_ratio(self, old_runs: int, new_runs: int) -> float:
        """The smallest speed ratio (> 1) reported as a change when both sides' spread is at the floor: a
        change of a factor beyond it (or below its inverse) is always reported, one inside it never."""
        from scipy import stats

        se = self.noise_floor * math.sqrt(1 / old_runs + 1 / new_runs)
        return max(math.exp(float(stats.norm.isf(self.alpha / 2)) * se), 1 + self.min_effect)


@dataclass(frozen=True)
class Comparison:
    old_tok_s: float  # geometric mean of the stored runs
    new_tok_s: float
    ratio: float  # new / old (> 1: faster)
    t: float
    df: float  # inf: a side's spread came from the noise floor (normal quantiles)
    p_value: float
    old_runs: int
    new_runs: int
    verdict: Verdict

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = str(self.verdict)
        out["df"] = None if math.isinf(self.df) else self.df
        return out
