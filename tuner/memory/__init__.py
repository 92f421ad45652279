"""vLLM's memory arithmetic: weights per GPU, KV budget, hybrid pages, blocks and max concurrency."""

from tuner.memory._breakdown import GIB, Line, MemoryBreakdown, MemoryInputs, compute_memory
from tuner.memory._layout import KVLayout, kv_layout
from tuner.memory._sweep import SweepRow, sweep_topologies
from tuner.memory._weights import Mxfp4Backend, WeightsPerGpu, local_experts, shard_fraction

__all__ = [
    "GIB",
    "KVLayout",
    "Line",
    "MemoryBreakdown",
    "MemoryInputs",
    "Mxfp4Backend",
    "SweepRow",
    "WeightsPerGpu",
    "compute_memory",
    "kv_layout",
    "local_experts",
    "shard_fraction",
    "sweep_topologies",
]
