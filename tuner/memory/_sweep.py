"""Every valid topology for a GPU count, evaluated by the memory model."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.errors import TopologyError
from tuner.hardware import GpuSpec
from tuner.memory._breakdown import MemoryBreakdown, MemoryInputs, compute_memory
from tuner.models import ModelSpec
from tuner.topology import Topology, enumerate_topologies


@dataclass(frozen=True)
class SweepRow:
    topology: Topology
    memory: MemoryBreakdown


def sweep_topologies(model: ModelSpec, gpu: GpuSpec, num_gpus: int, inputs: MemoryInputs | None = None, *,
                     mtp_values: tuple[int, ...] = (0,), powers_of_two: bool = True,
                     **engine: object) -> list[SweepRow]:
    """All layouts that vLLM accepts for this model within num_gpus, sorted by max concurrency per GPU.

    powers_of_two=False also tries every other TP and DP (EP48 = TP8 x DP6, EP72 = DP72, ...).
    """
    rows = []
    for tp, dp, ep in enumerate_topologies(num_gpus, powers_of_two=powers_of_two):
        for mtp in mtp_values:
            topo = Topology.create(tp=tp, dp=dp, ep=ep, mtp=mtp, **engine)
            try:
                topo.check(model, cluster_gpus=num_gpus)
            except TopologyError:
                continue
            rows.append(SweepRow(topo, compute_memory(model, gpu, topo, inputs)))
    rows.sort(key=lambda r: (-r.memory.fits, -r.memory.max_concurrency_instance / r.topology.num_gpus))
    return rows
