"""Which instance a request goes to: the router in front of the replicas, and vLLM's DP balancer inside one.

- round_robin: the next instance in turn.
- least_loaded: the instance with the fewest requests in flight (routed, not yet answered).
- cache_aware: vllm-router's policy (src/policies/cache_aware.rs `CacheAwarePolicy`, defaults from
  src/policies/mod.rs `CacheAwareConfig::default`: cache_threshold 0.5, balance_abs_threshold 32,
  balance_rel_threshold 1.1). Loads imbalanced (max - min > 32 and max > 1.1 x min): the least-loaded instance.
  Else the instance whose approximate tree (every prompt routed to it) shares the longest prefix with the prompt,
  if that match covers more than half of it; else the instance with the smallest tree. The router's tree is
  kept here in prompt units, not characters, and never evicted (its max_tree_size is far above a replay's).
- Inside an instance, vLLM's DP load balancer (vllm/v1/engine/core_client.py
  `DPLBAsyncMPClient.get_core_engine_for_request`): the rank of lowest waiting + running, waiting weighted up by
  6 x (KV usage - 0.5) when the cache is over half full, the scan starting one rank later each time.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

from tuner.replay._requests import RequestSpec
from tuner.router import REPLAYED_POLICIES, RouterPolicy

CACHE_THRESHOLD = 0.5
BALANCE_ABS_THRESHOLD = 32
BALANCE_REL_THRESHOLD = 1.1


def check_router(name: str, field: str = "router") -> RouterPolicy:
    """The replayed policy `name` names (vllm-router's spelling, or the older hyphenated one)."""
    return RouterPolicy.parse(name, field=field, allowed=REPLAYED_POLICIES)


class RankState(Protocol):
    @property
    def waiting_count(self) -> int: ...
    @property
    def running_count(self) -> int: ...
    @property
    def kv_usage(self) -> float: ...


class Router:
    """Picks an instance for each request; `loads` are the requests in flight per instance."""

    def __init__(self, policy: RouterPolicy, instances: int) -> None:
        self.policy = check_router(policy)
        self.instances = instances
        self._next = 0
        self._trees: list[set[Hashable]] = [set() for _ in range(instances)]

    def pick(self, spec: RequestSpec, loads: Sequence[int]) -> int:
        n = self.instances
        if n == 1:
            return 0
        if self.policy is RouterPolicy.ROUND_ROBIN:
            choice = self._next
            self._next = (self._next + 1) % n
            return choice
        least = min(range(n), key=loads.__getitem__)
        if self.policy is RouterPolicy.LEAST_LOADED:
            return least
        high, low = max(loads), loads[least]
        if high - low > BALANCE_ABS_THRESHOLD and high > low * BALANCE_REL_THRESHOLD:
            choice = least
        else:
            choice = self._best_match(spec)
        self._trees[choice].update(key for key, _ in spec.units)
        return choice

    def _best_match(self, spec: RequestSpec) -> int:
        best, best_tokens = 0, -1
        for index, tree in enumerate(self._trees):
            tokens = 0
            for key, blocks in spec.units:
                if key not in tree:
                    break
                tokens += blocks
            if tokens > best_tokens:
                best, best_tokens = index, tokens
        # units are in blocks: compare with the prompt's blocks (a unit-free prompt matches nothing)
        prompt_blocks = max(1, sum(b for _, b in spec.units)) if spec.units else 1
        if spec.units and best_tokens / prompt_blocks > CACHE_THRESHOLD and best_tokens > 0:
            return best
        return min(range(self.instances), key=lambda i: len(self._trees[i]))


class DpBalancer:
    """vLLM's DP load balancer over one instance's ranks."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self._start = 0

    def pick(self, states: Sequence[RankState]) -> int:
        if self.ranks == 1:
            return 0
        best, best_score = 0, float("inf")
        for i in range(self.ranks):
            idx = (self._start + i) % self.ranks
            s = states[idx]
            score = float(s.waiting_count + s.running_count)
            if s.waiting_count:
                score += s.waiting_count * 6.0 * max(0.0, s.kv_usage - 0.5)
            if score < best_score:
                best, best_score = idx, score
        self._start = (self._start + 1) % self.ranks
        return best
