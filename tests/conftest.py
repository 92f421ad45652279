"""Shared fixtures: model configs from ../shared (copied into tests/data when the project must own them)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from _support.paths import MODELS, REFERENCE_MODEL
from hypothesis import settings

# Property tests draw the same examples on every run (derandomized: a seed per test), so CI cannot fail on a draw
# that no earlier run made; HYPOTHESIS_PROFILE=explore draws fresh ones, to hunt for new counterexamples (one such
# run found the max-model-len case that tests/memory/test_properties.py now pins).
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--skip-slow", action="store_true", default=False,
                     help="skip real-process tests (real vLLM on CPU, multi-node Ray); CI runs them")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--skip-slow") or os.environ.get("TOPOTUNE_SKIP_SLOW") == "1":
        skip = pytest.mark.skip(reason="--skip-slow")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dense tiny model for the real vLLM-on-CPU tests (generated, never committed): one per session, shared
    by tests/backends, tests/executors and tests/replay (each generation starts torch: seconds, more on CI)."""
    from _support.cpu_vllm import MISSING, make_tiny_model

    if MISSING:
        pytest.skip(f"CPU vLLM venvs missing ({', '.join(MISSING)})")
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def tiny_moe_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MoE tiny model (4 experts, top-2), for the expert-parallel trial."""
    from _support.cpu_vllm import MISSING, make_tiny_model

    if MISSING:
        pytest.skip(f"CPU vLLM venvs missing ({', '.join(MISSING)})")
    return make_tiny_model(tmp_path_factory.mktemp("tiny-moe") / "model", moe=True)


@pytest.fixture(scope="session")
def models_dir() -> Path:
    return MODELS


@pytest.fixture(scope="session")
def reference_model_path() -> Path:
    return REFERENCE_MODEL


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another process listens on (what a server started on a port chosen beforehand can find taken)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]
