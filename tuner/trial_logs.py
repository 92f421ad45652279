"""A trial's log files (in its artifacts folder) in reading order, and a bounded tail of one: `topotune logs` and
the service's live page read logs the same way."""

from __future__ import annotations

import os
from pathlib import Path

# What a trial folder holds: the runner's output first, the executor's record, then the backend's logs.
TRIAL_LOG = "trial.log"  # the runner's own lines (start, end, outcome) and, under Ray, the trial's stdout/stderr
FIRST_FILES = (TRIAL_LOG, "executor.json")
LOG_SUFFIXES = (".log", ".txt", ".out", ".err")


def trial_log_files(folder: Path) -> list[Path]:
    """The trial's log files in reading order: runner output, executor record, then backend logs by name."""
    first = [folder / name for name in FIRST_FILES if (folder / name).is_file()]
    rest = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in LOG_SUFFIXES and p not in first)
    return first + rest


def tail_text(path: Path, max_bytes: int) -> str:
    """The last `max_bytes` of a file as text, starting at a line boundary; reads no more than that (a vLLM log
    of a long trial is large and the live page asks every few seconds)."""
    with path.open("rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - max_bytes))
        data = fh.read(max_bytes)
    if size > max_bytes:
        data = data.split(b"\n", 1)[-1]
    return data.decode("utf-8", "replace")
