"""The local Ray head's watchdog: kill -9 of the driver takes everything it started with it (real processes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _support.paths import REPO

from tuner.executors._reaper import descendants

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the watchdog reads /proc")

DRIVER = textwrap.dedent("""
    import os, subprocess, sys, time
    # what a Ray head looks like from here: a child, a grandchild in its own session (an agent that would be
    # re-parented to PID 1), and the watchdog
    child = subprocess.Popen([sys.executable, "-c",
        "import subprocess, sys, time; subprocess.Popen(['sleep', '300'], start_new_session=True); time.sleep(300)"])
    subprocess.Popen(["sleep", "300"])
    subprocess.Popen([sys.executable, "-m", "tuner.executors._reaper", str(os.getpid())], start_new_session=True)
    print("ready", flush=True)
    time.sleep(300)
""")


def _alive(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return text[text.rindex(")") + 2] != "Z"


def test_kill_9_of_the_driver_takes_its_processes_along() -> None:
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    assert driver.stdout is not None and driver.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(descendants(driver.pid)) < 4:
        time.sleep(0.1)
    started = descendants(driver.pid)
    assert len(started) >= 4, started  # the child, its sleep, a sleep, the watchdog
    time.sleep(1.0)  # the watchdog has seen them all
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in started):
        time.sleep(0.2)
    left = [p for p in started if _alive(p)]
    assert not left, f"still running 10 s after the driver died: {left}"


ORPHANING_DRIVER = textwrap.dedent("""
    import os, subprocess, sys, time
    # what a driver killed while ray.init starts the head leaves: a head process (tagged, as _session starts the
    # head) already re-parented to PID 1 (its parent exited) before the watchdog's first look at the tree
    tagged = {**os.environ, "TOPOTUNE_RAY_HEAD_TAG": "t0k3n"}
    subprocess.run([sys.executable, "-c", "import subprocess; "
                    "print(subprocess.Popen(['sleep', '300'], start_new_session=True).pid)"], env=tagged, check=True)
    subprocess.Popen([sys.executable, "-m", "tuner.executors._reaper", str(os.getpid()), "t0k3n"],
                     start_new_session=True)
    print("ready", flush=True)
    time.sleep(300)
""")


def test_a_head_process_that_left_the_drivers_tree_is_reaped_by_its_tag() -> None:
    """benchmarks/fault_injection.py --service left 1-2 processes after a kill -9: processes of a head started
    with no watchdog yet, or gone out of the driver's tree before a poll saw them. The head's processes carry
    the watchdog's token in their environment, and it reaps them by it."""
    driver = subprocess.Popen([sys.executable, "-c", ORPHANING_DRIVER], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    assert driver.stdout is not None
    orphan = int(driver.stdout.readline())
    assert driver.stdout.readline().strip() == "ready"
    assert _alive(orphan) and orphan not in descendants(driver.pid)  # out of the tree: no poll finds it
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(orphan):
        time.sleep(0.2)
    alive = _alive(orphan)
    if alive:
        os.kill(orphan, signal.SIGKILL)  # never leave it behind, whatever the test says
    assert not alive, "the head's orphaned process still ran 10 s after the driver died"
    from tuner.executors._reaper import HEAD_TAG_ENV

    assert HEAD_TAG_ENV == "TOPOTUNE_RAY_HEAD_TAG"  # the name the driver above tags with
