"""`tune --backend vllm` runs the doctor first: a broken prerequisite stops the campaign before any trial."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _support.paths import SPACES

from tuner.cli import main

CPU_SPACE = str(SPACES / "cpu-tiny.yaml")


def test_tune_vllm_stops_on_a_failed_preflight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """No CPU venvs (an empty TOPOTUNE_ENVS_DIR) and no model: exit 2 with the doctor's verdicts, no study."""
    monkeypatch.setenv("TOPOTUNE_ENVS_DIR", str(tmp_path / "no-envs"))
    db = tmp_path / "studies.db"
    code = main(["tune", str(tmp_path / "no-model"), "--space", CPU_SPACE, "--backend", "vllm", "--executor",
                 "local", "--storage", f"sqlite:///{db}", "--json"])
    assert code == 2
    report = json.loads(capsys.readouterr().out)["doctor"]
    failed = {c["check"] for c in report["checks"] if c["status"] == "fail"}
    assert {"model", "vllm", "aiperf", "vllm-router"} <= failed
    assert main(["studies", "--storage", f"sqlite:///{db}", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []  # nothing was started
