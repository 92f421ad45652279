"""Placement shapes without Ray: bundles, strategies, refusals and host lists."""

from __future__ import annotations

import pytest

from tuner.deployment import Deployment
from tuner.errors import TopologyError
from tuner.executors._placement import (
    ClusterCapacity,
    check_placeable,
    host_assignments,
    instance_shapes,
    spread_ok,
)
from tuner.topology import Topology

CAP = ClusterCapacity(node_gpus=(4, 4, 4), gpus_per_host=4)


def test_tep8_on_4_gpu_hosts_is_one_pack_group_over_two_hosts() -> None:
    [shape] = instance_shapes(Deployment.single(Topology.parse("TEP8")), gpus_per_host=4)
    assert (shape.num_gpus, shape.max_hosts, shape.strategy) == (8, 2, "PACK")
    assert shape.bundles == [{"GPU": 1.0, "CPU": 0.01}] * 8


def test_instances_that_fit_a_host_are_strict_pack() -> None:
    shapes = instance_shapes(Deployment.single(Topology.parse("TP2"), count=3), gpus_per_host=4)
    assert [(s.strategy, s.max_hosts, s.index) for s in shapes] == [("STRICT_PACK", 1, i) for i in range(3)]


def test_pd_instances_get_their_own_groups_prefill_first() -> None:
    dep = Deployment.disaggregated(Topology.parse("TP2"), 2, Topology.parse("TEP8"), 1)
    shapes = instance_shapes(dep, gpus_per_host=4)
    assert [(s.role.value, s.num_gpus) for s in shapes] == [("prefill", 2), ("prefill", 2), ("decode", 8)]


@pytest.mark.parametrize(("name", "count", "expected"), [
    ("TP16", 1, "needs 16 GPUs but the cluster has 12"),
    ("TP4", 4, "needs 16 GPUs but the cluster has 12"),
])
def test_larger_than_the_cluster_is_refused_with_the_numbers(name: str, count: int, expected: str) -> None:
    with pytest.raises(TopologyError, match=expected) as err:
        check_placeable(Deployment.single(Topology.parse(name), count=count), CAP)
    assert err.value.field == "deployment" and err.value.fix


def test_an_instance_larger_than_its_allowed_hosts_is_refused() -> None:
    uneven = ClusterCapacity(node_gpus=(4, 2, 2), gpus_per_host=4)
    with pytest.raises(TopologyError, match="at most 2 hosts"):
        check_placeable(Deployment.single(Topology.parse("TEP8")), uneven)
    small_hosts = ClusterCapacity(node_gpus=(2, 2, 2, 2), gpus_per_host=4)
    with pytest.raises(TopologyError, match="must fit one host"):
        check_placeable(Deployment.single(Topology.parse("TP4")), small_hosts)


def test_spread_and_host_assignments_follow_the_bundles() -> None:
    dep = Deployment.disaggregated(Topology.parse("TP2"), 1, Topology.parse("TEP8"), 1)
    shapes = instance_shapes(dep, gpus_per_host=4)
    nodes = [["a", "a"], ["b"] * 4 + ["c"] * 4]
    assert all(spread_ok(n, s) for n, s in zip(nodes, shapes, strict=True))
    assert not spread_ok(["a", "b", "c", "c", "c", "c", "b", "b"], shapes[1])
    hosts = host_assignments(shapes, nodes, {"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.3"})
    assert [(h.address, h.gpu_ids) for h in hosts] == [
        ("10.0.0.1", (0, 1)), ("10.0.0.2", (0, 1, 2, 3)), ("10.0.0.3", (0, 1, 2, 3))]
    probed = host_assignments(shapes, nodes, {}, device_ids=[[2, 3], [0, 1, 2, 3, 4, 5, 6, 7]])
    assert probed[0].gpu_ids == (2, 3) and probed[2].gpu_ids == (4, 5, 6, 7)
