"""The one plug-in point for measuring a deployment: a Backend turns a TrialRequest into a TrialResult.

TrialStatus (tuner/trial_status.py) and HostAssignment (tuner/deployment.py) are defined below the backends, so
tuner.launch can use them without importing this package; they are re-exported from tuner.backends."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from tuner.deployment import Deployment, HostAssignment
from tuner.metrics import ServingMetrics
from tuner.trial_status import TrialStatus
from tuner.workload import Workload


class TrialRequest(BaseModel):
    """Everything a backend needs to run one trial; serializable so it can cross to a Ray worker."""

    model_config = ConfigDict(frozen=True)

    trial_id: str
    model_path: str
    gpu: str
    deployment: Deployment
    workload: Workload
    artifacts_dir: str | None = None
    timeout_s: float = Field(3600.0, gt=0)
    min_accuracy: float | None = Field(None, ge=0, le=1)
    hosts: tuple[HostAssignment, ...] = ()
    seed: int = 0
    vllm_version: str | None = None  # the space's cluster.vllm_version (None: detected by the backend)
    # a repeated measurement of one config (re-verification): 0 is the study's own run; each repeat k > 0 is a
    # fresh run of the same deployment (the simulated backend draws its run-to-run noise anew per repeat)
    repeat: int = Field(0, ge=0, le=1000)
    # the study's SLA (a simulated trial replays its levels and reports the share of requests within it)
    max_ttft_ms: float | None = Field(None, gt=0)
    max_itl_ms: float | None = Field(None, gt=0)


class AccuracyGate(BaseModel):
    """The GSM8K gate's outcome: the score on a sample, its confidence interval, and the verdict.

    `passed` is False only when the interval's upper bound is below the bar (see tuner/backends/vllm/_accuracy)."""

    model_config = ConfigDict(frozen=True)

    score: float = Field(ge=0, le=1)
    correct: int = Field(ge=0)
    sample_size: int = Field(ge=0, description="questions asked (the first N of GSM8K's 1,319 test questions)")
    ci_low: float = Field(ge=0, le=1)
    ci_high: float = Field(ge=0, le=1)
    confidence: float = Field(gt=0, lt=1)
    min_accuracy: float = Field(ge=0, le=1)
    passed: bool
    num_shots: int = Field(5, ge=0)


class TrialResult(BaseModel):
    """What a trial measured (one point per concurrency level), or why it failed."""

    model_config = ConfigDict(frozen=True)

    status: TrialStatus
    reason: str = ""
    points: tuple[ServingMetrics, ...] = ()
    accuracy: float | None = None
    accuracy_gate: AccuracyGate | None = None  # score, interval and sample size when the gate ran
    observed_memory: dict[str, float] = Field(default_factory=dict)  # figures parsed from vLLM's log
    predicted_memory: dict[str, float] = Field(default_factory=dict)  # the memory model's, for comparison
    artifacts_dir: str | None = None
    duration_s: float = 0.0
    # what the trial ran on (the study keeps its history per version): the vLLM version the backend ran (the
    # simulated backend: its setting; the real one: what `vllm --version` reports, as the doctor checks) and
    # the model revision (tuner.models.model_revision of the checkpoint). None: not known (older backends).
    vllm_version: str | None = None
    model_revision: str | None = None

    @classmethod
    def failed(cls, status: TrialStatus, reason: str, **extra: object) -> TrialResult:
        return cls(status=status, reason=reason, **extra)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ExecutorNeeds:
    """What a backend needs from the executor that runs it: declared by the backend, so an executor never
    recognises a backend by its name or the signature of its `run`."""

    device_ids: bool = False  # it binds processes to GPU ids: resolve each placed bundle's device ids
    # it starts processes on the hosts of its assignment: `run(request, starter=...)` gets a ProcessStarter
    # (tuner.launch) that starts each one on its own host
    process_starter: bool = False


class Backend(abc.ABC):
    """Measures a deployment. Subclasses: SimulatedBackend (the performance model), VllmBackend (real).

    `run` must never raise for a trial that failed on its own terms (OOM, crash, timeout): it returns a
    TrialResult with the status and reason, so the study stores it and the sampler learns the boundary.
    It raises only for programming or configuration errors.
    """

    name: ClassVar[str]
    needs: ClassVar[ExecutorNeeds] = ExecutorNeeds()

    @abc.abstractmethod
    def run(self, request: TrialRequest) -> TrialResult: ...

    def cancel(self, trial_id: str) -> None:  # noqa: B027 - optional hook
        """Stop a running trial now (its run() then returns a failure); called from another thread."""

    def close(self) -> None:  # noqa: B027 - optional hook, like Optuna's sampler hooks
        """Release anything the backend holds (processes, venvs stay)."""
