"""Every backend passes tuner.testing's conformance checks: the simulated one, the hidden truth the benchmarks
measure on, and the vLLM backend (without a GPU, the trial its plan refuses is checked here on every run; the real
one on this machine's CPU vLLM with a tiny model is tests/backends/test_vllm_cpu_e2e.py's TP1 trial, which
check_backend runs there, so the suite starts one TP1 trial for both)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _support.paths import REFERENCE_MODEL
from _support.truth_runs import truth

from tuner.backends import Backend, SimulatedBackend, TrialRequest, TrialResult, TrialStatus
from tuner.backends._truth import HiddenTruthBackend
from tuner.backends.vllm import VllmBackend
from tuner.deployment import Deployment
from tuner.testing import ConformanceError, check_backend
from tuner.topology import Role, Topology
from tuner.workload import Workload

WORKLOAD = Workload(isl=1024, osl=128, concurrency=(1, 8))


def _request(name: str, topology: str, tmp_path: Path, **fields: object) -> TrialRequest:
    return TrialRequest(trial_id=name, model_path=str(REFERENCE_MODEL), gpu="gb300", workload=WORKLOAD,
                        deployment=Deployment.single(Topology.parse(topology, role=Role.DECODE, **fields)),
                        artifacts_dir=str(tmp_path / name), timeout_s=600)


@pytest.mark.parametrize("backend", [SimulatedBackend(), SimulatedBackend(noise=0.05, delay_s=0.01),
                                     HiddenTruthBackend(truth())], ids=["simulated", "noisy", "hidden-truth"])
def test_model_backends_conform(backend: Backend, tmp_path: Path) -> None:
    result = check_backend(backend, _request("ok", "TEP8", tmp_path),
                           failing=_request("too-big", "TP1", tmp_path))  # does not fit: OOM, with the reason
    assert [p.concurrency for p in result.points] == [1, 8]


def test_vllm_backend_fails_a_plan_it_refuses_without_launching(tmp_path: Path) -> None:
    """No GPU needed: vLLM 0.11 has no --stream-interval, so the plan refuses the trial; nothing starts."""
    refused = _request("refused", "TP1", tmp_path, stream_interval=8).model_copy(update={"vllm_version": "0.11.0"})
    backend = VllmBackend()
    result = backend.run(refused)
    assert result.status is TrialStatus.UNSUPPORTED and "--stream-interval" in result.reason
    assert not (tmp_path / "refused" / "logs").exists()  # no process was started
    with pytest.raises(ConformanceError, match="expected ok"):  # the check can fail
        check_backend(backend, refused)


def test_a_backend_that_raises_does_not_conform(tmp_path: Path) -> None:
    class Raising(SimulatedBackend):
        def run(self, request: TrialRequest) -> TrialResult:
            if request.trial_id == "too-big":
                raise RuntimeError("boom")
            return super().run(request)

    with pytest.raises(ConformanceError, match="raised RuntimeError"):
        check_backend(Raising(), _request("ok", "TEP8", tmp_path), failing=_request("too-big", "TP1", tmp_path))
