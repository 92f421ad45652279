"""A path made into what a user may name by mistake, for the tests of every reader of a user's file (tuner/files.py
refuses all but a regular file under its size bound)."""

from __future__ import annotations

import os
from pathlib import Path


def hostile_path(path: Path, kind: str, content: str | bytes = "") -> Path:
    """`path` as a FIFO ("fifo": a plain read blocks for ever), a directory ("directory"), else a regular file
    holding `content`."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path
