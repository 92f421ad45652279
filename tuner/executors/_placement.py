"""Placement shapes: how a deployment's instances map onto Ray placement groups (pure: no ray import).

One placement group per vLLM instance, one bundle per GPU ({"GPU": 1, "CPU": small}): vLLM reuses a captured
group only when each bundle holds at most one GPU (vllm/v1/executor/ray_utils.py). An instance that fits one
host is STRICT_PACK; a larger one (TEP8 on 4-GPU hosts) is PACK, and the executor checks afterwards that its
bundles landed on no more than ceil(gpus / gpus_per_host) hosts, because PACK alone is best effort.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from tuner.deployment import Deployment, HostAssignment, check_host_split
from tuner.errors import TopologyError
from tuner.topology import Role, Topology

Strategy = Literal["STRICT_PACK", "PACK"]


@dataclass(frozen=True)
class InstanceShape:
    """The placement group of one vLLM instance."""

    role: Role
    index: int  # within its role's group
    name: str  # topology name, e.g. TEP8
    num_gpus: int
    max_hosts: int  # ceil(num_gpus / gpus_per_host): the most hosts the instance may straddle
    strategy: Strategy
    cpus_per_bundle: float
    topology: Topology | None = None  # the instance's layout, so a split vLLM cannot run is re-placed

    @property
    def bundles(self) -> list[dict[str, float]]:
        return [{"GPU": 1.0, "CPU": self.cpus_per_bundle} for _ in range(self.num_gpus)]

    @property
    def label(self) -> str:
        return f"{self.role.value} instance {self.index} ({self.name}, {self.num_gpus} GPUs)"


@dataclass(frozen=True)
class ClusterCapacity:
    """GPUs per alive node, as Ray reports them (all of them, busy or not)."""

    node_gpus: tuple[int, ...]
    gpus_per_host: int

    @property
    def total_gpus(self) -> int:
        return sum(self.node_gpus)


def instance_shapes(deployment: Deployment, gpus_per_host: int, cpus_per_bundle: float = 0.01
                    ) -> list[InstanceShape]:
    """One shape per instance, in launch order (prefill, aggregated, decode): the order hosts are listed in."""
    shapes = []
    for group in deployment.groups_in_launch_order:
        n = group.topology.num_gpus
        hosts = max(1, math.ceil(n / gpus_per_host))
        for index in range(group.count):
            shapes.append(InstanceShape(role=group.role, index=index, name=group.topology.name, num_gpus=n,
                                        max_hosts=hosts, strategy="STRICT_PACK" if hosts == 1 else "PACK",
                                        cpus_per_bundle=cpus_per_bundle, topology=group.topology))
    return shapes


def check_placeable(deployment: Deployment, capacity: ClusterCapacity, cpus_per_bundle: float = 0.01
                    ) -> list[InstanceShape]:
    """The shapes, or a TopologyError saying why the cluster can never hold this deployment (even when idle)."""
    total = capacity.total_gpus
    largest = max(capacity.node_gpus, default=0)
    fix = "shrink TP x DP or the instance count, or add hosts to the cluster"
    if deployment.num_gpus > total:
        raise TopologyError(f"deployment {deployment.name} needs {deployment.num_gpus} GPUs but the cluster has "
                            f"{total} ({len(capacity.node_gpus)} hosts)", field="deployment", fix=fix)
    shapes = instance_shapes(deployment, capacity.gpus_per_host, cpus_per_bundle)
    for shape in shapes:
        if shape.strategy == "STRICT_PACK" and shape.num_gpus > largest:
            raise TopologyError(f"{shape.label} must fit one host, but the largest host has {largest} GPUs",
                                field="deployment", fix=fix)
        best = sum(sorted(capacity.node_gpus, reverse=True)[:shape.max_hosts])
        if shape.num_gpus > best:
            raise TopologyError(f"{shape.label} may span at most {shape.max_hosts} hosts of "
                                f"{capacity.gpus_per_host} GPUs; the {shape.max_hosts} largest hosts have {best} GPUs",
                                field="deployment", fix=fix)
    return shapes


def spread_ok(bundle_nodes: Sequence[str], shape: InstanceShape) -> bool:
    """True when the bundles landed on no more hosts than the instance needs, in a split vLLM can run: each
    host holds whole TP groups, or TP spans whole, equal hosts (tuner.deployment.check_host_split, the rule the
    launch plan checks too)."""
    if len(set(bundle_nodes)) > shape.max_hosts:
        return False
    if shape.topology is None:
        return True
    shares = list(Counter(bundle_nodes[:shape.num_gpus]).values())  # first-seen order: the head host first
    try:
        check_host_split(shape.topology, shares)
    except TopologyError:
        return False
    return True


def host_assignments(shapes: Sequence[InstanceShape], bundle_nodes: Sequence[Sequence[str]],
                     addresses: Mapping[str, str], device_ids: Sequence[Sequence[int]] | None = None
                     ) -> tuple[HostAssignment, ...]:
    """The trial's hosts in launch order: per instance, one entry per host it landed on, the host of bundle 0
    first (it runs the instance's API server). Without probed device ids, gpu_ids are the bundles' slot numbers
    on that host within this trial (enough for backends that start no GPU process, e.g. the simulator)."""
    out: list[HostAssignment] = []
    next_slot: dict[str, int] = {}
    for i, shape in enumerate(shapes):
        per_node: dict[str, list[int]] = {}
        for b, node in enumerate(bundle_nodes[i][:shape.num_gpus]):
            if device_ids is not None:
                gpu = device_ids[i][b]
            else:
                gpu = next_slot.get(node, 0)
                next_slot[node] = gpu + 1
            per_node.setdefault(node, []).append(gpu)
        for node, gpus in per_node.items():
            out.append(HostAssignment(address=addresses.get(node, "127.0.0.1"), node_id=node, gpu_ids=tuple(gpus)))
    return tuple(out)
