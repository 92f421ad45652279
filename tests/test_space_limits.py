"""The one space loader (API body, space_path files, CLI --space) refuses what would take the process down:
alias bombs, recursive aliases, deep nesting, huge ranges and products, non-finite numbers."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from _support.paths import REFERENCE_MODEL, REFERENCE_SPACE

from tuner._yaml import MAX_YAML_NODES
from tuner.cli import main
from tuner.errors import ConfigError
from tuner.space import load_space, parse_space

SPACE_FILE = REFERENCE_SPACE


def billion_laughs(levels: int = 9, width: int = 9) -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\nname: bomb\n"


def _space_with(**phase_overrides: object) -> str:
    data = yaml.safe_load(SPACE_FILE.read_text())
    data["phases"]["decode"].update(phase_overrides)
    return yaml.safe_dump(data)


@pytest.mark.parametrize(("text", "says"), [
    (billion_laughs(), "YAML nodes"),
    (billion_laughs(levels=4, width=30), "aliases"),
    ("a: &a [*a]\nname: loop\n", "YAML nodes"),  # an alias to its own ancestor: infinite
    ("[" * 5000 + "]" * 5000, "nests deeper"),
    ("x: &x {a: 1}\n" + "\n".join(f"k{i}: *x" for i in range(200)), "aliases"),
    ("name: " + "x" * 1_000_001, "characters"),
])
def test_hostile_yaml_refused_fast(text: str, says: str) -> None:
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        parse_space(text, "space")
    assert time.monotonic() - started < 2.0
    assert says in info.value.user_message() and info.value.field == "space"


@pytest.mark.parametrize(("override", "field"), [
    ({"gpu_memory_utilization": {"low": 0.1, "high": 0.9, "step": 1e-12}}, "gpu_memory_utilization"),
    ({"max_num_seqs": list(range(1, 2000))}, "max_num_seqs"),
    ({"max_num_seqs": list(range(1, 200)), "max_num_batched_tokens": list(range(1, 200)),
      "gpu_memory_utilization": [round(0.5 + i / 1000, 3) for i in range(100)]}, "phases.decode"),
    ({"concurrency": [float("inf")]}, "concurrency"),
    ({"gpu_memory_utilization": [float("nan")]}, "gpu_memory_utilization"),
    ({"max_num_seqs": [10**30]}, "max_num_seqs"),
])
def test_unbounded_knobs_refused(override: dict, field: str) -> None:
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        parse_space(_space_with(**override), "space")
    assert time.monotonic() - started < 2.0
    assert field in info.value.field, info.value.user_message()


def test_real_space_within_bounds() -> None:
    space = load_space(SPACE_FILE)
    assert space.phases and len(yaml.safe_load(SPACE_FILE.read_text())) < MAX_YAML_NODES


def test_cli_space_alias_bomb_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(billion_laughs())
    model = str(REFERENCE_MODEL)
    started = time.monotonic()
    assert main(["tune", model, "--space", str(bomb), "--storage", f"sqlite:///{tmp_path / 's.db'}",
                 "--executor", "local"]) == 2
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert "bomb.yaml" in err and "YAML nodes" in err
