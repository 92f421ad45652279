"""Expert-parallel load: how far the busiest EP rank sits above the mean, and what EPLB takes off.

With expert parallelism every rank waits for the slowest one in each MoE layer, so a step pays for the busiest
rank's routed tokens and activated experts, not the mean. Two effects make ranks uneven:

- sampling: with few tokens per step, top-k choices land unevenly even under uniform routing (Poisson noise,
  relative spread 1/sqrt(assignments per expert));
- popularity: real traffic prefers some experts (`expert_popularity_cv`); EPLB replicates hot experts onto
  redundant slots and leaves `eplb_residual_skew` of that skew.

A rank holds E/EP experts, so its load is a sum over them: relative spread
`sqrt((cv^2 + 1/mean_per_expert) / (E/EP))`. The expected maximum over EP ranks of roughly normal loads is
`mean + spread x sqrt(2 ln EP)` (the Gumbel limit), capped by what one rank can physically receive. Experts
split by tensor parallelism (no EP) are perfectly balanced: every GPU holds a slice of every expert.
"""

from __future__ import annotations

import math

from tuner.perf._calibration import Calibration


def effective_skew(cal: Calibration, ep_size: int, redundant_experts: int) -> float:
    """Popularity CV left after EPLB: full skew without redundant experts, the residual once each rank has one."""
    if redundant_experts <= 0:
        return cal.expert_popularity_cv
    coverage = min(1.0, redundant_experts / ep_size)
    return cal.expert_popularity_cv * (1.0 - (1.0 - cal.eplb_residual_skew) * coverage)


def busiest_rank_factor(tokens: float, *, num_experts: int, experts_per_token: int, ep_size: int,
                        redundant_experts: int, cal: Calibration) -> float:
    """Busiest EP rank's routed assignments over the mean rank's (>= 1) for `tokens` tokens in the EP group."""
    if ep_size <= 1 or tokens <= 0 or num_experts <= 0:
        return 1.0
    assignments = tokens * experts_per_token
    per_expert = assignments / num_experts
    experts_per_rank = num_experts / ep_size
    skew = effective_skew(cal, ep_size, redundant_experts)
    spread = math.sqrt((skew * skew + 1.0 / per_expert) / experts_per_rank)
    factor = 1.0 + spread * math.sqrt(2.0 * math.log(ep_size))
    # one rank can take at most min(k, its experts) of each token's choices
    cap = ep_size * min(experts_per_token, experts_per_rank) / experts_per_token
    return min(factor, max(1.0, cap))


def active_fraction(assignments_per_rank: float, experts_per_rank: float) -> float:
    """Expected share of a rank's experts touched by this many routed assignments (spread over its experts)."""
    if assignments_per_rank <= 0 or experts_per_rank <= 0:
        return 0.0
    return 1.0 - math.exp(-assignments_per_rank / experts_per_rank)
