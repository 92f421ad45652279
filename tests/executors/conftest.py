"""One multi-node Ray cluster on this machine for the executor tests: 3 "hosts" of 4 logical GPUs each.

ray.cluster_utils.Cluster starts one raylet per host (10-15 s on a 2-core box), so the whole suite shares it.
Every Ray port is one its process binds itself (never 6379, Redis's here, nor a fixed one that collides with other
runs, nor one chosen here and bound later, which another process can take in between): tuner.testing's
ray_test_cluster.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import pytest
from _support.executors import GPUS_PER_HOST, HOSTS

from tuner.testing import ray_test_cluster


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[object]:
    import ray

    from tuner.executors import shutdown_ray

    shutdown_ray()  # an earlier test's local session (RayExecutor.start) must not hold this process
    if ray.is_initialized():
        ray.shutdown()
    node = {"num_cpus": 1, "num_gpus": GPUS_PER_HOST, "object_store_memory": 80 * 2**20}
    with ray_test_cluster(node, [node] * (HOSTS - 1)) as cluster:
        yield cluster


@pytest.fixture
def probe_spec(tmp_path: Path):
    """A ProbeBackend spec recording into tmp_path/records; call with delay_s/spawn/inner."""
    from tuner.testing import probe_spec

    return functools.partial(probe_spec, tmp_path / "records")

