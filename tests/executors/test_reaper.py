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
