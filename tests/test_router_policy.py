"""One spelling of the router policy (tuner/router.py): vllm-router's `--policy` names, from the replay's `--router`
through the operating point's JSON to the plan's router command; the older hyphenated spelling is still read."""

from __future__ import annotations

import json
import subprocess

import pytest

from tuner.backends.vllm import default_envs_dir
from tuner.deployment import Deployment, parse_deployment
from tuner.errors import ConfigError
from tuner.operating_point import OperatingPoint, RouterChoice
from tuner.replay import ArrivalProcess, ReplayPlan, check_router
from tuner.router import DEPLOYED_POLICIES, REPLAYED_POLICIES, RouterPolicy
from tuner.workload import Workload

ROUTER_PYTHON = default_envs_dir() / "router" / "bin" / "python"


@pytest.mark.parametrize(("given", "policy"), [
    ("cache_aware", RouterPolicy.CACHE_AWARE), ("cache-aware", RouterPolicy.CACHE_AWARE),
    ("round-robin", RouterPolicy.ROUND_ROBIN), ("Least-Loaded", RouterPolicy.LEAST_LOADED),
])
def test_the_replay_reads_either_spelling_and_keeps_one(given: str, policy: RouterPolicy) -> None:
    assert check_router(given) is policy
    plan = ReplayPlan(deployment=_deployment(), workload=Workload.fixed(100, 10),
                      arrival=ArrivalProcess("closed", concurrency=1), router=given)  # type: ignore[arg-type]
    assert plan.router is policy


def test_a_policy_the_replay_does_not_simulate_names_the_field() -> None:
    with pytest.raises(ConfigError) as bad:
        check_router("power_of_two")
    assert bad.value.field == "router" and "round_robin" in (bad.value.fix or "")
    with pytest.raises(ConfigError, match="unknown router policy 'sticky'"):
        check_router("sticky")


def test_a_stored_operating_point_in_the_old_spelling_reads_back_in_vllm_routers(tmp_path) -> None:
    stored = RouterChoice(policy=RouterPolicy.CACHE_AWARE, reason="prefixes").model_dump(mode="json")
    assert stored["policy"] == "cache_aware"  # what the JSON holds: vllm-router's name
    old = RouterChoice.model_validate({**stored, "policy": "cache-aware"})
    assert old.policy is RouterPolicy.CACHE_AWARE and json.loads(old.model_dump_json())["policy"] == "cache_aware"


def test_an_operating_point_refuses_a_policy_vllm_router_lacks() -> None:
    data = {"deployment": {"groups": [{"role": "both", "count": 1, "topology": {"tp": 1}}]}, "model_path": "/m",
            "gpu": "h200", "gpus_per_host": 8, "typical_isl": 10, "typical_osl": 10,
            "router": {"policy": "least_loaded", "reason": "by hand"}}
    with pytest.raises(ConfigError) as bad:
        OperatingPoint.from_json(data)
    assert bad.value.field == "operating_point.router.policy" and "vllm-router has no least_loaded" in str(bad.value)


def test_the_policy_sets() -> None:
    assert RouterPolicy.LEAST_LOADED not in DEPLOYED_POLICIES and RouterPolicy.CACHE_AWARE in REPLAYED_POLICIES
    assert {p.value for p in DEPLOYED_POLICIES} == {"random", "round_robin", "cache_aware", "kv_aware", "power_of_two",
                                                     "consistent_hash", "sticky_least_loaded"}


@pytest.mark.skipif(not ROUTER_PYTHON.exists(), reason="the vllm-router venv is missing: `topotune setup-cpu-vllm`")
def test_the_deployed_policies_are_vllm_routers_own_choices() -> None:
    """vllm-router 0.1.17's own parser: every deployed policy is one of its --policy choices, and no more."""
    code = ("import argparse, json; from vllm_router.router_args import RouterArgs; p = argparse.ArgumentParser(); "
            "RouterArgs.add_cli_args(p); print(json.dumps(next(a.choices for a in p._actions "
            "if '--policy' in a.option_strings)))")
    done = subprocess.run([str(ROUTER_PYTHON), "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert set(json.loads(done.stdout.strip().splitlines()[-1])) == {p.value for p in DEPLOYED_POLICIES}


def _deployment() -> Deployment:
    return parse_deployment("2x:TP1")
