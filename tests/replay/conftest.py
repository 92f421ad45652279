"""A dense model on H200 for the replay tests (the repo's example copy, else the shared original), and a small
KV cache with a chunked, prefix-sharing mix for the tests that need preemption."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.hardware import GpuSpec, get_gpu
from tuner.models import ModelSpec, load_model
from tuner.perf import RooflineModel
from tuner.workload import Workload

SHARED = Path("/work/shared/models")


@pytest.fixture(scope="session")
def dense(models_dir: Path) -> ModelSpec:
    local = models_dir / "llama-3.1-70b"
    return load_model(local if local.exists() else SHARED / "llama-3.1-70b")


@pytest.fixture(scope="session")
def h200() -> GpuSpec:
    return get_gpu("h200")


@pytest.fixture(scope="session")
def small_kv(dense: ModelSpec, h200: GpuSpec) -> RooflineModel:
    """The dense model with a KV cache of ~16,000 tokens at TP8: 150 requests of the mix below preempt."""
    per_token = 2 * 80 * 8 * 128 * 2 / 8
    return RooflineModel(dense, h200, kv_cache_memory_bytes=int(per_token * 16_000))


@pytest.fixture(scope="session")
def chunked_mix() -> Workload:
    """Lognormal prompts up to 6,000 tokens (chunked prefill) sharing four 1,024-token prefixes."""
    return Workload.model_validate({
        "input_tokens": {"distribution": "lognormal", "mean": 2000, "stddev": 1500, "max_tokens": 6000},
        "output_tokens": {"distribution": "lognormal", "mean": 300, "stddev": 200, "max_tokens": 1000},
        "prefix": {"shared_tokens": 1024, "num_prefixes": 4}})
