"""Checks that nothing a test started is left running."""

from __future__ import annotations

import glob
from pathlib import Path

from tuner.launch import alive_pids, process_alive

__all__ = ["alive_pids", "process_alive", "processes_mentioning"]


def processes_mentioning(needle: str) -> list[str]:
    """Command lines of live processes that mention `needle` (a trial folder or model path): must be none."""
    left = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            text = Path(cmdline).read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in text:
            left.append(text)
    return left
