"""Fault injection: kill -9 the runners of trials in flight and time how long the executor takes to recover them."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.executors import RUNNER_PID

if TYPE_CHECKING:
    from tuner.executors import RayExecutor

@dataclass
class KillReport:
    kills: int = 0
    recovered: int = 0  # the killed trial was relaunched or finished within the grace period
    stuck: int = 0  # ... or not
    max_recovery_s: float = 0.0
    victims: list[str] = field(default_factory=list)


def kill_runners(executor: RayExecutor, *, kills: int, interval_s: float, grace_s: float,
                 stop: threading.Event | None = None) -> KillReport:
    """kill -9 the runner of a trial in flight, `kills` times, and time how long until the executor recovers it
    (an executor whose runners write RUNNER_PID in the trial folder: the RayExecutor)."""
    report = KillReport()
    rng = random.Random(0)
    while report.kills < kills and not (stop and stop.is_set()):
        time.sleep(interval_s)
        candidates = []
        for handle in executor.in_flight():
            folder = handle.request.artifacts_dir
            pid_file = Path(folder) / RUNNER_PID if folder else None
            if pid_file is not None and pid_file.exists():
                with contextlib.suppress(ValueError, OSError):
                    candidates.append((handle, int(pid_file.read_text())))
        if not candidates:
            continue
        handle, pid = rng.choice(candidates)
        attempts = handle.attempts
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed_at = time.monotonic()
        report.kills += 1
        report.victims.append(handle.request.trial_id)
        while time.monotonic() - killed_at < grace_s and handle.attempts == attempts and handle.result is None:
            time.sleep(0.05)
        if handle.attempts != attempts or handle.result is not None:
            report.recovered += 1
            report.max_recovery_s = max(report.max_recovery_s, time.monotonic() - killed_at)
        else:
            report.stuck += 1
    return report
