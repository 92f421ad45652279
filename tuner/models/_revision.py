"""A model's revision: a short fingerprint of its checkpoint, so a study knows when the weights changed.

Hashing hundreds of GiB of weights per trial is not an option: the fingerprint covers config.json's bytes and each
weight file's name, size and modification time (a re-downloaded or re-quantized checkpoint changes at least one of
them). Stored on every trial (tuner.study), compared by the service's watcher to decide a re-verification.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
UNKNOWN_REVISION = "unknown"


def model_revision(path: str | Path) -> str:
    """12 hex characters; "unknown" when the path is unreadable (a trial never fails on its fingerprint)."""
    p = Path(path).expanduser()
    folder = p if p.is_dir() else p.parent
    config = folder / "config.json" if p.is_dir() else p
    digest = hashlib.sha256()
    try:
        digest.update(config.read_bytes())
        for f in sorted(folder.iterdir()):
            if f.suffix in WEIGHT_SUFFIXES or f.name.endswith(".safetensors.index.json"):
                st = f.stat()
                digest.update(f"{f.name}|{st.st_size}|{st.st_mtime_ns}".encode())
    except OSError:
        return UNKNOWN_REVISION
    return digest.hexdigest()[:12]
