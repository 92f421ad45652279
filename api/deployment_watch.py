"""Deployment watches in the service: every period, scrape the deployment's servers, hand the window since the last
scrape to tuner.live.tick, and store what it decided (and its advice) as the watch's history.

One thread for every watch (a period is minutes; a check is two HTTP GETs and, when the traffic moved, one
frontier run of about a second). The last scrape of each watch lives in memory: after a restart the first period
only re-primes it. Nothing is ever applied: the advice and its commands are shown, the operator decides.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from api.background import BackgroundLoop
from api.models import WatchEventRecord, WatchRecord
from tuner.errors import TopotuneError
from tuner.live import (
    Thresholds,
    WatchAdviceRequest,
    WatchTarget,
    WatchTick,
    state_from_json,
    state_json,
    tick,
)
from tuner.workload import MetricsError, VllmCounters, metrics_url, scrape, sum_counters

log = logging.getLogger("topotune.api.watches")
POLL_S = 1.0  # how often due watches are looked for
MAX_EVENTS = 2000  # history kept per watch (oldest dropped)


@dataclass(frozen=True)
class _Scrape:
    at: float  # time.monotonic()
    counters: dict[str, VllmCounters]


def target_of(record: WatchRecord) -> WatchTarget:
    return WatchTarget(
        deployment=record.deployment, serve_flags=record.serve_flags,
        advice=WatchAdviceRequest(model_path=record.model_path, hardware=record.hardware, max_gpus=record.max_gpus,
                             max_ttft_ms=record.max_ttft_ms, max_itl_ms=record.max_itl_ms,
                             percentile=record.percentile),
        thresholds=Thresholds(**record.thresholds))


class DeploymentWatcher(BackgroundLoop):
    thread_name = "topotune-deployment-watch"
    join_s = 30.0

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        super().__init__()
        self.sessions = sessions
        self._last: dict[int, _Scrape] = {}
        self._locks: dict[int, threading.Lock] = {}
        self._guard = threading.Lock()
        self.clock = time.monotonic  # the windows' clock (a test may set its own)

    def forget(self, watch_id: int) -> None:
        """The watch changed what it watches (URLs, deployment) or was deleted: start from a fresh scrape."""
        with self._guard:
            self._last.pop(watch_id, None)

    def _lock(self, watch_id: int) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(watch_id, threading.Lock())

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                for watch_id in self._due():
                    if self._stop.is_set():
                        return
                    self.check(watch_id)
            except Exception:  # the loop outlives any one bad period (each is recorded by check)
                log.exception("deployment watch loop")

    def _due(self) -> list[int]:
        now = datetime.now(UTC)
        with self.sessions() as s:
            rows = s.execute(select(WatchRecord.id, WatchRecord.period_s, WatchRecord.last_checked_at)
                             .where(WatchRecord.enabled.is_(True))).all()
        due = []
        for watch_id, period_s, last in rows:
            if last is not None and last.tzinfo is None:  # SQLite hands back naive datetimes
                last = last.replace(tzinfo=UTC)
            if last is None or (now - last).total_seconds() >= period_s:
                due.append(watch_id)
        return due

    def check(self, watch_id: int) -> WatchEventRecord | None:
        """One period of one watch now: scrape, decide, store. None when the watch is gone."""
        with self._lock(watch_id), self.sessions() as s:
            record = s.get(WatchRecord, watch_id)
            if record is None:
                self.forget(watch_id)
                return None
            event = self._period(record)
            record.last_checked_at = datetime.now(UTC)
            record.last_error = event.message if event.kind == "error" else None
            s.add(event)
            s.flush()
            self._trim(s, watch_id)
            s.commit()
            s.refresh(event)
            s.expunge(event)
            return event

    def _period(self, record: WatchRecord) -> WatchEventRecord:
        urls = [metrics_url(u) for u in record.urls.get("urls", [])]
        try:
            now = _Scrape(self.clock(), {u: scrape(u) for u in urls})
        except TopotuneError as exc:
            return WatchEventRecord(watch_id=record.id, kind="error", message=exc.user_message())
        before = self._last.get(record.id)
        self._last[record.id] = now
        if before is None or set(before.counters) != set(now.counters):
            return WatchEventRecord(watch_id=record.id, kind="primed",
                                    message="first scrape: the first window ends one period from now")
        try:
            increases = [(u, now.counters[u].minus(before.counters[u], source=u)) for u in urls]
        except MetricsError as exc:  # a server restarted: this scrape starts the next window
            return WatchEventRecord(watch_id=record.id, kind="error", message=exc.user_message())
        window_s = now.at - before.at
        result: WatchTick = tick(target_of(record), state_from_json(record.state), sum_counters(increases), window_s,
                                 tuple(urls))
        record.state = state_json(result.state)
        return WatchEventRecord(watch_id=record.id, kind=result.kind, window_s=window_s, detail=result.as_json(),
                                message=result.message)

    @staticmethod
    def _trim(s: Session, watch_id: int) -> None:
        ids = s.scalars(select(WatchEventRecord.id).where(WatchEventRecord.watch_id == watch_id)
                        .order_by(WatchEventRecord.id.desc()).offset(MAX_EVENTS)).all()
        for old in ids:
            s.delete(s.get(WatchEventRecord, old))
