"""Every valid topology for a GPU count, evaluated by the memory model."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.hardware import GpuSpec
from tuner.memory._breakdown import MemoryBreakdown, MemoryInputs, compute_memory
from tuner.models import ModelSpec
from tuner.topology import Topology, accepted_topologies


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
    rows = [SweepRow(topo, compute_memory(model, gpu, topo, inputs))
            for topo in accepted_topologies(model, num_gpus, mtp_depths=mtp_values, powers_of_two=powers_of_two,
                                            knobs_where_they_apply=False, **engine)]
    rows.sort(key=lambda r: (-r.memory.fits, -r.memory.max_concurrency_instance / r.topology.num_gpus))
    return rows
