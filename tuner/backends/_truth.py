"""Hidden truths: a simulated cluster whose physics differ from the tuner's model, for honest search benchmarks.

A benchmark whose ground truth is the tuner's own simulator rewards trusting the simulator. A hidden truth is
a RooflineModel with other factors plus the effects real clusters add and the model lacks: calibration factors
drawn within their documented bounds, expert load imbalance on EP layouts, a seeded step-time factor per
parallel layout, a KV capacity a few percent off, noise on every measurement and the occasional config that
fails at launch. Only HiddenTruthBackend.run (and the benchmark's scoring) read a truth; the tuner sees
TrialResults, as from a real cluster (tests/study/test_hidden_truth.py pins it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import time
from dataclasses import dataclass

import numpy as np

from tuner.backends._base import Backend, TrialRequest, TrialResult, TrialStatus
from tuner.backends._simulated import _model, _noisy
from tuner.hardware import GpuSpec, get_gpu
from tuner.memory import MemoryInputs, compute_memory
from tuner.metrics import ServingMetrics
from tuner.models import ModelSpec, kernel_kind
from tuner.perf import (
    FITTABLE_FACTORS,
    Calibration,
    InstanceState,
    RooflineModel,
    default_calibration,
    factor_range,
    flag_cap_per_rank,
    predict_traffic,
)
from tuner.topology import Role, Topology

# Bounds of each drawn deviation (documented so a truth is plausible, not adversarial).
EFFICIENCY_SPREAD = 0.25  # fractions of a peak: x U(0.75, 1.25), capped at 1
COST_SPREAD = (0.6, 1.6)  # fixed costs (latencies, overheads): x U(0.6, 1.6)
MTP_ACCEPTANCE = (0.55, 0.85)  # per-position acceptance of the drafter on the truth's data
IMBALANCE = (0.05, 0.30)  # busiest EP rank's extra load at EP 8 (grows with log2 of the EP size)
LAYOUT_SIGMA = 0.12  # log-sd of the step-time factor per (tp, dp, ep, mtp)
KV_CAPACITY = (0.95, 1.05)  # the real KV cache holds this fraction of the modelled one
NOISE = 0.04  # log-sd of a measurement's rate and latency (per trial; a third of it per level)
LAUNCH_FAILURE_RATE = 0.03  # configs that crash at start-up (fixed per config: it fails every time)
#: The truth's own physics of kernel kinds (used only when kernel_kind_sigma is set): which parts of a model's
#: kernels (tuner.models.KernelKind fields) each kernel efficiency depends on. An MXFP4 expert GEMM, an FP8
#: block-scaled one and a BF16 one are different kernels, as are MLA, GQA and sliding-window attention, so a real
#: cluster's efficiency of each differs by kernel; the truth draws one log-normal factor per (efficiency, field,
#: value), shared by every model with that value, independent of the tuner's own keying (tuner.cluster._fit).
KERNEL_FIELDS: dict[str, tuple[str, ...]] = {
    "hbm_efficiency": ("dense_weights", "expert_weights", "kv_cache"),
    "flop_efficiency": ("dense_weights", "expert_weights"),
    "prefill_flop_efficiency": ("dense_weights", "expert_weights", "attention"),
    "attention_flop_efficiency": ("attention", "kv_cache"),
    "moe_gemm_efficiency": ("expert_weights",),
    "fp8_gemm_efficiency": ("dense_weights", "expert_weights"),
}


def _seeded(*key: object) -> np.random.Generator:
    digest = hashlib.sha256("|".join(map(str, key)).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:8], "little"))


# Factors added after the truths were fixed: drawn from their own generator, so every earlier draw (and with it
# every truth, and the benchmark's published figures) stays what it was.
LATER_FACTORS = ("request_step_us", "streamed_request_share")  # each after the one before: earlier draws stay


def draw_calibration(base: Calibration, rng: np.random.Generator,
                     later_rng: np.random.Generator | None = None) -> Calibration:
    """Every fittable factor moved within its bound: fractions (fields capped at 1) by +-25%, other factors
    (latencies, overheads, skews) x0.6-1.6, each kept inside the field's documented range."""
    update: dict[str, float] = {}
    for name in FITTABLE_FACTORS:
        if name == "attention_flop_efficiency":
            continue  # follows the prefill draw below (same tensor cores); drawing it would reshuffle the truths
        if name in LATER_FACTORS:
            continue
        value = float(getattr(base, name))
        low, high = factor_range(name)
        if name == "mtp_acceptance":
            drawn = float(rng.uniform(*MTP_ACCEPTANCE))
        elif high == 1.0:
            drawn = value * float(rng.uniform(1 - EFFICIENCY_SPREAD, 1 + EFFICIENCY_SPREAD))
        else:
            drawn = value * float(rng.uniform(*COST_SPREAD))
        update[name] = min(max(drawn, low), high)
    later = later_rng or np.random.default_rng(0)
    for name in LATER_FACTORS:
        low, high = factor_range(name)
        update[name] = min(max(float(getattr(base, name)) * float(later.uniform(*COST_SPREAD)), low), high)
    if base.attention_flop_efficiency is not None:
        ratio = update["prefill_flop_efficiency"] / base.prefill_flop_efficiency
        update["attention_flop_efficiency"] = min(base.attention_flop_efficiency * ratio, 1.0)
    return base.model_copy(update=update)


@dataclass(frozen=True)
class HiddenTruth:
    """The parameters of one simulated cluster. Never handed to the tuner."""

    seed: int
    calibration: Calibration
    expert_imbalance: float
    layout_sigma: float
    kv_capacity_factor: float
    noise: float
    launch_failure_rate: float
    # log-sd of a second step-time factor per (model, layout): 0 (the default, every published truth) makes the
    # per-layout factor a pure cluster property; benchmarks/transfer.py sets it so what one model measured on a
    # layout transfers to the next only in part
    model_layout_sigma: float = 0.0
    # log-sd of each kernel efficiency's factor per kernel kind (KERNEL_FIELDS): 0 (the default, every published
    # truth) gives every model the cluster's one calibration; benchmarks/transfer.py sets it, so what one kind of
    # model measured about the kernels holds for another kind only in part, as on real hardware
    kernel_kind_sigma: float = 0.0

    def calibration_for(self, model: ModelSpec) -> Calibration:
        """The calibration this model's kernels run at: the cluster's, each kernel efficiency times its kind's
        factor (the product over the fields it depends on, each log-sd kernel_kind_sigma / sqrt(fields))."""
        if self.kernel_kind_sigma <= 0:
            return self.calibration
        kind = kernel_kind(model)
        update = {}
        for name, fields in KERNEL_FIELDS.items():
            value = getattr(self.calibration, name)
            if value is None:
                continue
            sd = self.kernel_kind_sigma / math.sqrt(len(fields))
            log_f = sum(float(_seeded("kernel-kind", self.seed, name, f, getattr(kind, f)).normal(0.0, sd))
                        for f in fields)
            low, high = factor_range(name)
            update[name] = min(max(float(value) * math.exp(log_f), low), high)
        return self.calibration.model_copy(update=update)

    @classmethod
    def draw(cls, seed: int, gpu_name: str = "gb300") -> HiddenTruth:
        rng = _seeded("truth", seed)
        later = _seeded("truth-later-factors", seed)
        return cls(seed=seed, calibration=draw_calibration(default_calibration(gpu_name), rng, later),
                   expert_imbalance=float(rng.uniform(*IMBALANCE)), layout_sigma=LAYOUT_SIGMA,
                   kv_capacity_factor=float(rng.uniform(*KV_CAPACITY)), noise=NOISE,
                   launch_failure_rate=LAUNCH_FAILURE_RATE)

    def step_factor(self, topo: Topology, model: str = "") -> float:
        """How much slower (>1) or faster a step of this layout is than the calibrated roofline says (`model`:
        the model's name, read only when model_layout_sigma is set)."""
        layout = float(_seeded("layout", self.seed, topo.tp, topo.dp, topo.ep, topo.mtp).lognormal(0.0,
                                                                                                  self.layout_sigma))
        if self.model_layout_sigma > 0:
            layout *= float(_seeded("model-layout", self.seed, model, topo.tp, topo.dp, topo.ep, topo.mtp)
                            .lognormal(0.0, self.model_layout_sigma))
        ep_size = topo.tp * topo.dp if topo.ep else 1
        imbalance = 1.0 + self.expert_imbalance * math.log2(ep_size) / 3 if ep_size > 1 else 1.0
        return layout * imbalance

    def fails_at_launch(self, topo: Topology) -> bool:
        key = (topo.tp, topo.dp, topo.ep, topo.mtp, topo.gpu_memory_utilization, topo.max_num_seqs,
               topo.max_num_batched_tokens)
        return bool(_seeded("launch", self.seed, *key).random() < self.launch_failure_rate)


class _TruthRoofline(RooflineModel):
    """The roofline with the truth's factors and a KV cache `kv_capacity_factor` times the modelled one."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, truth: HiddenTruth) -> None:
        super().__init__(model, gpu, truth.calibration_for(model))
        self._kv_factor = truth.kv_capacity_factor

    def state(self, topo: Topology, role: Role, *, isl: int, osl: int) -> InstanceState:
        found = super().state(topo, role, isl=isl, osl=osl)
        # Only the KV cache is off: max-num-seqs and the token budget are flags the truth honours exactly.
        kv_cap = max(1, int(found.kv_cap_per_rank * self._kv_factor))
        return dataclasses.replace(found, kv_cap_per_rank=kv_cap,
                                   cap_per_rank=max(1, min(flag_cap_per_rank(topo, role), kv_cap)))


class HiddenTruthBackend(Backend):
    """Answers trials from a hidden truth: fresh noise per measurement (seeded by the trial's seed)."""

    name = "hidden-truth"

    def __init__(self, truth: HiddenTruth) -> None:
        self._truth = truth
        self._perf: dict[str, _TruthRoofline] = {}

    def expected_curve(self, request: TrialRequest) -> list[ServingMetrics]:
        """The noiseless answer (what the deployment does on average): the benchmark scores found configs by it."""
        group = request.deployment.groups[0]
        perf = self._perf.get(request.model_path + request.gpu)
        if perf is None:
            perf = self._perf[request.model_path + request.gpu] = _TruthRoofline(
                _model(request.model_path), get_gpu(request.gpu), self._truth)
        factor = self._truth.step_factor(group.topology, perf.model.name)
        points = predict_traffic(perf, group.topology, group.role, request.workload).points
        return [_noisy(p, 1.0 / factor, factor) for p in points]

    def run(self, request: TrialRequest) -> TrialResult:
        started = time.monotonic()
        if len(request.deployment.groups) != 1 or request.deployment.groups[0].count != 1:
            return TrialResult.failed(TrialStatus.UNSUPPORTED, "a hidden truth measures one instance per trial")
        topo = request.deployment.groups[0].topology
        memory = compute_memory(_model(request.model_path), get_gpu(request.gpu), topo,
                                MemoryInputs.for_workload(request.workload))
        if not memory.fits:
            return TrialResult.failed(TrialStatus.OOM, f"start-up: {memory.verdict()}",
                                      duration_s=time.monotonic() - started)
        if self._truth.fails_at_launch(topo):
            return TrialResult.failed(TrialStatus.CRASHED, "engine core died at start-up (hidden truth)",
                                      duration_s=time.monotonic() - started)
        rng = _seeded("measure", self._truth.seed, request.trial_id, request.seed)
        noise = self._truth.noise
        rate, latency = rng.lognormal(0.0, noise, size=2)
        points = [_noisy(p, rate * rng.lognormal(0.0, noise / 3), latency * rng.lognormal(0.0, noise / 3))
                  for p in self.expected_curve(request)]
        return TrialResult(status=TrialStatus.OK, points=tuple(points), duration_s=time.monotonic() - started)
