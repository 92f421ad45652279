"""Faults on a real multi-node Ray cluster, through a real Campaign (simulated backend with a delay):
kill -9 of trial workers in a loop, and a driver killed mid-study and started again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _support.executors import GPUS_PER_HOST, TOTAL_GPUS, free_gpus_eventually
from _support.paths import REFERENCE_MODEL, REFERENCE_SPACE

from tuner.testing import alive_pids, campaign_under_kills, spawned_children, study_counts

GRACE_S = 15.0


@pytest.mark.slow
def test_kill_9_loop_no_trial_stuck_no_process_left_study_completes(ray_cluster, tmp_path: Path) -> None:
    run = campaign_under_kills(model_path=REFERENCE_MODEL, space_path=REFERENCE_SPACE, work=tmp_path, trials=8,
                               kills=10, grace_s=GRACE_S, num_gpus=TOTAL_GPUS, gpus_per_host=GPUS_PER_HOST)
    report = run.report
    assert report.kills >= 5 and report.stuck == 0 and report.max_recovery_s < GRACE_S
    assert run.counts.get("running", 0) == 0
    assert run.launched == 8  # every launched trial told (OK or crashed after its retries)
    assert not alive_pids(spawned_children(run.records))
    assert free_gpus_eventually(TOTAL_GPUS) == TOTAL_GPUS


def _driver(args: list[str], address: str) -> subprocess.Popen:
    env = {**os.environ, "RAY_ADDRESS": address}
    return subprocess.Popen([sys.executable, "-m", "tuner.testing.driver", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_driver_killed_mid_study_and_restarted_loses_no_trial(ray_cluster, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    records = tmp_path / "records"
    trials = 6
    args = [str(REFERENCE_MODEL), str(REFERENCE_SPACE), storage, str(tmp_path / "art"), str(records), str(trials),
            "2.0"]
    first = _driver(args, ray_cluster.address)
    deadline = time.monotonic() + 120
    try:
        while True:  # kill it once it has finished some trials and has others in flight
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first driver made no progress"
            try:
                counts = study_counts(storage, _find_study(storage))
            except Exception:  # the study does not exist yet
                counts = {}
            if counts.get("complete", 0) >= 2 and counts.get("running", 0) >= 1:
                break
            time.sleep(0.3)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    name = _find_study(storage)
    before = study_counts(storage, name)
    assert before.get("running", 0) >= 1
    assert free_gpus_eventually(TOTAL_GPUS, timeout_s=30) == TOTAL_GPUS  # Ray freed the dead driver's groups
    second = _driver(args, ray_cluster.address)
    _, err = second.communicate(timeout=300)
    assert second.returncode == 0, err[-2000:]
    after = study_counts(storage, name)
    assert after.get("running", 0) == 0
    assert after.get("complete", 0) == trials  # final launched count == budget
    assert after.get("fail_reclaimed", 0) == before["running"]  # the in-flight ones were reclaimed and re-run
    assert not alive_pids(spawned_children(records))


def _find_study(storage_url: str) -> str:
    import optuna

    from tuner.study import open_storage

    names = [s.study_name for s in optuna.get_all_study_summaries(open_storage(storage_url),
                                                                   include_best_trial=False)]
    [name] = [n for n in names if n.endswith("/decode")]
    return name
