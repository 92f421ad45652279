"""Read models of a study (detail, trials, pareto), cached per study and keyed by its trials' state counts.

Loading a campaign reads every trial and composes the PD front: ~0.1 s for tens of trials, seconds for 10,000.
A study changes only when a trial is added or changes state, so one cheap GROUP BY on Optuna's trials table says
whether the cached snapshot (and its serialised front) is still current.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

import optuna
from sqlalchemy import Engine, bindparam, text

from api.models import StudyRecord, StudyStatus
from api.schemas import (
    ComposedFrontPoint,
    Failure,
    FrontPoint,
    ParetoPublic,
    PhaseFront,
    PhaseProgress,
    TrialPublic,
)
from tuner.errors import TopotuneError
from tuner.space import ALL_PHASES, SearchSpace
from tuner.study import PHASE_METRICS, CampaignMeta, CampaignResult, TrialRecord, load_campaign, open_storage

_STATE_COUNTS = text(
    "SELECT s.study_id, s.study_name, t.state, COUNT(t.trial_id) FROM studies s "
    "LEFT JOIN trials t ON t.study_id = s.study_id WHERE s.study_name IN :names "
    "GROUP BY s.study_id, s.study_name, t.state"
).bindparams(bindparam("names", expanding=True))


@dataclass
class Snapshot:
    key: tuple
    study_ids: dict[str, int]  # phase -> Optuna study id (dashboard links)
    trials_stored: int
    result: CampaignResult | None = None
    space: SearchSpace | None = None
    meta: CampaignMeta | None = None
    error: str | None = None
    trial_rows: dict[str, list[TrialPublic]] | None = None
    pareto_json: dict[StudyStatus, bytes] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


class ResultCache:
    def __init__(self, storage_url: str, engine: Engine, max_entries: int = 64) -> None:
        self.storage_url = storage_url
        self.engine = engine
        self.max_entries = max_entries
        self._entries: OrderedDict[int, Snapshot] = OrderedDict()
        self._lock = threading.Lock()

    def _state(self, campaign: str) -> tuple[tuple, dict[str, int], int]:
        names = [f"{campaign}/{p}" for p in ALL_PHASES]
        try:
            with self.engine.connect() as conn:
                rows = conn.execute(_STATE_COUNTS, {"names": names}).all()
        except Exception:  # Optuna's tables do not exist before the first study opened the storage
            return (), {}, 0
        ids = {name.rsplit("/", 1)[-1]: int(sid) for sid, name, _, _ in rows}
        key = tuple(sorted((name, str(state), int(n)) for _, name, state, n in rows))
        return key, ids, sum(int(n) for *_, n in rows)

    def snapshot(self, record: StudyRecord) -> Snapshot:
        key, ids, stored = self._state(record.campaign)
        with self._lock:
            snap = self._entries.get(record.id)
            if snap is not None and snap.key == key:
                self._entries.move_to_end(record.id)
                return snap
        snap = Snapshot(key=key, study_ids=ids, trials_stored=stored)
        if ids:
            try:
                snap.result, snap.space, snap.meta = load_campaign(self.storage_url, record.campaign)
            except TopotuneError as exc:
                snap.error = exc.user_message()
            except (KeyError, ValueError) as exc:  # a phase study created but its metadata not yet written
                snap.error = f"study not initialised yet ({exc})"
        with self._lock:
            self._entries[record.id] = snap
            self._entries.move_to_end(record.id)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
        return snap

    # -- trials -----------------------------------------------------------------------------------------------
    def trials(self, record: StudyRecord, phase: str | None) -> list[TrialPublic]:
        snap = self.snapshot(record)
        with snap.lock:
            if snap.trial_rows is None:
                snap.trial_rows = {p: self._trial_rows(record.campaign, p) for p in snap.study_ids}
        rows = snap.trial_rows
        if phase is not None:
            return rows.get(phase, [])
        return [t for p in ALL_PHASES for t in rows.get(p, [])]

    def _trial_rows(self, campaign: str, phase: str) -> list[TrialPublic]:
        study = optuna.load_study(study_name=f"{campaign}/{phase}", storage=open_storage(self.storage_url))
        out = []
        for t in study.get_trials(deepcopy=False):
            r = TrialRecord.read(t)
            out.append(TrialPublic(
                phase=phase, trial_number=r.number, state=r.state.name,  # type: ignore[arg-type]
                status=str(r.attrs.outcome) if r.attrs.outcome is not None else None,
                kind=str(r.kind) if r.kind is not None else None, params=r.params,
                values=list(r.values) if r.values else None, constraints=r.constraints, feasible=r.feasible,
                reason=r.attrs.reason, duration_s=r.attrs.duration_s, concurrency=r.attrs.concurrency))
        return out


# -- builders ------------------------------------------------------------------------------------------------------
def dashboard_url(study_id: int | None) -> str | None:
    return f"/dashboard/studies/{study_id}" if study_id is not None else None


def phase_progress(record: StudyRecord, snap: Snapshot) -> dict[str, PhaseProgress]:
    phases = record.backend_options.get("phases") or list(record.space.get("phases", {}))
    out = {}
    for phase in phases:
        pr = snap.result.phases.get(phase) if snap.result else None
        out[phase] = PhaseProgress(
            study_name=f"{record.campaign}/{phase}", dashboard_url=dashboard_url(snap.study_ids.get(phase)),
            launched=pr.launched if pr else 0, budget=record.trials_per_phase,
            counts=dict(pr.counts) if pr else {},
            failures=[Failure(trial_number=f.trial_number, status=f.status, reason=f.reason[:2000],
                              params=f.params) for f in (pr.failures[:50] if pr else [])])
    return out


def exportable(result: CampaignResult) -> list:
    """The deployments /export indexes: the composed front, else the phase fronts (single-phase campaigns)."""
    return result.exportable_deployments()


def pareto(record: StudyRecord, snap: Snapshot) -> bytes:
    """The serialised front, built once per (trial states, study status)."""
    status = record.status
    with snap.lock:
        cached = snap.pareto_json.get(status)
        if cached is not None:
            return cached
        result = snap.result
        phases: dict[str, PhaseFront] = {}
        composed: list[ComposedFrontPoint] = []
        if result is not None:
            for phase, pr in result.phases.items():
                phases[phase] = PhaseFront(
                    study_name=pr.study_name, objectives=list(PHASE_METRICS[phase]), points_total=len(pr.points),
                    points_feasible=sum(p.feasible for p in pr.points),
                    front=[FrontPoint(trial_number=p.trial_number, deployment=p.deployment.name,
                                      topology=p.deployment.groups[0].topology.label(),
                                      concurrency=p.metrics.concurrency, params=p.params,
                                      objective_values=list(p.values),
                                      total_tok_s_per_gpu=p.metrics.total_tok_s_per_gpu,
                                      tok_s_per_user=p.metrics.tok_s_per_user, ttft_ms_p50=p.metrics.ttft_ms_p50,
                                      itl_ms_p50=p.metrics.itl_ms_p50, constraints=p.constraints)
                           for p in sorted(pr.front, key=lambda p: -p.values[0])])
            composed = [ComposedFrontPoint(point=i, deployment=p.name, num_gpus=p.num_gpus,
                                           total_tok_s_per_gpu=p.total_tok_s_per_gpu, tok_s_per_user=p.tok_s_per_user,
                                           ttft_ms=p.ttft_ms, itl_ms=p.itl_ms,
                                           export_url=f"/v1/studies/{record.id}/export?point={i}&format=vllm")
                        for i, p in enumerate(result.composed_front)]
        body = ParetoPublic(
            study_id=record.id, campaign=record.campaign, status=status, trials_stored=snap.trials_stored,
            constraints=dict(record.space.get("constraints", {})), phases=phases, composed_front=composed,
            composition_error=(result.composition_error if result else snap.error),
            exportable_points=len(exportable(result)) if result else 0)
        data = body.model_dump_json().encode()
        snap.pareto_json[status] = data
        return data
