"""The router's policy: which replica a request goes to, one enum for what the replay runs and what a plan deploys.

It sits at the root (shared vocabulary) because the replay (tuner/replay) simulates it and the operating point
(tuner/operating_point.py) deploys it; neither imports the other. One spelling everywhere, vllm-router's own
`--policy` names (vllm-router 0.1.17's parser, vllm_router/router_args.py: random, round_robin, cache_aware, kv_aware,
power_of_two, consistent_hash, sticky_least_loaded); the replay's least_loaded has no vllm-router counterpart. The
hyphenated spelling `topotune replay --router` took before (cache-aware, round-robin, least-loaded) is still read.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator

from tuner.errors import ConfigError


class RouterPolicy(StrEnum):
    """A router policy, spelled as vllm-router's `--policy` takes it."""

    ROUND_ROBIN = "round_robin"  # the next replica in turn
    CACHE_AWARE = "cache_aware"  # the replica whose prompt tree shares the longest prefix (least loaded if skewed)
    CONSISTENT_HASH = "consistent_hash"  # a hash of a session header (X-Session-ID, ...), which a trace lacks
    POWER_OF_TWO = "power_of_two"  # the less loaded of two replicas drawn at random
    RANDOM = "random"
    KV_AWARE = "kv_aware"  # token cost from the workers' KV events (ZMQ sources the plan does not configure)
    STICKY_LEAST_LOADED = "sticky_least_loaded"  # least loaded, kept per session
    LEAST_LOADED = "least_loaded"  # the replay's only: fewest requests in flight; vllm-router has none such

    @classmethod
    def parse(cls, value: str, *, field: str, allowed: frozenset[RouterPolicy] | None = None) -> RouterPolicy:
        """The policy `value` names (either spelling, `cache_aware` or `cache-aware`), one of `allowed`."""
        choices = sorted(allowed if allowed is not None else cls)
        fix = f"use one of {', '.join(choices)}"
        try:
            policy = cls(_either_spelling(value))
        except ValueError:
            raise ConfigError(f"unknown router policy {value!r}", field=field, fix=fix) from None
        if policy not in choices:
            raise ConfigError(f"router policy {policy} is not available here", field=field, fix=fix)
        return policy


# What vllm-router runs (a plan's `--policy`) and what the replay simulates (tuner/replay/_router.py).
DEPLOYED_POLICIES = frozenset(RouterPolicy) - {RouterPolicy.LEAST_LOADED}
REPLAYED_POLICIES = frozenset({RouterPolicy.ROUND_ROBIN, RouterPolicy.CACHE_AWARE, RouterPolicy.LEAST_LOADED})


def _either_spelling(value: object) -> object:
    return value.strip().lower().replace("-", "_") if isinstance(value, str) else value


def _deployed(policy: RouterPolicy) -> RouterPolicy:
    if policy not in DEPLOYED_POLICIES:
        raise ValueError(f"vllm-router has no {policy} policy; use one of {', '.join(sorted(DEPLOYED_POLICIES))}")
    return policy


# A policy a plan deploys, as a pydantic field: either spelling in, vllm-router's out.
DeployedRouterPolicy = Annotated[RouterPolicy, BeforeValidator(_either_spelling), AfterValidator(_deployed)]
