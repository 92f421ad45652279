"""A cluster store with launch crashes in it, as the known-risk tests of the study, the CLI and the service set it
up: which configs of a space fit, and a crash recorded for another model."""

from __future__ import annotations

from pathlib import Path

from tuner.cluster import ClusterKey, ClusterStore, StoredFailure
from tuner.hardware import get_gpu
from tuner.memory import MemoryInputs, compute_memory
from tuner.models import load_model
from tuner.space import parse_space
from tuner.topology import Topology
from tuner.trial_status import TrialStatus

CRASH = "RuntimeError: NCCL error in all_to_all (unhandled cuda error)"


def fitting_configs(space_yaml: str, model_dir: Path, phase: str = "decode") -> list[Topology]:
    """The phase's configs the memory model says fit (the ones a study can launch, risks aside)."""
    space, model = parse_space(space_yaml), load_model(model_dir)
    gpu, workload = get_gpu(space.cluster.gpu), space.phase_workload(phase)
    return [t for t in space.expand(phase, model)
            if compute_memory(model, gpu, t, MemoryInputs.for_workload(workload)).fits]


def record_crash(store: ClusterStore, key: ClusterKey, topo: Topology, model: str, *, reason: str = CRASH,
                 status: TrialStatus = TrialStatus.CRASHED) -> None:
    """`topo` failed to launch on the cluster `key` for `model` (a decode study of it)."""
    store.record_failure(key, StoredFailure(model_name=model, topology=topo, status=status, reason=reason,
                                            study=f"{model}/decode"))
