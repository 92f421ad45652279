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

from tuner.executors import RUNNER_PID, BackendSpec
from tuner.testing._campaign import small_campaign, study_counts
from tuner.testing._probe import probe_spec

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


@dataclass
class KilledCampaign:
    """What a campaign run under kill_runners left: the kills, its decode phase's launched trials by state."""

    report: KillReport
    launched: int  # the decode phase's launched trials, told (OK, or crashed after their retries)
    counts: dict[str, int]  # study_counts of the decode phase
    records: Path  # the ProbeBackend's records (spawned_children reads the processes its trials started)
    artifacts: Path


def campaign_under_kills(*, model_path: str | Path, space_path: str | Path, work: Path, trials: int, kills: int,
                         grace_s: float, num_gpus: int, gpus_per_host: int) -> KilledCampaign:
    """A small campaign (decode phase; ProbeBackend over the simulated backend, 2 s a trial, each starting a child
    process in its own session) on a RayExecutor of the current Ray session (3 in flight, 2 retries), while
    kill_runners kills a trial's runner every 0.7 s, `kills` times. Its files go under `work`."""
    from tuner.executors import RayExecutor

    work.mkdir(parents=True, exist_ok=True)
    records, artifacts = work / "records", work / "art"
    spec = probe_spec(records, delay_s=2.0, spawn=True, inner=BackendSpec("simulated"))
    executor = RayExecutor(spec, gpus_per_host=gpus_per_host, max_parallel=3, max_retries=2)
    storage = f"sqlite:///{work / 'study.db'}"
    campaign = small_campaign(model_path=model_path, space_path=space_path, executor=executor, storage_url=storage,
                              artifacts_dir=artifacts, trials=trials, num_gpus=num_gpus, gpus_per_host=gpus_per_host)
    stop, reports = threading.Event(), []
    killer = threading.Thread(target=lambda: reports.append(
        kill_runners(executor, kills=kills, interval_s=0.7, grace_s=grace_s, stop=stop)))
    killer.start()
    try:
        result = campaign.run()
    finally:
        stop.set()
        killer.join(timeout=60)
        executor.shutdown()
    [report] = reports
    return KilledCampaign(report, result.phases["decode"].launched,
                          study_counts(storage, campaign.phase_study_name("decode")), records, artifacts)
