"""The simulated backend: the performance model answers instead of a GPU (optionally with seeded noise).

It runs the same memory screen a real server would hit at start-up (a config that does not fit fails as OOM)
and returns the shared TrialResult, so studies, executors and the API cannot tell it from a real backend.
"""

from __future__ import annotations

import hashlib
import threading
import time
from functools import lru_cache

import numpy as np

from tuner.backends._base import Backend, TrialRequest, TrialResult, TrialStatus
from tuner.backends._replayed import replayed_points
from tuner.backends._version_shift import SIMULATED_VLLM_VERSION, VersionShift
from tuner.hardware import GpuSpec, get_gpu
from tuner.memory import MemoryInputs, compute_memory
from tuner.metrics import ServingMetrics
from tuner.models import ModelSpec, load_model, model_revision
from tuner.perf import Calibration, RooflineModel, predict_traffic


@lru_cache(maxsize=16)
def _model(path: str) -> ModelSpec:
    return load_model(path)


_PERF: dict[tuple[str, str, str], RooflineModel] = {}


def _perf(path: str, gpu: GpuSpec, calibration: Calibration | None) -> RooflineModel:
    """One model per (checkpoint, GPU, calibration): it caches per-topology constants across trials."""
    key = (path, gpu.model_dump_json(), calibration.model_dump_json() if calibration else "")
    if key not in _PERF:
        _PERF[key] = RooflineModel(_model(path), gpu, calibration)
    return _PERF[key]


def _noisy(m: ServingMetrics, rate_factor: float, latency_factor: float) -> ServingMetrics:
    """Scale rates by rate_factor and latencies by latency_factor, keeping the schema consistent. A replayed point
    keeps its percentiles and sketches (scaled); its attainment is then read off the scaled sketches."""
    itl = m.itl_ms_mean * latency_factor
    noisy = ServingMetrics.from_rates(
        concurrency=m.concurrency, num_gpus=m.num_gpus, isl=m.isl, osl=m.osl,
        request_rps=m.request_throughput_rps * rate_factor, ttft_ms=m.ttft_ms_mean * latency_factor, itl_ms=itl,
        ttft_ms_p99=m.ttft_ms_p99 * latency_factor, itl_ms_p99=m.itl_ms_p99 * latency_factor,
        max_concurrency=m.max_concurrency, running=m.running_requests)
    if m.replayed_sla_attainment is None:
        return noisy
    scaled = {name: getattr(m, name) * latency_factor for name in ("ttft_ms_p50", "ttft_ms_p90", "itl_ms_p50",
                                                                   "itl_ms_p90")}
    return noisy.model_copy(update={**scaled, "ttft_ms_sketch": tuple(v * latency_factor for v in m.ttft_ms_sketch),
                                    "itl_ms_sketch": tuple(v * latency_factor for v in m.itl_ms_sketch),
                                    "offered_rps": m.offered_rps})


class SimulatedBackend(Backend):
    """Answers from RooflineModel.

    noise: relative standard deviation of a seeded perturbation per deployment (0 = exact model). The same
    noise_seed and deployment always give the same numbers, so studies stay reproducible.
    delay_s: wall time each trial takes (exercises executors and fault handling as a real trial would).
    vllm_version: the vLLM this simulated cluster runs (what its trials are tagged with). None: the version the
    request targets (the space's cluster.vllm_version, else SIMULATED_VLLM_VERSION), with the model's physics.
    Another version emulates an upgrade from the targeted one (tuner/backends/_version_shift.py): some layouts
    faster or slower by bounded seeded factors, some configurations no longer starting.
    replay: under the trial's SLA, an aggregated trial's levels are replayed request by request (tuner/replay) for
    their latencies and SLA attainment (tuner/backends/_replayed.py).
    """

    name = "simulated"

    def __init__(self, *, noise: float = 0.0, delay_s: float = 0.0, calibration: Calibration | None = None,
                 noise_seed: int = 0, vllm_version: str | None = None, replay: bool = True) -> None:
        self.noise = noise
        self.replay = replay
        self.vllm_version = vllm_version
        self.noise_seed = noise_seed
        self.delay_s = delay_s
        self.calibration = calibration
        self._stops: dict[str, threading.Event] = {}  # trial id -> set by cancel(); close() sets them all
        self._closed = threading.Event()
        self._lock = threading.Lock()

    def _stop_event(self, trial_id: str) -> threading.Event:
        with self._lock:
            return self._stops.setdefault(trial_id, threading.Event())

    def cancel(self, trial_id: str) -> None:
        """The simulated wall time ends now, like a real trial's processes being stopped."""
        self._stop_event(trial_id).set()

    def close(self) -> None:
        self._closed.set()
        with self._lock:
            for event in self._stops.values():
                event.set()

    def _wait_delay(self, trial_id: str) -> bool:
        """Sleep delay_s unless cancelled or closed first; True when the trial was stopped."""
        stop = self._stop_event(trial_id)
        if self._closed.is_set():
            stop.set()
        try:
            return stop.wait(self.delay_s)
        finally:
            with self._lock:
                self._stops.pop(trial_id, None)

    def _rng(self, request: TrialRequest) -> np.random.Generator:
        """Noise keyed by the config, not the trial: re-measuring a config (or an exhaustive baseline) sees the
        same numbers a study saw, like a cluster whose variance is fixed per deployment."""
        key = f"{self.noise_seed}|{request.deployment.model_dump_json()}|{request.workload.model_dump_json()}"
        if request.repeat:  # a repeated run of the config draws its run-to-run noise anew (repeat 0: the study's)
            key += f"|repeat {request.repeat}"
        return np.random.default_rng(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "little"))

    def version_shift(self, request: TrialRequest) -> VersionShift:
        """From the version the request targets to the one this backend runs (identity unless they differ)."""
        targeted = request.vllm_version or SIMULATED_VLLM_VERSION
        return VersionShift(targeted, self.vllm_version or targeted)

    def run(self, request: TrialRequest) -> TrialResult:
        shift = self.version_shift(request)
        tags = {"vllm_version": shift.to_version, "model_revision": model_revision(request.model_path)}
        return self._run(request, shift).model_copy(update=tags)

    def _run(self, request: TrialRequest, shift: VersionShift) -> TrialResult:
        started = time.monotonic()
        if self.delay_s and self._wait_delay(request.trial_id):
            return TrialResult.failed(TrialStatus.CRASHED, "cancelled", duration_s=time.monotonic() - started)
        if len(request.deployment.groups) != 1 or request.deployment.groups[0].count != 1:
            return TrialResult.failed(TrialStatus.UNSUPPORTED, "the simulated backend measures one instance per "
                                      "trial; PD deployments are composed from phase curves (tuner.frontier)")
        group = request.deployment.groups[0]
        topo = group.topology
        gpu = get_gpu(request.gpu)
        model = _model(request.model_path)
        workload = request.workload
        memory = compute_memory(model, gpu, topo, MemoryInputs.for_workload(workload))
        predicted = {"kv_budget_gib": memory.kv_budget_bytes / 2**30, "block_size": float(memory.layout.block_size),
                     "num_gpu_blocks": float(memory.num_gpu_blocks), "max_concurrency": memory.max_concurrency}
        if not memory.fits:
            return TrialResult.failed(TrialStatus.OOM, f"simulated start-up: {memory.verdict()}",
                                      predicted_memory=predicted, duration_s=time.monotonic() - started)
        if shift.stops_starting(topo):
            return TrialResult.failed(TrialStatus.CRASHED, f"engine core died at start-up on vLLM {shift.to_version} "
                                      f"(emulated upgrade from {shift.from_version})", predicted_memory=predicted,
                                      duration_s=time.monotonic() - started)
        perf = _perf(request.model_path, gpu, self.calibration)
        points = predict_traffic(perf, topo, group.role, workload).points
        if self.replay:  # latencies and SLA attainment request by request (tuner/backends/_replayed.py)
            points = replayed_points(perf, request.deployment, workload, list(points),
                                     max_ttft_ms=request.max_ttft_ms, max_itl_ms=request.max_itl_ms)
        factor = shift.step_factor(topo)
        if factor != 1.0:
            points = [_noisy(p, 1.0 / factor, factor) for p in points]
        if self.noise > 0:
            rng = self._rng(request)
            trial_rate, trial_latency = rng.lognormal(0.0, self.noise, size=2)
            points = [_noisy(p, trial_rate * rng.lognormal(0.0, self.noise / 3),
                             trial_latency * rng.lognormal(0.0, self.noise / 3)) for p in points]
        return TrialResult(status=TrialStatus.OK, points=tuple(points), predicted_memory=predicted,
                           duration_s=time.monotonic() - started)
