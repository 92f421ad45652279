"""How a trial ended: the one status vocabulary of backends, launch, executors, studies and the service.

It sits at the root, below tuner.launch and tuner.backends, because the process launcher classifies a dead
process's log into a status without knowing which backend started it (re-exported as tuner.backends.TrialStatus).
"""

from __future__ import annotations

from enum import StrEnum


class TrialStatus(StrEnum):
    """A trial's outcome as stored on it; every status but OK is a reason the config is infeasible."""

    OK = "ok"
    OOM = "oom"  # CUDA/CPU out of memory while starting or serving
    KV_TOO_SMALL = "kv_too_small"  # KV cache cannot hold one request of max-model-len
    UNSUPPORTED = "unsupported"  # the backend refused a feature (e.g. expert parallelism on CPU)
    CRASHED = "crashed"
    TIMEOUT = "timeout"
    BENCHMARK_FAILED = "benchmark_failed"  # the load generator failed or saw too many errors
    ACCURACY = "accuracy"  # below the accuracy bar
    INFEASIBLE = "infeasible"  # screened out before launch (memory model)

    @property
    def ok(self) -> bool:
        return self is TrialStatus.OK
