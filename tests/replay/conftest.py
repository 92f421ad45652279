"""A dense model on H200 for the replay tests (the repo's example copy, else the shared original)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.hardware import GpuSpec, get_gpu
from tuner.models import ModelSpec, load_model

SHARED = Path("/work/shared/models")


@pytest.fixture(scope="session")
def dense(models_dir: Path) -> ModelSpec:
    local = models_dir / "llama-3.1-70b"
    return load_model(local if local.exists() else SHARED / "llama-3.1-70b")


@pytest.fixture(scope="session")
def h200() -> GpuSpec:
    return get_gpu("h200")
