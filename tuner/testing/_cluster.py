"""A multi-node Ray cluster on this machine (ray.cluster_utils), for tests and benchmarks that need several hosts."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# Ports every test cluster's head lets its own processes choose (0: bind any free port, then publish it in the
# session's port files, where Ray reads it back): nothing picks a port for a process to bind later, so no other
# process can take it in between. Ray's head defaults are fixed otherwise (the dashboard agent's 52365, and a GCS
# port RAY_GCS_SERVER_PORT may set), which collide with any other Ray head on the machine.
RAY_HEAD_OWN_PORTS = {"gcs_server_port": 0, "dashboard_agent_listen_port": 0}
# How long a test cluster's nodes may take to register: Ray's own wait is 30 s a node, which a loaded 2-core host
# can pass (3 raylets start in 10-15 s on an idle one); a start that never completes still fails, with Ray's error.
NODES_START_TIMEOUT_S = 300.0


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
