"""Model specs for the performance-model tests (the repo's example copies, else the shared originals)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.hardware import GpuSpec, get_gpu
from tuner.models import ModelSpec, load_model

SHARED = Path("/work/shared/models")


def model_dir(models_dir: Path, name: str) -> Path:
    local = models_dir / name
    return local if local.exists() else SHARED / name


@pytest.fixture(scope="session")
def reference(models_dir: Path) -> ModelSpec:
    return load_model(model_dir(models_dir, "qwen3.8-2.4t-a95b-nvfp4"))


@pytest.fixture(scope="session")
def dense(models_dir: Path) -> ModelSpec:
    return load_model(model_dir(models_dir, "llama-3.1-70b"))


@pytest.fixture(scope="session")
def gb300() -> GpuSpec:
    return get_gpu("gb300")
