"""The import arrows docs/architecture.md promises, read from the source (no import side effects).

A lower layer never imports a higher one: launch sits below the backends and the executors (both start
processes through it), and an executor never knows which backend it runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from _support.paths import REPO

TUNER = REPO / "tuner"


def _imports(path: Path) -> set[str]:
    """Every absolute module a file imports, at module level or inside a function (lazy imports count too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    files = sorted((TUNER / package).rglob("*.py")) if (TUNER / package).is_dir() else [TUNER / f"{package}.py"]
    assert files, f"no source under tuner/{package}"
    return [f"{path.relative_to(REPO)} imports {name}" for path in files for name in sorted(_imports(path))
            if any(name == f or name.startswith(f + ".") for f in forbidden)]


@pytest.mark.parametrize(("package", "forbidden"), [
    # launch: below both of its users, so the process launcher and its types never pull in a backend
    ("launch", ("tuner.backends", "tuner.executors", "tuner.study", "tuner.doctor", "tuner.export", "api")),
    # executors serve ExecutorNeeds and the deployment's placement rules, never one backend's internals
    ("executors", ("tuner.backends.vllm", "tuner.backends._simulated", "tuner.study", "api")),
    # the shared vocabulary the two seams moved into stays at the bottom
    ("deployment", ("tuner.backends", "tuner.executors", "tuner.launch", "tuner.study", "api")),
    ("trial_status", ("tuner",)),
    # the router policy: the replay simulates it and the operating point deploys it, so it sits below both
    ("router", ("tuner.replay", "tuner.operating_point", "tuner.backends", "tuner.advise", "tuner.export",
                "tuner.cli", "api")),
    # what a cluster teaches sits below the studies that read and feed it
    ("cluster", ("tuner.study", "tuner.cli", "tuner.executors", "tuner.launch", "api")),
    # a running deployment's check and watch read the models and the use-case layer's advise(), never the studies,
    # the CLI or the service
    ("live", ("tuner.study", "tuner.executors", "tuner.launch", "tuner.cli", "api")),
    # the use-case layer is what the CLI and the service call: it never reads them
    ("advise", ("tuner.cli", "api")),
    # the replay sits on the models, memory, perf and workload layers, below the use cases that call it
    ("replay", ("tuner.study", "tuner.cli", "tuner.backends", "tuner.executors", "tuner.launch", "api")),
])
def test_lower_layer_never_imports_a_higher_one(package: str, forbidden: tuple[str, ...]) -> None:
    assert _violations(package, forbidden) == []


def test_tuner_never_imports_api() -> None:
    assert _violations("", ("api",)) == []


def test_moved_types_keep_their_public_names() -> None:
    """Users import these from tuner.backends (and check_host_split from tuner.backends.vllm): still the same."""
    from tuner import deployment, trial_status
    from tuner.backends import HostAssignment, TrialStatus
    from tuner.backends.vllm import check_host_split

    assert TrialStatus is trial_status.TrialStatus
    assert HostAssignment is deployment.HostAssignment
    assert check_host_split is deployment.check_host_split
