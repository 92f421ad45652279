"""Token-length distributions: fixed, normal, lognormal, a histogram, or the quantiles read from a trace.

Every kind is reduced to the same deterministic sample (`points`: QUANTILE_POINTS values at the mid-quantiles
(i + 0.5) / n), so the performance model, the SLA arithmetic and the synthetic trace a real trial replays all see
the same lengths, and a fixed length stays exactly that length everywhere.
"""

from __future__ import annotations

import math
from functools import cached_property
from statistics import NormalDist
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_TOKENS = 10_000_000  # far above any context length: a bound for typed-in values
QUANTILE_POINTS = 64  # samples a distribution is reduced to (the perf model's and the SLA's resolution)
TAIL_QUANTILE = 0.999  # an unbounded distribution's longest request, for --max-model-len and the memory check


def _z(probabilities: np.ndarray) -> np.ndarray:
    """Standard-normal quantiles (the standard library's: scipy's import would slow every process that reads a
    workload, the Ray watchdog included)."""
    normal = NormalDist()
    return np.array([normal.inv_cdf(float(p)) for p in probabilities])


class _Lengths(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    def _raw_points(self, probabilities: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    @cached_property
    def points(self) -> np.ndarray:
        """QUANTILE_POINTS lengths (int tokens >= 1) at the mid-quantiles, ascending."""
        p = (np.arange(QUANTILE_POINTS) + 0.5) / QUANTILE_POINTS
        values = np.clip(np.rint(self._raw_points(p)), 1, self.longest)
        return np.sort(values.astype(np.int64))

    @property
    def expected(self) -> float:
        """The mean of the sample (a clipped distribution's mean, not its parameter)."""
        return float(self.points.mean())

    @property
    def typical_tokens(self) -> int:
        """The representative length: the mean, rounded (a fixed length is itself)."""
        return max(1, round(self.expected))

    @property
    def longest(self) -> int:
        """The longest request: for --max-model-len and the memory check."""
        raise NotImplementedError

    def quantile(self, q: float) -> float:
        return float(np.quantile(self.points, q))

    def describe(self) -> str:
        raise NotImplementedError


class FixedLengths(_Lengths):
    """Every request has the same length (today's ISL/OSL point)."""

    distribution: Literal["fixed"] = "fixed"
    tokens: int = Field(ge=1, le=MAX_TOKENS)

    def _raw_points(self, probabilities: np.ndarray) -> np.ndarray:
        return np.full(probabilities.shape, float(self.tokens))

    @property
    def longest(self) -> int:
        return self.tokens

    def describe(self) -> str:
        return f"{self.tokens:,}"


class NormalLengths(_Lengths):
    """Normal, clipped to [min_tokens, max_tokens] (AIPerf's --synthetic-input-tokens-mean/-stddev)."""

    distribution: Literal["normal"] = "normal"
    mean: float = Field(gt=0, le=MAX_TOKENS)
    stddev: float = Field(ge=0, le=MAX_TOKENS)
    min_tokens: int = Field(1, ge=1, le=MAX_TOKENS)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _bounds(self) -> NormalLengths:
        if self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise ValueError("max_tokens must be >= min_tokens")
        return self

    def _raw_points(self, probabilities: np.ndarray) -> np.ndarray:
        return np.maximum(self.mean + self.stddev * _z(probabilities), self.min_tokens)

    @property
    def longest(self) -> int:
        if self.max_tokens is not None:
            return self.max_tokens
        return max(self.min_tokens, math.ceil(self.mean + 4 * self.stddev))

    def describe(self) -> str:
        return f"normal(mean {self.mean:,.0f}, sd {self.stddev:,.0f})"


class LogNormalLengths(_Lengths):
    """Lognormal with the given mean and stddev in tokens (chat and agent traffic: a long right tail)."""

    distribution: Literal["lognormal"] = "lognormal"
    mean: float = Field(gt=0, le=MAX_TOKENS)
    stddev: float = Field(gt=0, le=MAX_TOKENS)
    max_tokens: int | None = Field(None, ge=1, le=MAX_TOKENS)

    @property
    def _sigma_mu(self) -> tuple[float, float]:
        sigma2 = math.log1p((self.stddev / self.mean) ** 2)
        return math.sqrt(sigma2), math.log(self.mean) - sigma2 / 2

    def _raw_points(self, probabilities: np.ndarray) -> np.ndarray:
        sigma, mu = self._sigma_mu
        return np.exp(mu + sigma * _z(probabilities))

    @property
    def longest(self) -> int:
        if self.max_tokens is not None:
            return self.max_tokens
        sigma, mu = self._sigma_mu
        return min(MAX_TOKENS, math.ceil(math.exp(mu + sigma * NormalDist().inv_cdf(TAIL_QUANTILE))))

    def describe(self) -> str:
        return f"lognormal(mean {self.mean:,.0f}, sd {self.stddev:,.0f})"


class HistogramLengths(_Lengths):
    """A histogram: [tokens, weight] pairs (e.g. the lengths a dashboard shows for a production endpoint)."""

    distribution: Literal["histogram"] = "histogram"
    bins: tuple[tuple[int, float], ...] = Field(min_length=1, max_length=10_000)

    @model_validator(mode="after")
    def _valid(self) -> HistogramLengths:
        if any(not 1 <= tokens <= MAX_TOKENS for tokens, _ in self.bins):
            raise ValueError(f"every bin's tokens must be in 1..{MAX_TOKENS:,}")
        if any(weight < 0 for _, weight in self.bins) or sum(w for _, w in self.bins) <= 0:
            raise ValueError("weights must be >= 0 and sum to more than 0")
        return self

    def _raw_points(self, probabilities: np.ndarray) -> np.ndarray:
        ordered = sorted(self.bins)
        tokens = np.array([t for t, _ in ordered], dtype=float)
        cdf = np.cumsum([w for _, w in ordered], dtype=float)
        cdf /= cdf[-1]
        return tokens[np.minimum(np.searchsorted(cdf, probabilities, side="left"), len(tokens) - 1)]

    @property
    def longest(self) -> int:
        return max(t for t, w in self.bins if w > 0)

    def describe(self) -> str:
        return f"histogram({len(self.bins)} bins, mean {self.expected:,.0f})"


class EmpiricalLengths(_Lengths):
    """The lengths a trace held, as its 101 percentiles p0..p100 (what `topotune workload FILE` reads)."""

    distribution: Literal["empirical"] = "empirical"
    percentiles: tuple[int, ...] = Field(min_length=2, max_length=1001)

    @model_validator(mode="after")
    def _valid(self) -> EmpiricalLengths:
        if any(not 1 <= v <= MAX_TOKENS for v in self.percentiles) or list(self.percentiles) != sorted(
                self.percentiles):
            raise ValueError(f"percentiles must be ascending token counts in 1..{MAX_TOKENS:,}")
        return self

    def _raw_points(self, probabilities: np.ndarray) -> np.ndarray:
        grid = np.linspace(0.0, 1.0, len(self.percentiles))
        return np.interp(probabilities, grid, np.asarray(self.percentiles, dtype=float))

    @property
    def longest(self) -> int:
        return self.percentiles[-1]

    def describe(self) -> str:
        p = self.percentiles
        return f"trace(p50 {self.quantile(0.5):,.0f}, p99 {self.quantile(0.99):,.0f}, max {p[-1]:,})"


Lengths = Annotated[FixedLengths | NormalLengths | LogNormalLengths | HistogramLengths | EmpiricalLengths,
                    Field(discriminator="distribution")]


def as_lengths(value: object) -> object:
    """A bare integer is a fixed length: `isl: 8192` and `input_tokens: 8192` mean the same thing."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return {"distribution": "fixed", "tokens": value}
    return value
