"""`topotune serve` comes from the service's entry-point plug-in: the tuner CLI never imports api/ itself."""

from __future__ import annotations

import ast

import pytest
from _support.paths import REPO

from tuner.cli import main


def test_topotune_serve_is_registered(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--help"]) == 0
    assert "Optuna dashboard" in capsys.readouterr().out


def test_tuner_never_imports_api() -> None:
    for path in (REPO / "tuner").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n == "api" or n.startswith("api.") for n in names), path
