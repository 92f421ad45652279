"""A campaign's result kept current as trials finish, for readers that poll (the service's pages and API).

load_campaign reads every trial and recomposes the PD front: seconds at 10,000 trials, paid again after every
trial. LiveCampaign.refresh() reads only the trials added since its last read (plus those that were still
running), folds each finished one in once (counts, failures, its points, its topology's own front, the phase
front) and recomposes the PD front from the per-topology fronts only when one of them changed. A dominated
point stays dominated when points are added, so the front of (front + new points) is the front of all points.

`version` is the change counter: it moves whenever a refresh folded something in, so callers cache whatever
they build from `result` under it.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field, replace

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.backends import TrialStatus
from tuner.errors import TopotuneError
from tuner.frontier import pareto_front
from tuner.models import ModelSpec, load_model
from tuner.space import ALL_PHASES, SearchSpace
from tuner.study._campaign import CampaignResult, PhaseResult, compose_curves
from tuner.study._optuna_compat import trial_id, trials_since
from tuner.study._records import StoredPoint, stored_points
from tuner.study._storage import open_storage
from tuner.study._trial_record import (
    RUNNING_STATUS,
    CampaignMeta,
    TrialFailure,
    TrialKind,
    TrialRecord,
)
from tuner.study._versions import split_current
from tuner.topology import Topology

_FINISHED = (TrialState.COMPLETE, TrialState.FAIL, TrialState.PRUNED)
MAX_FAILURES_KEPT = 200


@dataclass(frozen=True)
class TrialRow:
    """One trial of a phase (one tried configuration), typed (the API lists these and never reads Optuna's
    attributes itself), with every load level it measured (docs/architecture.md, "Trials and their load
    levels"), as the fronts read them (`stored_points`), by load."""

    phase: str
    record: TrialRecord
    levels: tuple[StoredPoint, ...] = ()


@dataclass
class _PhaseFold:
    phase: str
    study: optuna.Study
    study_id: int
    watermark: int = -1
    open_trials: dict[int, TrialRecord] = field(default_factory=dict)  # trial id -> unfinished trial
    counts: Counter[str] = field(default_factory=Counter)  # finished trials (extra levels excluded)
    launched: int = 0
    failures: list[TrialFailure] = field(default_factory=list)
    points: list[StoredPoint] = field(default_factory=list)
    superseded: list[StoredPoint] = field(default_factory=list)  # re-verified since (tuner.study._versions)
    feasible: int = 0
    curves: dict[Topology, list[StoredPoint]] = field(default_factory=dict)  # each topology's own front
    front: list[StoredPoint] = field(default_factory=list)
    rows: dict[int, TrialRow] = field(default_factory=dict)  # trial number -> row (load levels not included)
    levels: dict[int, dict[str, StoredPoint]] = field(default_factory=dict)  # trial -> its points by load label

    def fold(self, trials: list[FrozenTrial]) -> tuple[bool, bool]:
        """(anything changed, a per-topology front changed)."""
        changed = curves_changed = False
        new_points: list[StoredPoint] = []
        records: list[TrialRecord] = []
        for t in sorted(trials, key=lambda t: t.number):
            self.watermark = max(self.watermark, trial_id(t))
            r = TrialRecord.read(t)
            records.append(r)
            if not r.is_level:  # an old study's load level is listed under its trial, from its point
                self.rows[t.number] = TrialRow(self.phase, r)
            changed = True
            if t.state not in _FINISHED:
                self.open_trials[trial_id(t)] = r
                continue
            self.open_trials.pop(trial_id(t), None)
            if not r.is_level:
                self.counts[r.status] += 1
                if r.status not in (TrialStatus.OK, RUNNING_STATUS) and r.attrs.reason and \
                        len(self.failures) < MAX_FAILURES_KEPT:
                    self.failures.append(TrialFailure(trial_number=r.number, status=r.status, reason=r.attrs.reason,
                                                      params=r.params))
            if r.is_launch and r.state == TrialState.COMPLETE:
                self.launched += 1
            mine = stored_points(self.study, self.phase, [r])
            for p in mine:
                self.levels.setdefault(p.trial, {})[p.level] = p
            new_points += mine
        # a re-verification supersedes older points: LiveCampaign folds the whole study again when one arrives,
        # so every record the split needs is in this call
        new_points, superseded = split_current(new_points, records)
        self.superseded += superseded
        if new_points:
            self.points += new_points
            feasible = [p for p in new_points if p.feasible]
            self.feasible += len(feasible)
            if feasible:
                self.front = pareto_front([*self.front, *feasible], x=_x, y=_y)
                by_topology: dict[Topology, list[StoredPoint]] = {}
                for p in feasible:
                    by_topology.setdefault(p.deployment.groups[0].topology, []).append(p)
                for topo, pts in by_topology.items():
                    old = self.curves.get(topo, [])
                    new = pareto_front([*old, *pts], x=_x, y=_y)
                    if new != old:
                        self.curves[topo] = new
                        curves_changed = True
        return changed, curves_changed

    def result(self) -> PhaseResult:
        counts = Counter(self.counts)
        for r in self.open_trials.values():
            if not r.is_level:
                counts[r.status] += 1
        return PhaseResult(phase=self.phase, study_name=self.study.study_name, counts=dict(counts),
                           launched=self.launched, points=sorted(self.points, key=_order),
                           front=list(self.front),
                           failures=sorted(self.failures, key=lambda f: f.trial_number),
                           superseded=sorted(self.superseded, key=_order))


def _order(p: StoredPoint) -> int:
    """As the campaign reads them: by the Optuna trial holding the point (a stable sort keeps a trial's levels
    in their stored order)."""
    return p.stored_as


def _x(p: StoredPoint) -> float:
    return p.values[0]


def _y(p: StoredPoint) -> float:
    return p.values[1]


class LiveCampaign:
    """The campaign `name` in `storage_url`, refreshed incrementally. Not thread-safe: callers serialise refresh()
    (the service shares one refresh among concurrent requests)."""

    def __init__(self, storage_url: str, name: str) -> None:
        self.storage_url = storage_url
        self.name = name
        self.version = 0
        self.result: CampaignResult | None = None
        self.space: SearchSpace | None = None
        self.meta: CampaignMeta | None = None
        self.error: str | None = None
        self._model: ModelSpec | None = None
        self._phases: dict[str, _PhaseFold] = {}
        self._composed: tuple[list, list, TopotuneError | None] = ([], [], None)
        self.lock = threading.Lock()

    @property
    def study_ids(self) -> dict[str, int]:
        """Optuna's id of each phase study (the dashboard's links)."""
        return {phase: fold.study_id for phase, fold in self._phases.items()}

    @property
    def trials_stored(self) -> int:
        """Trials (tried configurations); an old study's load levels stored as Optuna trials are not counted."""
        return sum(len(fold.rows) for fold in self._phases.values())

    def rows(self, phase: str | None = None) -> list[TrialRow]:
        phases = [phase] if phase is not None else list(ALL_PHASES)
        out = []
        for p in (p for p in phases if p in self._phases):
            fold = self._phases[p]
            for number, row in sorted(fold.rows.items()):
                levels = sorted(fold.levels.get(number, {}).values(), key=lambda p: p.metrics.load)
                out.append(replace(row, levels=tuple(levels)) if levels else row)
        return out

    def _open_new_phases(self) -> bool:
        storage = open_storage(self.storage_url)
        opened = False
        for phase in ALL_PHASES:
            if phase in self._phases:
                continue
            try:
                study_id = storage.get_study_id_from_name(f"{self.name}/{phase}")
            except KeyError:
                continue
            study = optuna.load_study(study_name=f"{self.name}/{phase}", storage=storage)
            if self.space is None:
                if not CampaignMeta.is_written(study.user_attrs):
                    continue  # created, metadata not yet written: the next refresh opens it
                self.meta = CampaignMeta.read(study.user_attrs)
                self.space = SearchSpace.model_validate(self.meta.space)
                self._model = load_model(self.meta.model_path)
            self._phases[phase] = _PhaseFold(phase=phase, study=study, study_id=study_id)
            opened = True
        return opened

    def refresh(self) -> bool:
        """Fold in what changed since the last refresh; True when `result` changed."""
        opened = self._open_new_phases()
        changed = curves_changed = opened
        storage = open_storage(self.storage_url)
        for phase, fold in list(self._phases.items()):
            trials = trials_since(storage, fold.study_id, fold.watermark, set(fold.open_trials))
            if fold.watermark >= 0 and any(t.user_attrs.get("kind") == TrialKind.REVERIFY for t in trials):
                # a re-verification supersedes points already folded in: fold this phase again from scratch
                fold = self._phases[phase] = _PhaseFold(phase=phase, study=fold.study, study_id=fold.study_id)
                trials = fold.study.get_trials(deepcopy=False)
                curves_changed = True
            if trials:
                c, cc = fold.fold(trials)
                changed, curves_changed = changed or c, curves_changed or cc
        if not changed:
            return False
        if curves_changed and self.space is not None and self._model is not None:
            self._composed = self._compose()
        self._publish()
        self.version += 1
        return True

    def _compose(self) -> tuple[list, list, TopotuneError | None]:
        assert self.space is not None and self._model is not None
        curves = {phase: [(topo, p.metrics) for topo, pts in fold.curves.items() for p in pts]
                  for phase, fold in self._phases.items()}
        try:
            return compose_curves(curves, self.space, self._model)
        except TopotuneError as exc:
            return [], [], exc

    def _publish(self) -> None:
        if self.space is None:
            return
        if "prefill" not in self._phases or "decode" not in self._phases:
            self._composed = compose_curves({p: [] for p in self._phases}, self.space, self._model)  # type: ignore[arg-type]
        composed, front, refusal = self._composed
        w = self.space
        assert self.meta is not None
        self.result = CampaignResult(name=self.name, model=self.meta.model, gpu=self.meta.gpu,
                                     isl=w.isl, osl=w.osl,
                                     phases={p: fold.result() for p, fold in self._phases.items()},
                                     composed=composed, composed_front=front, composition_refusal=refusal)
