"""#46: a space in another folder naming its trace relatively tunes, shows and exports from any directory; paths
are resolved against the file that names them and stored absolute; a moved file is a clear error naming it,
before any trial runs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from _support.paths import REFERENCE_MODEL, REFERENCE_SPACE, REPO

from tuner.cli import main


def _layout(root: Path) -> Path:
    """root/spaces/space.yaml naming ../traces/chat.jsonl; the model under root/models."""
    (root / "traces").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "traces" / "chat-multiturn.jsonl", root / "traces" / "chat.jsonl")
    shutil.copytree(REFERENCE_MODEL, root / "models" / "m")
    space = yaml.safe_load(REFERENCE_SPACE.read_text())
    space["workload"] = {"trace": "../traces/chat.jsonl"}
    space["phases"]["prefill"].pop("workload")
    space["phases"] = {"prefill": space["phases"]["prefill"]}
    (root / "spaces").mkdir()
    (root / "spaces" / "space.yaml").write_text(yaml.safe_dump(space))
    for sub in ("elsewhere", "another"):
        (root / sub).mkdir()
    return root / "spaces" / "space.yaml"


def test_a_relative_trace_tunes_shows_and_exports_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    _layout(tmp_path)
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    monkeypatch.chdir(tmp_path / "elsewhere")  # neither the space's folder nor the trace's
    assert main(["tune", "../models/m", "--space", "../spaces/space.yaml", "--trials", "2", "--sampler", "random",
                 "--executor", "local", "--storage", storage, "--max-ttft-ms", "0", "--json"]) == 0
    name = json.loads(capsys.readouterr().out)["name"]
    monkeypatch.chdir(tmp_path / "another")
    assert main(["show", name, "--storage", storage, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["phases"]["prefill"]["front"]
    assert main(["export", name, "--storage", storage, "--format", "vllm"]) == 0
    script = capsys.readouterr().out
    assert f"serve {tmp_path / 'models' / 'm'} " in script  # stored absolute: the weights from any directory
    assert "--enable-prefix-caching" in script

    assert main(["reverify", name, "--storage", storage, "--budget", "1", "--repeats", "1", "--no-reopen",
                 "--json"]) == 0  # re-measures with the stored model and trace, from here too
    assert json.loads(capsys.readouterr().out)["rows"]

    os.rename(tmp_path / "traces" / "chat.jsonl", tmp_path / "traces" / "moved.jsonl")
    assert main(["export", name, "--storage", storage]) == 2  # a moved trace is named, not a traceback
    assert str(tmp_path / "traces" / "chat.jsonl") in capsys.readouterr().err
    launched = _launched(storage, capsys)
    assert main(["tune", "../models/m", "--space", "../spaces/space.yaml", "--trials", "4", "--storage", storage,
                 "--executor", "local", "--max-ttft-ms", "0"]) == 2
    assert "chat.jsonl" in capsys.readouterr().err
    assert _launched(storage, capsys) == launched  # refused before any trial ran


def _launched(storage: str, capsys: pytest.CaptureFixture[str]) -> int:
    capsys.readouterr()
    assert main(["studies", "--storage", storage, "--json"]) == 0
    return sum(r["launched"] for r in json.loads(capsys.readouterr().out))
