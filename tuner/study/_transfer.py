"""A study that starts from what its cluster already taught: the learnt calibration, per-layout offsets, crashes.

Built once per study (tuner.cluster learns from the store when the study opens), it gives the simulator prior
its calibration, a bounded prior log-factor per parallel layout and the configs to leave out (the known risks:
the guided sampler's prior, the warm start and the screen every sampler's proposals pass all skip them, unless the
study retries risks), and records each finished trial back into the store, so the next model starts further along.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tuner.backends import TrialRequest, TrialResult
from tuner.cluster import (
    GUARD_TRIALS,
    ClusterKey,
    ClusterKnowledge,
    ClusterRecorder,
    ClusterStore,
    FitSample,
    GuardVerdict,
    KnownRisk,
    guard,
    learn,
    load_knowledge,
    pretrial_knowledge,
)
from tuner.hardware import GpuSpec
from tuner.models import ModelSpec, kernel_kind
from tuner.perf import Calibration
from tuner.space import Phase, SearchSpace, phase_role
from tuner.study._prior import SimulatorPrior
from tuner.topology import Topology

#: Cross-check what the store learnt across its own models before a new model takes it (tuner.cluster._crosscheck);
#: False: the store's fit as it stands (benchmarks/transfer.py --ablate crosscheck).
CROSS_CHECK = True


@dataclass
class _Guarding:
    """The new model's first measured trials, then what the guard kept (tuner.cluster._guard)."""

    samples: list[FitSample] = field(default_factory=list)
    knowledge: ClusterKnowledge | None = None
    verdict: GuardVerdict | None = None


@dataclass(frozen=True)
class StudyTransfer:
    """The cluster knowledge a study starts from, and where its own trials go."""

    knowledge: ClusterKnowledge
    recorder: ClusterRecorder | None = None
    use_offsets: bool = True
    skip_risks: bool = True  # False: the study retries the cluster's known crashes (`tune --retry-risks`)
    model: ModelSpec | None = None  # the study's model and GPU: the guard needs them (None: no guard)
    gpu: GpuSpec | None = None
    _guarding: _Guarding = field(default_factory=_Guarding, compare=False, repr=False)

    @classmethod
    def open(cls, store: ClusterStore, gpu: GpuSpec, model: ModelSpec, model_path: str, *,
             vllm_version: str | None = None, cluster: str | None = None, learn_from_store: bool = True,
             record: bool = True, retry_risks: bool = False) -> StudyTransfer:
        """learn_from_store: start from the store (False: record only, the study starts fresh); record: add its
        trials; retry_risks: launch the known risks like any config (after a fix on the cluster)."""
        key = ClusterKey.of(gpu, vllm_version, cluster)
        kind = kernel_kind(model)
        if not learn_from_store:
            knowledge = learn(key, gpu, [], kind=kind)
        elif CROSS_CHECK:
            knowledge = pretrial_knowledge(store, key, gpu, kind)
        else:
            knowledge = load_knowledge(store, key, gpu, kind=kind)
        recorder = ClusterRecorder(store, key, model.name, model_path) if record else None
        return cls(knowledge, recorder, skip_risks=not retry_risks, model=model, gpu=gpu)

    @property
    def active(self) -> ClusterKnowledge:
        """What the study's prior uses: the knowledge it started from, or what the guard kept of it."""
        return self._guarding.knowledge or self.knowledge

    @property
    def verdict(self) -> GuardVerdict | None:
        """The guard's decision, once the study's first GUARD_TRIALS trials are measured."""
        return self._guarding.verdict

    def known_risk(self, topo: Topology) -> KnownRisk | None:
        """The known crash this config repeats on this cluster, when the study skips them (else None)."""
        return self.knowledge.risk(topo) if self.skip_risks else None

    @property
    def calibration(self) -> Calibration | None:
        """The learnt calibration; None while the cluster taught nothing (the GPU's documented one applies)."""
        return None if self.knowledge.empty else self.active.calibration

    def prior(self, space: SearchSpace, phase: Phase, model: ModelSpec, gpu: GpuSpec) -> SimulatorPrior:
        role = phase_role(phase)
        k = self.active
        return SimulatorPrior.build(
            space, phase, model, gpu, calibration=k.calibration,
            offset=(lambda topo: k.offset(role, topo)) if self.use_offsets else None,
            skip=(lambda topo: self.known_risk(topo) is not None) if self.skip_risks else None)

    def risks_in(self, space: SearchSpace, phase: Phase, model: ModelSpec) -> list[KnownRisk]:
        """Known launch risks among the phase's configs (for the plan: said before any GPU is spent)."""
        out = []
        for topo in space.expand(phase, model):
            risk = self.knowledge.risk(topo)
            if risk is not None:
                out.append(risk)
        return out

    def record(self, study: str, trial: int, request: TrialRequest, result: TrialResult) -> bool:
        """Store the trial; True when the guard has just changed the prior (the sampler rebuilds it)."""
        if self.recorder is not None:
            self.recorder.record(study, trial, request, result)
        return self._guard(study, request, result)

    def _guard(self, study: str, request: TrialRequest, result: TrialResult) -> bool:
        g = self._guarding
        if (self.model is None or self.gpu is None or g.verdict is not None or self.knowledge.runs == 0
                or not result.status.ok or not result.points or len(request.deployment.groups) != 1):
            return False
        group = request.deployment.groups[0]
        g.samples.append(FitSample(self.model, group.topology, group.role, request.workload, tuple(result.points)))
        if len(g.samples) < GUARD_TRIALS:
            return False
        kept, g.verdict = guard(self.knowledge, g.samples, self.gpu, self.model.name)
        g.knowledge = kept
        if self.recorder is not None:
            self.recorder.store.record_guard(self.recorder.key, self.model.name, study, g.verdict.as_json())
        return g.verdict.whole_fallback or bool(g.verdict.fell_back)


def open_transfer(storage_url: str, gpu: GpuSpec, model: ModelSpec, model_path: str, *,
                  vllm_version: str | None = None, cluster: str | None = None, learn: bool = True,
                  retry_risks: bool = False) -> StudyTransfer:
    """The transfer of a study stored at `storage_url`: its cluster tables live in the same database."""
    return StudyTransfer.open(ClusterStore(storage_url), gpu, model, model_path, vllm_version=vllm_version,
                              cluster=cluster, learn_from_store=learn, retry_risks=retry_risks)


def default_prior(space: SearchSpace, phase: Phase, model: ModelSpec, gpu: GpuSpec,
                  transfer: StudyTransfer | None) -> SimulatorPrior:
    """The study's prior: from its cluster's knowledge when it has one, else the documented calibration."""
    if transfer is None or transfer.knowledge.empty:
        return SimulatorPrior.build(space, phase, model, gpu)
    return transfer.prior(space, phase, model, gpu)


def cluster_notes(storage_url: str, space: SearchSpace, model: ModelSpec, gpu: GpuSpec,
                  cluster: str | None = None, retry_risks: bool = False) -> list[str]:
    """What `tune` says before the first trial: what the cluster store holds for this cluster, and which of the
    space's configs crashed here for another model (no sampler launches them, unless the study retries risks)."""
    from tuner.cluster import learn

    store = ClusterStore(storage_url)
    key = ClusterKey.of(gpu, space.cluster.vllm_version, cluster)
    runs = store.read_runs(key)
    knowledge = learn(key, gpu, [], store.read_failures(key))
    models = sorted({r.model_name for r in runs})
    lines = [f"cluster {key.label()}: {len(runs)} trials of {len(models)} model(s) in the store"
             + (" (this study starts from their calibration)" if runs else " (a fresh start)")]
    transfer = StudyTransfer(knowledge)
    action = "retried (--retry-risks)" if retry_risks else "skipped (--retry-risks to retry)"
    for phase in space.phases:
        for risk in transfer.risks_in(space, phase, model):
            lines.append(f"{phase} {risk.topology.label()}: {risk.note()}; {action}")
    return lines
