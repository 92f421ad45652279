"""The watchdog of a local Ray head: when the process that started it dies (kill -9 included), everything that
process started dies within a second or two.

Ray's head, its agents and workers are fate-shared with the driver only loosely: after a kill -9 of the service
its dashboard and runtime-env agents (re-parented to PID 1) lived on for minutes. This watchdog runs in its own
session, remembers the driver's descendants (pid and start time, so a reused pid is never touched), and when the
driver is gone freezes them (SIGSTOP, so none spawns more), collects the children of the frozen ones until
nothing new appears, then kills them all. Linux only (/proc); elsewhere it is not started.

Run as: python -m tuner.executors._reaper DRIVER_PID
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

POLL_S = 0.5


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), int(fields[19])


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            out.setdefault(st[0], []).append(int(entry))
    return out


def descendants(root: int) -> dict[int, int]:
    """pid -> start time of every live descendant of `root`."""
    tree, found, todo = _children(), {}, [root]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found and (st := _stat(child)) is not None:
                found[child] = st[1]
                todo.append(child)
    return found


def _signal(pids: dict[int, int], sig: int) -> None:
    for pid, started in pids.items():
        st = _stat(pid)
        if st is not None and st[1] == started:  # the same process, not a reused pid
            with contextlib.suppress(OSError):
                os.kill(pid, sig)


def reap(known: dict[int, int]) -> int:
    """Freeze, close over children, kill. Returns how many processes were killed."""
    victims = dict(known)
    for _ in range(20):
        _signal(victims, signal.SIGSTOP)
        grown = dict(victims)
        for pid in list(victims):
            grown.update(descendants(pid))
        grown.pop(os.getpid(), None)
        if grown.keys() == victims.keys():
            break
        victims = grown
    _signal(victims, signal.SIGKILL)
    _signal(victims, signal.SIGCONT)  # a stopped process handles the pending SIGKILL when continued
    return len(victims)


def watch(driver: int) -> None:
    known: dict[int, int] = {}
    while True:
        st = _stat(driver)
        if st is None or st[0] == 0:
            break
        known.update(descendants(driver))
        known = {pid: t for pid, t in known.items()
                 if pid != os.getpid() and (s := _stat(pid)) is not None and s[1] == t}
        time.sleep(POLL_S)
    reap(known)


if __name__ == "__main__":
    watch(int(sys.argv[1]))
