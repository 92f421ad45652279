"""Real vLLM-on-CPU fixtures: one tiny model per session (made in ~4 s, reused by every slow test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _support.cpu_vllm import MISSING, make_tiny_model


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dense tiny model (generated, never committed)."""
    if MISSING:
        pytest.skip(f"CPU vLLM venvs missing ({', '.join(MISSING)})")
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MoE tiny model (4 experts, top-2), for the expert-parallel trial."""
    if MISSING:
        pytest.skip(f"CPU vLLM venvs missing ({', '.join(MISSING)})")
    return make_tiny_model(tmp_path_factory.mktemp("tiny-moe") / "model", moe=True)
