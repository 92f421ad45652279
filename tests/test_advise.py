"""`advise` as a library call: the request's fields named in its errors, each face's names through one table, and
the same answer the CLI prints."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from tuner.advise import AdviseRequest, ServeOptions, Sla, advise
from tuner.cli import main
from tuner.cli._perf import ADVISE_FLAGS
from tuner.errors import ConfigError, InfeasibleError
from tuner.perf import calibrated
from tuner.workload import Workload

ROOT = Path(__file__).resolve().parent.parent
REF = str(ROOT / "examples/models/qwen3.8-2.4t-a95b-nvfp4")


def test_advice_is_what_frontier_prints(capsys: pytest.CaptureFixture[str]) -> None:
    request = AdviseRequest(model=REF, workload=Workload.fixed(2000, 200, concurrency=(1,)), gpus=32,
                            sla=Sla(max_ttft_ms=1500, max_itl_ms=40), serve=ServeOptions(max_mtp=1))
    advice = advise(request)
    assert main(["frontier", REF, "--gpus", "32", "--isl", "2000", "--osl", "200", "--max-ttft-ms", "1500",
                 "--max-itl-ms", "40", "--max-mtp", "1", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    mine = advice.as_json()
    printed.pop("elapsed_s"), mine.pop("elapsed_s")
    assert json.loads(json.dumps(mine)) == printed
    winner = advice.recommendation.winner
    assert winner is not None and advice.operating_deployment is not None
    assert advice.commands is not None and "vllm serve" in advice.commands


def test_errors_name_request_fields_and_the_cli_maps_them(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(InfeasibleError) as info:
        advise(AdviseRequest(model=REF, workload=Workload.fixed(2000, 200, concurrency=(1,)), gpus=8,
                             request_rate=60, serve=ServeOptions(max_mtp=0)))
    assert info.value.field == "gpus" and "(gpus 24)" in str(info.value) and "request_rate" in str(info.value)
    assert info.value.renamed(ADVISE_FLAGS).user_message().startswith("--gpus: ")
    assert "(--gpus 24) or offer a lower --request-rate" in info.value.renamed(ADVISE_FLAGS).user_message()
    with pytest.raises(ConfigError) as bad:
        Sla(max_ttft_ms=-1)
    assert bad.value.field == "sla.max_ttft_ms"
    with pytest.raises(ConfigError) as bad:
        advise(AdviseRequest(model=REF, workload=Workload.fixed(100, 10), calibration={"hbm_efficiency": 7.0}))
    assert bad.value.field == "calibration.hbm_efficiency"
    assert bad.value.renamed(ADVISE_FLAGS).field == "--calibration: hbm_efficiency"


@pytest.mark.parametrize(("factors", "field", "says"), [
    ({"hbm_efficency": 0.8}, "calibration.hbm_efficency", "unknown factor"),
    ({"hbm_efficiency": 7.0}, "calibration.hbm_efficiency", "less than or equal to 1"),
    ({"hbm_efficiency": "0.8"}, "calibration.hbm_efficiency", "must be a number, got text"),
    ({"hbm_efficiency": True}, "calibration.hbm_efficiency", "must be a number, got a boolean"),
    ({"step_overhead_ms": float("inf")}, "calibration.step_overhead_ms", "must be finite"),
    ({"kv_occupancy": float("nan")}, "calibration.kv_occupancy", "must be finite"),
    ([("hbm_efficiency", 0.8)], "calibration", "expected a mapping of factor: value, got a list"),
])
def test_bad_calibration_factors_name_the_factor_and_the_fix(factors: object, field: str, says: str) -> None:
    """The library's calibration (a mapping here; a file in tests/cli/test_perf_cli.py) is checked strictly: what
    YAML or a caller would coerce silently (a quoted number, a boolean) is an error, as is an unknown name."""
    with pytest.raises(ConfigError) as bad:
        calibrated("gb300", factors)  # type: ignore[arg-type]
    assert bad.value.field == field and says in bad.value.message and bad.value.fix, bad.value


def test_a_calibration_file_is_read_through_the_guard(tmp_path: Path) -> None:
    """AdviseRequest.calibration may be a file's path: read by the guarded reader, its factors over the GPU's."""
    good, bomb, folder = tmp_path / "good.yaml", tmp_path / "bomb.yaml", tmp_path / "folder"
    good.write_text('{"hbm_efficiency": 0.6}\n')  # JSON is YAML
    bomb.write_text("a: &a [1, 1]\n" + "".join(f"b{i}: &b{i} [*{'a' if i == 0 else f'b{i - 1}'}, *a]\n"
                                              for i in range(120)))
    folder.mkdir()
    cal = calibrated("gb300", good)
    assert cal.hbm_efficiency == 0.6 and cal.flop_efficiency == calibrated("gb300", None).flop_efficiency
    for path, says in ((bomb, "aliases"), (folder, "is a directory")):
        with pytest.raises(ConfigError) as bad:
            advise(AdviseRequest(model=REF, workload=Workload.fixed(100, 10), calibration=path))
        assert bad.value.field == "calibration" and says in bad.value.message, bad.value
        assert bad.value.renamed(ADVISE_FLAGS).field == "--calibration"


@pytest.mark.parametrize("module", ["tuner/frontier.py", "tuner/advise"])
def test_the_library_names_no_cli_flag(module: str) -> None:
    """Flags are the CLI's names for request fields: no string the library's code builds names one (docstrings,
    which may say what a command prints, aside)."""
    files = [ROOT / module] if module.endswith(".py") else sorted((ROOT / module).glob("*.py"))
    flags = []
    for f in files:
        tree = ast.parse(f.read_text())
        docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
        flags += [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and id(node) not in
                  docstrings and isinstance(node.value, str) and re.search(r"(^|[ (`])--[a-z]", node.value)]
    assert flags == []
