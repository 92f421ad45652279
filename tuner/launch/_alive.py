"""Is a process alive? A zombie (exited, not yet reaped by its parent) is dead: it holds no GPU and serves nothing."""

from __future__ import annotations

import os
from pathlib import Path

_PROC = Path("/proc")


def process_alive(pid: int) -> bool:
    """True while `pid` runs. Linux reads /proc/<pid>/stat (so zombies count as dead); elsewhere a signal 0 probe
    (a process of another user counts as alive)."""
    if _PROC.is_dir():
        try:
            state = (_PROC / str(pid) / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            return False
        return state != b"Z"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def alive_pids(pids: list[int]) -> list[int]:
    """The pids that still run (zombies count as dead)."""
    return [pid for pid in pids if process_alive(pid)]
