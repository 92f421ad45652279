"""Screening and repair: which configs of a phase can run, before any GPU time is spent.

A proposal is screened against vLLM's and the cluster's rules (`Topology.check`), the memory model and the
cluster's known risks (a layout+flags that crashed here for another model: tuner.cluster); a rejected one is told
as it is (so the sampler learns the boundary) and repaired: the nearest config that can run, is not a known risk
and is not yet measured is enqueued instead. The same rules give the set of launchable configs, which ends a
study whose budget is larger than the space. Every sampler goes through this screen, so none launches a known
crash (a study started with retry_risks passes no risk check and retries them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tuner.cluster import KnownRisk
from tuner.errors import TopologyError
from tuner.hardware import GpuSpec
from tuner.memory import MemoryInputs, compute_memory
from tuner.models import ModelSpec
from tuner.space import Phase, SearchSpace
from tuner.topology import Topology, ep_on_one_gpu

Rejection = tuple[str, float, str]  # (constraint key, amount, reason)
RiskCheck = Callable[[Topology], KnownRisk | None]


def params_key(params: dict[str, Any]) -> tuple:
    """A config's identity for dedupe: its params without the concurrency level."""
    return tuple(sorted((k, v) for k, v in params.items() if k != "concurrency"))


@dataclass
class Screen:
    space: SearchSpace
    phase: Phase
    model: ModelSpec
    gpu: GpuSpec
    risk: RiskCheck | None = None  # the cluster's known launch crashes (StudyTransfer.known_risk)
    _fitting: list[Topology] | None = field(default=None, init=False, repr=False)
    _launchable: frozenset[tuple] | None = field(default=None, init=False, repr=False)

    def screen(self, params: dict[str, Any]) -> tuple[Topology | None, Rejection | None]:
        """(topology, None) when launchable, else (None, (constraint key, amount, reason))."""
        topo, rejection = self.validity(params)
        if topo is None:
            return None, rejection
        workload = self.space.phase_workload(self.phase)
        memory = compute_memory(self.model, self.gpu, topo, MemoryInputs.for_workload(workload))
        if not memory.fits:
            return None, ("memory", max(memory.shortfall_gib, 0.01), memory.verdict())
        known = self.known_risk(topo)
        if known is not None:
            return None, ("failed", 1.0, risk_reason(known))
        return topo, None

    def known_risk(self, topo: Topology) -> KnownRisk | None:
        return self.risk(topo) if self.risk is not None else None

    def validity(self, params: dict[str, Any]) -> tuple[Topology | None, Rejection | None]:
        """The screen's rules of vLLM and the cluster, memory aside: (topology, None) or (None, rejection)."""
        if ep_on_one_gpu(params):
            return None, ("valid", 1.0, "EP on a single GPU")
        topo = self.space.topology(self.phase, params)
        try:
            topo.check(self.model, cluster_gpus=self.space.cluster.num_gpus)
        except TopologyError as exc:
            return None, ("valid", 1.0, exc.message)
        return topo, None

    def fitting_configs(self) -> list[Topology]:
        if self._fitting is None:
            w = self.space.phase_workload(self.phase)
            self._fitting = [t for t in self.space.expand(self.phase, self.model)
                             if compute_memory(self.model, self.gpu, t, MemoryInputs(isl=w.isl, osl=w.osl)).fits]
        return self._fitting

    def runnable_configs(self) -> list[Topology]:
        """The fitting configs that are not a known risk on this cluster: what a repair may enqueue."""
        return [t for t in self.fitting_configs() if self.known_risk(t) is None]

    def launchable_keys(self) -> frozenset[tuple]:
        """Keys of the configs screening would launch: the runnable ones (memory, risks already checked) that are
        valid."""
        if self._launchable is None:
            params = [self.space.params_of(self.phase, t) for t in self.runnable_configs()]
            self._launchable = frozenset(params_key(p) for p in params if self.validity(p)[0] is not None)
        return self._launchable

    def nearest_unmeasured(self, params: dict[str, Any], taken: set[tuple]) -> dict[str, Any] | None:
        """The repair of a rejected proposal: the closest runnable config not in `taken`, by L1 distance over each
        knob's position in its list of choices (normalised to [0, 1])."""
        choices = self.space.param_choices(self.phase)

        def position(name: str, value: Any) -> float:
            options = choices[name]
            if len(options) < 2:
                return 0.0
            if value in options:
                index = options.index(value)
            else:  # a value outside the list (e.g. EP forced off on one GPU): the closest choice
                index = min(range(len(options)), key=lambda i: abs(float(options[i]) - float(value)))
            return index / (len(options) - 1)

        candidates = [self.space.params_of(self.phase, t) for t in self.runnable_configs()]
        candidates = [c for c in candidates if params_key(c) not in taken]
        if not candidates:
            return None
        target = [position(k, params[k]) for k in choices]
        return min(candidates, key=lambda c: sum(abs(position(k, c[k]) - x) for k, x in zip(choices, target,
                                                                                              strict=True)))


def risk_reason(risk: KnownRisk) -> str:
    """What a proposal screened as a known risk is told: the failure, for which models, the last reason, the fix."""
    return (f"{risk.note()} (last: {risk.reason.strip()[:200] or 'no reason recorded'}); not launched again: "
            "start the study with retry_risks (`tune --retry-risks`) to retry it")
