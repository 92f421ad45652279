"""Shared constants and helpers of the executor tests."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from _support.paths import REFERENCE_SPACE
from tuner.backends import TrialRequest
from tuner.deployment import Deployment
from tuner.topology import Topology
from tuner.workload import Workload

HOSTS = 3
GPUS_PER_HOST = 4
TOTAL_GPUS = HOSTS * GPUS_PER_HOST


# Ports every test cluster's head lets its own processes choose (0: bind any free port, then publish it in the
# session's port files, where Ray reads it back): nothing picks a port for a process to bind later, so no other
# process can take it in between. Ray's head defaults are fixed otherwise (the dashboard agent's 52365, and a GCS
# port RAY_GCS_SERVER_PORT may set), which collide with any other Ray head on the machine.
RAY_HEAD_OWN_PORTS = {"gcs_server_port": 0, "dashboard_agent_listen_port": 0}
# How long a test cluster's nodes may take to register: Ray's own wait is 30 s a node, which a loaded 2-core host
# can pass (3 raylets start in 10-15 s on an idle one); a start that never completes still fails, with Ray's error.
NODES_START_TIMEOUT_S = 300.0


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


@contextlib.contextmanager
def ray_test_cluster(head: dict, workers: list[dict]) -> Iterator[object]:
    """A multi-node Ray cluster on this machine (ray.cluster_utils) with the driver connected; torn down after,
    and topotune's Ray session forgotten so the next executor opens its own. Its ports are Ray's own choice
    (RAY_HEAD_OWN_PORTS; the workers' already are, by Cluster.add_node)."""
    import ray
    from ray.cluster_utils import Cluster

    from tuner.executors import forget_ray_session

    cluster = Cluster()
    try:
        # every node started before any is waited for, then all together (the driver connects to the head
        # whichever registers first)
        cluster.add_node(wait=False, **{**head, "include_dashboard": False, **RAY_HEAD_OWN_PORTS})
        for node in workers:
            cluster.add_node(wait=False, **node)
        cluster.wait_for_nodes(timeout=NODES_START_TIMEOUT_S)
        ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        forget_ray_session()
