"""The knobs of one phase run: budget, sampler, warm start, and the timings of trials and heartbeats."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TuneOptions:
    trials: int = 40  # launched (backend) trials per phase; screened-out configs do not count
    sampler: str = "auto"  # guided: the simulator's prediction corrected by a learnt residual (_guided.py)
    seed: int = 0
    warm_start: bool = True
    warm_start_trials: int | None = None  # default: a quarter of the budget
    trial_timeout_s: float = 3600.0
    heartbeat_s: float = 5.0
    stale_after_s: float = 120.0  # a RUNNING trial whose heartbeat is older belongs to a dead driver
    max_screened_per_trial: int = 25  # give up when the sampler keeps proposing configs that cannot run
