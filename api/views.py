"""Read models of a study (detail, trials, pareto), kept current incrementally and shared among requests.

Each study has one LiveCampaign (tuner.study): a refresh reads only the trials added or still running since the
last one and folds them into the phase fronts, the per-topology curves and the PD composition. One refresh runs
at a time per study and concurrent requests share it; a status request never waits for one (it is served the
last snapshot). Snapshots are immutable once published: what is built from one (the serialised front) is cached
on it.

A restart would otherwise pay the cold read (every trial through Optuna: seconds at 10,000 trials). So each
published front and progress is also written to SNAPSHOT_DIR/<study id>.json; after a restart the first request
is answered from that file at once (the front as of the last snapshot, `trials_stored` says how many trials it
covers) while the study is rebuilt in the background, and the next request after the rebuild sees it current.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from api.models import StudyRecord, StudyStatus
from api.schemas import (
    ComposedFrontPoint,
    Failure,
    FrontPoint,
    LevelPublic,
    ParetoPublic,
    PhaseFront,
    PhaseProgress,
    TrialPublic,
)
from tuner.errors import TopotuneError
from tuner.space import SearchSpace
from tuner.study import PHASE_METRICS, CampaignMeta, CampaignResult, LiveCampaign, StoredPoint, TrialRecord, TrialRow

MIN_REFRESH_S = 0.5  # a snapshot younger than this is served as it is (the page polls every 3 s)
PERSIST_EVERY_S = 2.0  # a running study's snapshot file is rewritten at most this often


@dataclass
class Snapshot:
    version: int
    study_ids: dict[str, int]  # phase -> Optuna study id (dashboard links)
    trials_stored: int
    result: CampaignResult | None = None
    space: SearchSpace | None = None
    meta: CampaignMeta | None = None
    error: str | None = None
    rows: list[TrialRow] = field(default_factory=list)
    restored: dict[str, Any] | None = None  # the persisted front and progress, until the rebuild is done
    pareto_json: dict[StudyStatus, bytes] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _memo: dict[str, Any] = field(default_factory=dict)

    def memo(self, key: str, build: Callable[[], Any]) -> Any:
        """What a reader builds from this snapshot (the page's figures), built once per snapshot."""
        with self.lock:
            if key not in self._memo:
                self._memo[key] = build()
            return self._memo[key]


@dataclass
class _Entry:
    live: LiveCampaign
    snapshot: Snapshot = field(default_factory=lambda: Snapshot(version=-1, study_ids={}, trials_stored=0))
    refreshed_at: float = -1e9
    refreshed_status: StudyStatus | None = None  # the study's status at the last refresh
    persisted_at: float = -1e9
    persisted: tuple[int, StudyStatus] | None = None  # (version, status) in the snapshot file
    persist_lock: threading.Lock = field(default_factory=threading.Lock)
    lock: threading.Lock = field(default_factory=threading.Lock)  # one refresh at a time


class ResultCache:
    def __init__(self, storage_url: str, snapshot_dir: Path | None = None, max_entries: int = 64) -> None:
        self.storage_url = storage_url
        self.snapshot_dir = snapshot_dir
        self.max_entries = max_entries
        self._entries: OrderedDict[int, _Entry] = OrderedDict()
        self._lock = threading.Lock()

    def _entry(self, record: StudyRecord) -> _Entry:
        with self._lock:
            entry = self._entries.get(record.id)
            if entry is None or entry.live.name != record.campaign:
                entry = self._entries[record.id] = _Entry(LiveCampaign(self.storage_url, record.campaign))
            self._entries.move_to_end(record.id)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            return entry

    def snapshot(self, record: StudyRecord, *, wait: bool = True, full: bool = False) -> Snapshot:
        """The study's current snapshot. wait=False (status requests): never blocks on a refresh another request
        is running, and serves the last snapshot instead. full=True (trial lists, exports, pages): the built
        result, never only the persisted front."""
        entry = self._entry(record)
        if self._fresh(entry, record):
            self._persist(record, entry)  # a no-op unless the study's end is not on disk yet
            return entry.snapshot
        if entry.snapshot.version < 0 and not full and self._restore(record, entry):
            return entry.snapshot  # a restart: the persisted front now, the rebuild in the background
        if not entry.lock.acquire(blocking=full or (wait and entry.snapshot.restored is None)):
            return entry.snapshot
        try:
            if not self._fresh(entry, record):  # nobody refreshed while we waited
                self._refresh(entry, record)
        finally:
            entry.lock.release()
        return entry.snapshot

    @staticmethod
    def _fresh(entry: _Entry, record: StudyRecord) -> bool:
        """Refreshed less than MIN_REFRESH_S ago, and the study's status has not changed since (a study that
        just ended is read once more: its last trials landed before its status changed)."""
        return time.monotonic() - entry.refreshed_at < MIN_REFRESH_S and entry.refreshed_status == record.status

    # -- persisted snapshots ------------------------------------------------------------------------------------
    def _path(self, study_id: int) -> Path | None:
        return self.snapshot_dir / f"{study_id}.json" if self.snapshot_dir is not None else None

    def _restore(self, record: StudyRecord, entry: _Entry) -> bool:
        """Serve the persisted snapshot (if any) and rebuild in a background thread."""
        path = self._path(record.id)
        if path is None or entry.snapshot.restored is not None:
            return entry.snapshot.restored is not None
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            return False
        if saved.get("campaign") != record.campaign:
            return False
        entry.snapshot = Snapshot(version=-1, study_ids={k: int(v) for k, v in saved["study_ids"].items()},
                                  trials_stored=int(saved["trials_stored"]), restored=saved)

        def rebuild() -> None:
            with entry.lock:
                if entry.snapshot.version < 0:
                    self._refresh(entry, record)

        threading.Thread(target=rebuild, name=f"topotune-rebuild-{record.id}", daemon=True).start()
        return True

    def _persist(self, record: StudyRecord, entry: _Entry) -> None:
        path = self._path(record.id)
        snap = entry.snapshot
        if path is None or snap.version < 0 or entry.persisted == (snap.version, record.status) or (
                record.status.active and time.monotonic() - entry.persisted_at < PERSIST_EVERY_S):
            return
        if not entry.persist_lock.acquire(blocking=False):
            return  # another request is writing it
        try:
            self._write(path, record, entry, snap)
        finally:
            entry.persist_lock.release()

    def _write(self, path: Path, record: StudyRecord, entry: _Entry, snap: Snapshot) -> None:
        body = {"campaign": record.campaign, "version": snap.version, "trials_stored": snap.trials_stored,
                "points_stored": points_stored(snap),
                "study_ids": snap.study_ids, "pareto": json.loads(pareto(record, snap)),
                "progress": {p: v.model_dump(mode="json") for p, v in phase_progress(record, snap).items()}}
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(body))
            tmp.replace(path)
            entry.persisted_at, entry.persisted = time.monotonic(), (snap.version, record.status)

    def _refresh(self, entry: _Entry, record: StudyRecord) -> None:
        live = entry.live
        error = None
        try:
            changed = live.refresh()
        except TopotuneError as exc:
            changed, error = True, exc.user_message()
        except (KeyError, ValueError) as exc:  # a phase study created but its metadata not yet written
            changed, error = True, f"study not initialised yet ({exc})"
        entry.refreshed_at, entry.refreshed_status = time.monotonic(), record.status
        if changed or error != entry.snapshot.error:
            entry.snapshot = Snapshot(version=live.version, study_ids=live.study_ids,
                                      trials_stored=live.trials_stored, result=live.result, space=live.space,
                                      meta=live.meta, error=error or live.error, rows=live.rows())
        self._persist(record, entry)

    def warm(self, records: list[StudyRecord]) -> threading.Thread:
        """Build the snapshots of these studies in the background (the service does this at start)."""
        def run() -> None:
            for record in records:
                self.snapshot(record, full=True)

        thread = threading.Thread(target=run, name="topotune-cache-warm", daemon=True)
        thread.start()
        return thread

    # -- trials -----------------------------------------------------------------------------------------------
    def trials(self, record: StudyRecord, phase: str | None) -> list[TrialRow]:
        rows = self.snapshot(record, full=True).rows
        return rows if phase is None else [r for r in rows if r.phase == phase]


def trial_public(row: TrialRow) -> TrialPublic:
    """A trial with every load level it measured, by load."""
    r = row.record
    levels = [_level_public(r, p) for p in row.levels]
    return TrialPublic(
        phase=row.phase, trial_number=r.number, state=r.state.name,  # type: ignore[arg-type]
        status=str(r.attrs.outcome) if r.attrs.outcome is not None else None,
        kind=str(r.kind) if r.kind is not None else None, params=r.params,
        values=list(r.values) if r.values else None, constraints=r.constraints, feasible=r.feasible,
        reason=r.attrs.reason, duration_s=r.attrs.duration_s, concurrency=r.attrs.concurrency, levels=levels)


def _level_public(r: TrialRecord, p: StoredPoint) -> LevelPublic:
    told = p.stored_as == r.number and r.attrs.load_level in (None, p.level)
    return LevelPublic(level=p.level, concurrency=p.metrics.concurrency, offered_rps=p.metrics.offered_rps,
                       values=list(p.values), feasible=p.feasible, told=told, stored_as=p.stored_as)


# -- builders ------------------------------------------------------------------------------------------------------
def dashboard_url(study_id: int | None) -> str | None:
    return f"/dashboard/studies/{study_id}" if study_id is not None else None


def phase_progress(record: StudyRecord, snap: Snapshot) -> dict[str, PhaseProgress]:
    if snap.result is None and snap.restored is not None:
        return {p: PhaseProgress.model_validate(v) for p, v in snap.restored["progress"].items()}
    phases = record.phases
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


def points_stored(snap: Snapshot) -> int:
    """Measured points (every load level of every trial) the snapshot holds."""
    if snap.result is None:
        return int((snap.restored or {}).get("points_stored", 0))
    return sum(len(pr.points) for pr in snap.result.phases.values())


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
        if snap.result is None and snap.restored is not None:
            data = json.dumps({**snap.restored["pareto"], "status": status.value}).encode()
            snap.pareto_json[status] = data
            return data
        result = snap.result
        phases: dict[str, PhaseFront] = {}
        composed: list[ComposedFrontPoint] = []
        if result is not None:
            for phase, pr in result.phases.items():
                phases[phase] = PhaseFront(
                    study_name=pr.study_name, objectives=list(PHASE_METRICS[phase]), points_total=len(pr.points),
                    points_feasible=sum(p.feasible for p in pr.points),
                    front=[FrontPoint(trial_number=p.trial, level=p.level, stored_as=p.stored_as,
                                      deployment=p.deployment.name,
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
