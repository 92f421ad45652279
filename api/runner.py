"""The background runner: a small pool of daemon threads running Campaigns, never inside a request.

Study status lives in the database, so the runner survives a restart: at start it re-queues every study that was
queued or running. Each campaign runs with a StopSignal: cancel ends the study (in-flight trials end cancelled),
a graceful stop interrupts it (the driver fails its in-flight trials as "driver stopped" and re-enqueues their
params), both within seconds, so a resumed study loses no trial. If the process dies instead, the next driver
reclaims the dead driver's RUNNING trials (tuner.study's resume).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from api.config import ApiSettings
from api.errors import FieldError
from api.metrics import ServiceMetrics
from api.models import EventRecord, ModelRecord, ModelStatus, StudyRecord, StudyStatus
from api.schemas import ReverifyCreate
from api.service import STUDY_FIELDS, confine_model_path
from tuner.backends import SimulatedConfig
from tuner.errors import TopotuneError
from tuner.reverify import ReverifyRequest, reverify
from tuner.study import StopReason, StopSignal, TrialEvent, request_cancel, reverify_state
from tuner.tune import tune

log = logging.getLogger("topotune.api.runner")


_MODEL_AFTER = {StudyStatus.SUCCEEDED: ModelStatus.TUNED, StudyStatus.FAILED: ModelStatus.TUNING_FAILED,
                StudyStatus.CANCELLED: ModelStatus.TUNING_CANCELLED}


def _now() -> datetime:
    return datetime.now(UTC)


def settle_model(session: Session, study_id: int, status: StudyStatus) -> None:
    """A registered model follows its study's end: tuned, tuning_failed or tuning_cancelled (not "tuning")."""
    session.execute(update(ModelRecord).where(ModelRecord.study_id == study_id,
                                              ModelRecord.status == ModelStatus.TUNING)
                    .values(status=_MODEL_AFTER[status]))


class StudyRunner:
    def __init__(self, settings: ApiSettings, sessions: sessionmaker[Session], metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.sessions = sessions
        self.metrics = metrics
        self._queue: queue.Queue[int | None] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._stops: dict[int, StopSignal] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.on_study_done: Callable[[int], None] = lambda _id: None
        self._reverifying: set[int] = set()  # studies with a re-verification in flight
        self.reverify_errors: dict[int, str] = {}  # the last failed re-verification of a study, by id

    # -- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        self._stopping.clear()
        for i in range(self.settings.max_parallel_studies):
            t = threading.Thread(target=self._work, name=f"topotune-runner-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        self.resume()

    def resume(self) -> list[int]:
        """Queue what a previous process left queued or running; finish what it was cancelling."""
        with self.sessions() as s:
            records = s.scalars(select(StudyRecord).where(StudyRecord.status.in_(
                [StudyStatus.QUEUED, StudyStatus.RUNNING, StudyStatus.CANCELLING])).order_by(StudyRecord.id)).all()
            ids = []
            for r in records:
                if r.status is StudyStatus.CANCELLING:
                    r.status, r.finished_at = StudyStatus.CANCELLED, _now()
                    settle_model(s, r.id, StudyStatus.CANCELLED)
                    s.add(EventRecord(study_id=r.id, kind="cancelled", message="cancelled while the service was down"))
                    continue
                if r.status is StudyStatus.RUNNING:
                    r.resumes += 1
                    s.add(EventRecord(study_id=r.id, kind="resumed", message="the service restarted: resuming"))
                ids.append(r.id)
            s.commit()
        for study_id in ids:
            self.submit(study_id)
        return ids

    def shutdown(self, timeout_s: float = 60.0) -> None:
        """Interrupt every running campaign (their in-flight trials stop and are re-enqueued), then join."""
        self._stopping.set()
        with self._lock:
            for stop in self._stops.values():
                stop.interrupt()
        for _ in self._threads:
            self._queue.put(None)
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self._threads = [t for t in self._threads if t.is_alive()]
        if self._threads:
            log.warning("%d campaign(s) still finishing a trial; their next driver resumes them", len(self._threads))

    @property
    def threads_alive(self) -> int:
        return sum(t.is_alive() for t in self._threads)

    # -- requests -------------------------------------------------------------------------------------------------
    def submit(self, study_id: int) -> None:
        with self._lock:
            self._stops.setdefault(study_id, StopSignal())
        self._queue.put(study_id)

    def cancel(self, session: Session, record: StudyRecord) -> StudyStatus:
        """Queued: cancelled at once. Running: the driver stops within seconds, its in-flight trials cancelled."""
        if not record.status.active:
            return record.status
        with self._lock:
            stop = self._stops.setdefault(record.id, StopSignal())
        if record.status is StudyStatus.QUEUED:
            stop.cancel()
            record.status, record.finished_at = StudyStatus.CANCELLED, _now()
            settle_model(session, record.id, StudyStatus.CANCELLED)
            session.add(EventRecord(study_id=record.id, kind="cancel", message="cancel requested"))
            session.commit()
            return record.status
        # Running: "cancelling" is written (only over "running") and committed before the driver is told, so the
        # driver's own "cancelled" always comes after it; writing it afterwards could overwrite the driver's end
        # with a "cancelling" nothing would ever settle.
        session.execute(update(StudyRecord).where(StudyRecord.id == record.id,
                                                  StudyRecord.status == StudyStatus.RUNNING)
                        .values(status=StudyStatus.CANCELLING))
        session.add(EventRecord(study_id=record.id, kind="cancel", message="cancel requested"))
        session.commit()
        request_cancel(self.settings.database_url, record.campaign)  # a driver in another replica, too
        stop.cancel()
        session.refresh(record)
        return record.status

    # -- the work -------------------------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            study_id = self._queue.get()
            if study_id is None or self._stopping.is_set():
                return
            try:
                self._run(study_id)
            except Exception:  # never let one study kill a runner thread
                log.exception("study %s crashed the runner", study_id)
                self._finish(study_id, StudyStatus.FAILED, "internal error in the runner (see the service log)")

    def _event(self, study_id: int, kind: str, message: str = "", phase: str | None = None,
               trial: int | None = None) -> None:
        with self.sessions() as s:
            s.add(EventRecord(study_id=study_id, kind=kind, message=message[:4000], phase=phase, trial_number=trial))
            s.commit()

    def _finish(self, study_id: int, status: StudyStatus, error: str | None = None) -> None:
        """The study's end, and its model's (a registered model is no longer "tuning"), in one transaction."""
        with self.sessions() as s:
            s.execute(update(StudyRecord).where(StudyRecord.id == study_id).values(
                status=status, error=error, finished_at=_now()))
            settle_model(s, study_id, status)
            s.add(EventRecord(study_id=study_id, kind=status.value, message=error or ""))
            s.commit()
        self.on_study_done(study_id)

    def _claim(self, study_id: int) -> StudyRecord | None:
        """Mark a queued study running (a detached copy), or settle one cancelled before it started."""
        with self.sessions() as s:
            record = s.get(StudyRecord, study_id)
            if record is None or not record.status.active:
                return None
            if record.status is StudyStatus.CANCELLING:
                record.status, record.finished_at = StudyStatus.CANCELLED, _now()
                settle_model(s, record.id, StudyStatus.CANCELLED)
                s.commit()
                return None
            record.status = StudyStatus.RUNNING
            record.started_at = record.started_at or _now()
            s.commit()
            s.expunge(record)
            return record

    def _event_recorder(self, study_id: int) -> Callable[[TrialEvent], None]:
        """The campaign's event callback: trial durations into /metrics, events into the study's log."""
        started: dict[tuple[str, int], float] = {}

        def on_event(e: TrialEvent) -> None:
            if e.kind == "launched":
                started[(e.phase, e.number)] = time.monotonic()
            elif e.kind in ("done", "failed") and (e.phase, e.number) in started:
                self.metrics.trial_duration_s.labels(phase=e.phase, outcome=e.kind).observe(
                    time.monotonic() - started.pop((e.phase, e.number)))
            if e.kind != "screened":  # screened-out configs are many and already in the trial table
                self._event(study_id, e.kind, f"{e.label} {e.detail}".strip(), phase=e.phase, trial=e.number)

        return on_event

    def _run(self, study_id: int) -> None:
        record = self._claim(study_id)
        if record is None:
            return
        with self._lock:
            stop = self._stops.setdefault(study_id, StopSignal())
            if self._stopping.is_set():
                stop.interrupt()
        try:  # the path was checked when the study was asked for; a symlink may have been swapped in since
            confine_model_path(record.model_path, self.settings, ("study", "model_path"))
        except FieldError as exc:
            self._finish(study_id, StudyStatus.FAILED, f"model_path: {exc.message}")
            return
        try:
            request = record.tune_request
        except ValueError as exc:  # a stored request this version cannot read: the study's failure, not the runner's
            self._finish(study_id, StudyStatus.FAILED, f"stored request: {exc}")
            return
        try:
            self._event(study_id, "started", f"campaign {record.campaign}")
            result = tune(request, self.settings, executor=self.settings.executor,
                          max_parallel=self.settings.max_parallel_trials, on_event=self._event_recorder(study_id),
                          stop=stop, name=record.campaign)
        except TopotuneError as exc:
            self._finish(study_id, StudyStatus.CANCELLED if stop.cancelled else StudyStatus.FAILED,
                         exc.renamed(STUDY_FIELDS).user_message())  # its request fields as the body names them
            return
        finally:
            with self._lock:
                self._stops.pop(study_id, None)
        if stop.reason is StopReason.INTERRUPT:
            self._event(study_id, "interrupted", "the service is stopping; the study resumes at its next start")
            return
        if stop.cancelled:
            self._finish(study_id, StudyStatus.CANCELLED)
        else:
            front = len(result.composed_front) or sum(len(p.front) for p in result.phases.values())
            self._event(study_id, "front", f"{front} points on the front")
            self._finish(study_id, StudyStatus.SUCCEEDED)

    # -- re-verification -----------------------------------------------------------------------------------------
    def reverifying(self, study_id: int) -> bool:
        with self._lock:
            return study_id in self._reverifying

    def reverify(self, session: Session, record: StudyRecord, body: ReverifyCreate) -> threading.Thread:
        """Start `topotune reverify` of a finished study in a thread (its runs take a real trial's time each);
        the report lands on the study (GET /v1/studies/{id}/reverify) and in its events."""
        if record.status.active:
            raise FieldError(("path", "study_id"), f"the study is {record.status.value}: re-verify it once it has "
                             "finished", status_code=409, kind="conflict")
        if body.emulate_vllm and record.backend != "simulated":
            raise FieldError(("body", "emulate_vllm"), "only a simulated study emulates a vLLM version; a real "
                             "one re-runs on the vLLM the hosts run")
        backend = record.tune_request.backend
        request = ReverifyRequest(study=record.campaign, budget=body.budget, repeats=body.repeats, reopen=body.reopen,
                                  noise_floor=body.noise_floor, alpha=body.alpha, emulate_vllm=body.emulate_vllm,
                                  noise=backend.noise if isinstance(backend, SimulatedConfig) else 0.0)
        try:  # another process (a CLI, a service before its restart) may hold the study: a dead one's claim is
            elsewhere = reverify_state(self.settings.database_url, record.campaign).running  # failed here
        except TopotuneError:
            elsewhere = False
        with self._lock:
            if record.id in self._reverifying or elsewhere:
                raise FieldError(("path", "study_id"), "a re-verification of this study is already running",
                                 status_code=409, kind="conflict")
            self._reverifying.add(record.id)
            self.reverify_errors.pop(record.id, None)
        session.add(EventRecord(study_id=record.id, kind="reverify", message=f"re-verification started "
                                f"({body.reason}): {body.budget} configs x {body.repeats} runs"))
        session.commit()
        thread = threading.Thread(target=self._reverify_run, name=f"topotune-reverify-{record.id}", daemon=True,
                                  args=(record.id, request))
        thread.start()
        return thread

    def _reverify_run(self, study_id: int, request: ReverifyRequest) -> None:
        try:
            report = reverify(request, self.settings, executor=self.settings.executor,
                              max_parallel=self.settings.max_parallel_trials)
            counts = ", ".join(f"{n} {v}" for v, n in report.counts().items() if n)
            self._event(study_id, "reverified", f"on {report.to_version}: {counts}; "
                                                f"{len(report.enqueued)} neighbours enqueued")
        except Exception as exc:  # a failed re-verification is the study's event, never the service's crash
            message = exc.user_message() if isinstance(exc, TopotuneError) else f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, TopotuneError):
                log.exception("re-verification of study %s failed", study_id)
            self.reverify_errors[study_id] = message
            self._event(study_id, "reverify_failed", message)
        finally:
            with self._lock:
                self._reverifying.discard(study_id)
