"""The one plug-in point for performance models: predict one vLLM instance in one role."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Self

from tuner.hardware import GpuSpec
from tuner.metrics import ServingMetrics
from tuner.models import ModelSpec
from tuner.perf._calibration import Calibration, default_calibration
from tuner.topology import Role, Topology


class PerformanceModel(ABC):
    """Predicts what one vLLM instance (one topology) does in one role at one concurrency.

    Implementations must be pure and cheap: the frontier calls `predict_curve` for every topology. The result is
    the shared ServingMetrics schema, so predictions and measurements are interchangeable downstream. Prefill
    predictions report osl = 1 (the prefill instance of a PD pair generates one token).
    """

    def __init__(self, model: ModelSpec, gpu: GpuSpec, calibration: Calibration | None = None) -> None:
        self.model = model
        self.gpu = gpu
        self.calibration = calibration or default_calibration(gpu.name)

    @abstractmethod
    def predict(self, topology: Topology, role: Role, *, isl: int, osl: int, concurrency: int) -> ServingMetrics:
        """One instance, `concurrency` clients in a closed loop, requests of isl input and osl output tokens."""

    @abstractmethod
    def capacity(self, topology: Topology, role: Role, *, isl: int, osl: int) -> int:
        """Requests the instance runs at once (KV cache, max-num-seqs); DoesNotFitError when not even one fits."""

    def predict_curve(self, topology: Topology, role: Role, *, isl: int, osl: int,
                      concurrencies: Sequence[int]) -> list[ServingMetrics]:
        """A concurrency sweep; implementations override this when levels can share work."""
        return [self.predict(topology, role, isl=isl, osl=osl, concurrency=c) for c in concurrencies]

    def with_calibration(self, calibration: Calibration) -> Self:
        """The same model and hardware with other factors (used by fitting)."""
        return type(self)(self.model, self.gpu, calibration)
