"""The cluster store keeps what every study measured, by cluster and never by model, on SQLite and PostgreSQL."""

from __future__ import annotations

from _support.truth_runs import measured_runs

from tuner.cluster import ClusterKey, ClusterStore, StoredFailure, planned_risks
from tuner.hardware import get_gpu
from tuner.topology import Role, Topology
from tuner.trial_status import TrialStatus


def test_round_trip(store: ClusterStore) -> None:
    key = ClusterKey.of(get_gpu("gb300"), "0.26.1", "lab-a")
    other = ClusterKey.of(get_gpu("gb300"), "0.27.0", "lab-a")  # another vLLM: another cluster as far as it goes
    runs = measured_runs("qwen3-235b-a22b", 3)
    for run in runs:
        store.record_run(key, run)
    store.record_run(key, runs[0])  # a resumed study replays a trial: counted once
    crash = Topology(tp=2, dp=4, ep=True, role=Role.DECODE)
    store.record_failure(key, StoredFailure("Qwen3-235B", crash, TrialStatus.CRASHED, "engine core died", "s/decode"))
    back = store.read_runs(key)
    assert [(r.topology, r.points, r.workload, r.role, r.trial) for r in back] == \
        [(r.topology, r.points, r.workload, r.role, r.trial) for r in runs]
    failures = store.read_failures(key)
    assert [(f.topology, f.status, f.transferable) for f in failures] == [(crash, TrialStatus.CRASHED, True)]
    assert store.read_runs(other) == [] and store.read_failures(other) == []
    assert store.clusters() == [key]
    assert key.name == "lab-a" and ClusterKey.of(get_gpu("gb300")).name == "gb300-nvlink72+infiniband"


def test_oom_is_not_a_transferable_risk() -> None:
    oom = StoredFailure("m", Topology(tp=1), TrialStatus.OOM, "CUDA out of memory", "s")
    assert not oom.transferable  # it depends on the model's size, not the cluster


def test_planned_risks_compare_vllm_versions_as_the_version_table_does(store: ClusterStore) -> None:
    """A crash recorded on 0.26.1rc1 is a risk for a plan on 0.26.1 (one release, as VllmVersion reads it), not on
    0.27.0; a key whose version was not pinned matches every plan."""
    crash = Topology(tp=2, dp=4, ep=True, role=Role.DECODE)
    store.record_failure(ClusterKey.of(get_gpu("gb300"), "0.26.1rc1", "lab-a"),
                         StoredFailure("Qwen3-235B", crash, TrialStatus.CRASHED, "engine core died", "s/decode"))
    assert [m.topology for m in planned_risks(store, [crash], gpu_class="gb300", vllm_version="v0.26.1")] == [crash]
    assert planned_risks(store, [crash], gpu_class="gb300", vllm_version="0.27.0") == []
    store.record_failure(ClusterKey.of(get_gpu("gb300"), None, "lab-b"),
                         StoredFailure("Qwen3-235B", crash, TrialStatus.CRASHED, "engine core died", "s/decode"))
    assert [m.key.name for m in planned_risks(store, [crash], gpu_class="gb300", vllm_version="0.27.0")] == ["lab-b"]
