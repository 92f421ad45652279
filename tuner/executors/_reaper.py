"""The watchdog of a local Ray head: when the process that started it dies (kill -9 included), everything that
process started dies within a second or two.

Ray's head, its agents and workers are fate-shared with the driver only loosely: after a kill -9 of the service
its dashboard and runtime-env agents (re-parented to PID 1) lived on for minutes. This watchdog runs in its own
session, remembers the driver's descendants (pid and start time, so a reused pid is never touched), and when the
driver is gone freezes them (SIGSTOP, so none spawns more), collects the children of the frozen ones until
nothing new appears, then kills them all. Linux only (/proc); elsewhere it is not started.

A poll of the driver's tree misses what left it between two polls or before the first (the head's processes
when the driver dies while ray.init starts them: re-parented to PID 1, they are no one's descendants). So the
head is started with HEAD_TAG_ENV=<token> in its environment, which every process it starts inherits and
/proc/<pid>/environ keeps, and the victims are also every process carrying the token (as the host agent finds
a trial's processes, tuner.executors._host.tagged_pids).

Run as: python -m tuner.executors._reaper DRIVER_PID [TOKEN]
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

POLL_S = 0.5
HEAD_TAG_ENV = "TOPOTUNE_RAY_HEAD_TAG"


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


def pids_tagged(name: str, value: str, proc: Path = Path("/proc")) -> list[int]:
    """Processes of this user (this one aside) whose start-up environment sets `name` to `value`."""
    needle = f"{name}={value}".encode()
    me = os.getpid()
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def _tagged(token: str) -> dict[int, int]:
    return {pid: st[1] for pid in pids_tagged(HEAD_TAG_ENV, token) if (st := _stat(pid)) is not None}


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


def watch(driver: int, token: str | None = None) -> None:
    """Until `driver` is gone, then reap its known descendants and every process carrying `token`."""
    known: dict[int, int] = {}
    while True:
        st = _stat(driver)
        if st is None or st[0] == 0:
            break
        known.update(descendants(driver))
        known = {pid: t for pid, t in known.items()
                 if pid != os.getpid() and (s := _stat(pid)) is not None and s[1] == t}
        time.sleep(POLL_S)
    if token:
        known.update(_tagged(token))
    reap(known)


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
