"""How a caller stops a running campaign, and how another process asks it to.

StopSignal is handed to Campaign: cancel() ends the study (in-flight trials are cancelled and never run again);
interrupt() stops only this driver (a service shutting down, Ctrl-C): in-flight trials are failed as "driver
stopped" and enqueued again, so the next driver of the same study runs them. The driver checks the signal at
least every STOP_POLL_S and cancels the executor's running trials at once, so either ends within seconds.

request_cancel() is for a process that does not hold the signal (another API replica): it flags the phase
studies and their driver cancels at its next check.
"""

from __future__ import annotations

import enum
import threading

import optuna

from tuner.space import ALL_PHASES
from tuner.study._storage import open_storage
from tuner.study._trial_record import StudyFlag, study_flag

STOP_POLL_S = 1.0


class StopReason(enum.StrEnum):
    CANCEL = "cancel"
    INTERRUPT = "interrupt"


class StopSignal:
    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason: StopReason | None = None

    def cancel(self) -> None:
        self._stop(StopReason.CANCEL)

    def interrupt(self) -> None:
        self._stop(StopReason.INTERRUPT)

    def _stop(self, reason: StopReason) -> None:
        if self.reason is None:  # the first reason wins: a cancelled study stays cancelled through a shutdown
            self.reason = reason
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    @property
    def cancelled(self) -> bool:
        return self.reason is StopReason.CANCEL

    def wait(self, timeout_s: float) -> bool:
        return self._event.wait(timeout_s)


def request_cancel(storage_url: str, campaign: str) -> int:
    """Flag every phase study of `campaign` as cancelled; returns how many were flagged."""
    storage = open_storage(storage_url)
    flagged = 0
    for phase in ALL_PHASES:
        try:
            study_id = storage.get_study_id_from_name(f"{campaign}/{phase}")
        except KeyError:
            continue
        storage.set_study_user_attr(study_id, StudyFlag.CANCEL_REQUESTED.value, True)
        flagged += 1
    return flagged


def cancel_requested(study: optuna.Study) -> bool:
    return study_flag(study, StudyFlag.CANCEL_REQUESTED)
