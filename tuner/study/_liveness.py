"""A driver's claim on its trials: who runs each RUNNING trial, its heartbeat, and reclaiming a dead driver's.

Why not Optuna's RDB heartbeat (`heartbeat_interval`, `fail_stale_trials`, `RetryFailedTrialCallback`):
(1) its heartbeat thread is started by `Study.optimize` only; `Study.ask` warns that it is not supported;
(2) it detects a dead process by time alone, while a driver killed on this host is known dead at once
from its pid (a restarted `topotune tune` resumes immediately instead of after a grace period);
(3) its retry copies every user attribute of the dead trial (outcome, driver, heartbeat) into the retry;
(4) it is a setting of the storage, which the service shares across campaigns with other timeouts.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable

import optuna
from optuna.trial import TrialState

from tuner.launch import process_alive
from tuner.space import Phase
from tuner.study._events import ProgressCallback, TrialEvent, trial_label
from tuner.study._optuna_compat import fail_stored_trial
from tuner.study._trial_record import EventKind, TrialAttrs, TrialKind, TrialOutcome, TrialRecord

DRIVER_ID = f"{socket.gethostname()}:{os.getpid()}"


def claim(trial: optuna.Trial) -> None:
    """Written right after `study.ask`: a driver killed before launch leaves a trial reclaim can attribute."""
    TrialAttrs(driver=DRIVER_ID, heartbeat_at=time.time()).write(trial)


def beat(trials: Iterable[optuna.Trial]) -> None:
    for trial in trials:
        TrialAttrs(heartbeat_at=time.time()).write(trial)


def reclaim_stale(study: optuna.Study, *, phase: Phase, started_at: float, stale_after_s: float,
                  on_event: ProgressCallback) -> int:
    """Fail RUNNING trials whose driver is gone and enqueue their params again; returns how many."""
    reclaimed = 0
    now = time.time()
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        record = TrialRecord.read(t)
        driver = record.attrs.driver or ""
        host, _, pid = driver.rpartition(":")
        dead_here = host == socket.gethostname() and pid.isdigit() and not process_alive(int(pid))
        # A driver claims its trial in the write right after `study.ask`; one killed between the two leaves an
        # unclaimed trial (often with only some params set). Asked before this driver started, it is an orphan.
        orphan = not driver and (record.started_at or 0.0) < started_at
        if not (dead_here or orphan or now - record.last_beat() > stale_after_s) \
                or driver == DRIVER_ID:
            continue
        TrialAttrs(reason=f"driver {driver or '(unclaimed)'} stopped mid-trial", outcome=TrialOutcome.RECLAIMED
                   ).write_stored(study, t)
        fail_stored_trial(study, t)
        if record.kind is TrialKind.SAMPLED or (record.kind is None and not orphan):
            # launched, or asked and not yet screened (an orphan's params may be partial: not re-enqueued)
            study.enqueue_trial(record.params, user_attrs=TrialAttrs(retry_of=t.number).user_attrs())
        reclaimed += 1
        on_event(TrialEvent(phase, t.number, EventKind.RECLAIMED, trial_label(t.params), f"from {driver}"))
    return reclaimed
