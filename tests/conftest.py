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
    skip_slow = config.getoption("--skip-slow") or os.environ.get("TOPOTUNE_SKIP_SLOW") == "1"
    for item in items:
        if skip_slow and "slow" in item.keywords:
            item.add_marker(pytest.mark.skip(reason="--skip-slow"))
        # Serial: the 3-node cluster's raylets must register within Ray's fixed 30 s, which a second xdist worker's
        # tests beside them pushed past (14 errors in one run); with the slow tests it is also built once, not twice.
        if "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.serial)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under pytest-xdist, Ray's token (~/.ray/auth_token) is made before the workers start: a machine's first local
    Ray head writes it, and two first heads at once (one per worker) could each write their own, leaving one head's
    processes with the other's token."""
    config = session.config
    if not getattr(config.option, "numprocesses", None) or hasattr(config, "workerinput"):
        return  # one process, or a worker (the controller ran this before starting it)
    if (Path.home() / ".ray" / "auth_token").is_file():
        return  # the usual case: no need to import Ray here
    from ray._private.authentication.authentication_token_setup import generate_and_save_token
    from ray._raylet import AuthenticationTokenLoader

    if not AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
        generate_and_save_token()


@pytest.fixture(scope="session", autouse=True)
def topotune_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """topotune's data folder (trial logs, HTML reports) in this test process's own temporary folder: not the
    user's (~/.local/share/topotune), and not shared by two pytest-xdist workers tuning studies of one name."""
    folder = tmp_path_factory.mktemp("topotune-data")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TOPOTUNE_DATA_DIR", str(folder))
        yield folder


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
