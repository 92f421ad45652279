"""The live view of a running study: the trials in flight with the tail of their logs, and the latest events.

Cheap by construction, so a page may ask every two seconds: it reads only the RUNNING trials (one filtered query
per phase) and the last events, never the whole study or a front. Log folders come from the trials' stored
`artifacts_dir` and are read only when they resolve under the service's artifacts folder.
"""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import optuna
from optuna.trial import TrialState
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.models import EventRecord, StudyRecord
from tuner.study import TrialRecord, open_storage
from tuner.trial_logs import tail_text, trial_log_files

MAX_IN_FLIGHT = 32
MAX_LOG_FILES = 4
LOG_TAIL_BYTES = 6 * 1024


class LogTail(BaseModel):
    name: str
    size_bytes: int
    tail: str


class InFlightTrial(BaseModel):
    phase: str
    trial_number: int
    config: str
    params: dict[str, object]
    running_s: float | None
    heartbeat_age_s: float | None
    logs: list[LogTail]
    logs_note: str | None = None


class LiveEvent(BaseModel):
    id: int
    at: datetime
    kind: str
    phase: str | None
    trial_number: int | None
    message: str


class LiveView(BaseModel):
    status: str
    active: bool
    in_flight: list[InFlightTrial]
    events: list[LiveEvent]
    last_event_id: int


def read_trial_logs(folder: str | None, artifacts_root: Path) -> tuple[list[LogTail], str | None]:
    """The tails of a trial's log files, or why there are none; symlinks are resolved before the root check."""
    if not folder:
        return [], "no artifacts folder recorded yet"
    path = Path(folder).resolve()
    if not path.is_relative_to(artifacts_root.resolve()):
        return [], f"{folder} is outside the service's artifacts folder: not read"
    if not path.is_dir():
        return [], f"no log folder on this machine yet ({folder}); under Ray it is on the node that runs the trial"
    files = trial_log_files(path)[:MAX_LOG_FILES]
    if not files:
        return [], f"no log files in {folder} yet"
    return [LogTail(name=str(f.relative_to(path)), size_bytes=f.stat().st_size, tail=tail_text(f, LOG_TAIL_BYTES))
            for f in files], None


def _label(params: dict[str, object]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def in_flight(record: StudyRecord, storage_url: str, artifacts_root: Path) -> list[InFlightTrial]:
    storage = open_storage(storage_url)
    now = time.time()
    out: list[InFlightTrial] = []
    for phase in record.phases:
        try:
            study_id = storage.get_study_id_from_name(f"{record.campaign}/{phase}")
        except KeyError:  # the phase has not started yet
            continue
        for t in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            r = TrialRecord.read(t)
            if r.attrs.artifacts_dir is None:  # asked but not launched yet (waiting for a slot)
                continue
            start = r.started_at  # Optuna stores local time
            beat = r.attrs.heartbeat_at
            logs, note = read_trial_logs(r.attrs.artifacts_dir, artifacts_root)
            out.append(InFlightTrial(phase=phase, trial_number=t.number, config=_label(t.params), params=t.params,
                                     running_s=round(now - start, 1) if start else None,
                                     heartbeat_age_s=round(now - float(beat), 1) if beat else None,
                                     logs=logs, logs_note=note))
            if len(out) >= MAX_IN_FLIGHT:
                return out
    return out


def live_view(session: Session, record: StudyRecord, storage_url: str, artifacts_root: Path) -> LiveView:
    events = session.scalars(select(EventRecord).where(EventRecord.study_id == record.id)
                             .order_by(EventRecord.id.desc()).limit(20)).all()
    try:
        flying = in_flight(record, storage_url, artifacts_root) if record.status.active else []
    except (optuna.exceptions.StorageInternalError, RuntimeError):  # Optuna's tables not created yet
        flying = []
    return LiveView(status=record.status.value, active=record.status.active, in_flight=flying,
                    events=[LiveEvent(id=e.id, at=e.at, kind=e.kind, phase=e.phase, trial_number=e.trial_number,
                                      message=e.message[:500]) for e in events],
                    last_event_id=events[0].id if events else 0)
