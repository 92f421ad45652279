"""Shared constants and helpers of the executor tests."""

from __future__ import annotations

import time
from pathlib import Path

from _support.paths import REFERENCE_SPACE
from tuner.backends import TrialRequest
from tuner.deployment import Deployment
from tuner.topology import Topology
from tuner.workload import Workload

HOSTS = 3
GPUS_PER_HOST = 4
TOTAL_GPUS = HOSTS * GPUS_PER_HOST


def small_space(num_gpus: int = TOTAL_GPUS):
    """The reference space on a cluster of this test's size."""
    from tuner.space import load_space

    space = load_space(REFERENCE_SPACE)
    return space.model_copy(update={"cluster": space.cluster.model_copy(
        update={"num_gpus": num_gpus, "gpus_per_host": GPUS_PER_HOST})})


def request(deployment: Deployment | str, trial: str, tmp_path: Path, timeout_s: float = 120.0,
            model_path: str = "unused") -> TrialRequest:
    dep = Deployment.single(Topology.parse(deployment)) if isinstance(deployment, str) else deployment
    return TrialRequest(trial_id=trial, model_path=model_path, gpu="gb300", deployment=dep, workload=Workload(),
                        artifacts_dir=str(tmp_path / "artifacts" / trial), timeout_s=timeout_s)


def run_all(executor, requests: list[TrialRequest]) -> list:
    """The driver loop of tuner.study in miniature: start while can_start, wait, repeat."""
    pending, running, done = list(requests), [], []
    while pending or running:
        while pending and executor.can_start(pending[0]):
            running.append(executor.submit(pending.pop(0)))
        finished = executor.wait(running, timeout_s=5.0)
        running = [h for h in running if h not in finished]
        done += finished
    return done


def free_gpus_eventually(expected: float, timeout_s: float = 10.0) -> float:
    """Ray's free-GPU count once it settles on `expected` (resource reports lag by a few hundred ms)."""
    import ray

    deadline = time.monotonic() + timeout_s
    while True:
        free = ray.available_resources().get("GPU", 0.0)
        if free == expected or time.monotonic() > deadline:
            return free
        time.sleep(0.2)
