"""`topotune memory` as a user runs it: JSON keys, readable table, one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tuner.cli import main

REQUIRED_KEYS = {"block_size", "page_size_bytes", "num_gpu_blocks", "blocks_per_request", "max_concurrency",
                 "max_concurrency_instance", "weights_gib_per_gpu", "kv_cache_gib_per_gpu", "fits"}


def test_json_output(reference_model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["memory", str(reference_model_path), "--hardware", "gb300", "--topology", "TP4DP4+EP",
                 "--mtp", "3", "--gpu-memory-utilization", "0.92", "--isl", "8192", "--osl", "1024", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= REQUIRED_KEYS
    # both figures are rounded to 3 decimals in the JSON: 4 x a rounded value is within 4 x 0.0005 + 0.0005
    assert data["fits"] is True
    assert data["max_concurrency_instance"] == pytest.approx(4 * data["max_concurrency"], abs=0.0025)


def test_kv_cache_memory_bytes_overrides(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["memory", str(models_dir / "qwen3-next-80b-a3b"), "--hardware", "h200", "--topology", "TP1",
                 "--kv-cache-memory-bytes", "40G", "--isl", "262144", "--osl", "0", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["num_gpu_blocks"], data["blocks_per_request"]) == (3212, 485)
    assert data["kv_budget_overridden"] is True


def test_fp8_kv_and_eplb_options(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["memory", str(models_dir / "deepseek-v3"), "--hardware", "h200", "--topology", "DEP8", "--json",
            "--kv-cache-memory-bytes", "10G"]
    assert main(base) == 0
    auto = json.loads(capsys.readouterr().out)
    assert main([*base, "--kv-cache-dtype", "fp8", "--num-redundant-experts", "8"]) == 0
    fp8 = json.loads(capsys.readouterr().out)
    assert (auto["kv_cache_dtype"], fp8["kv_cache_dtype"]) == ("auto", "fp8")
    assert fp8["page_size_bytes"] * 2 == auto["page_size_bytes"]
    assert fp8["expert_weights_gib_per_gpu"] == pytest.approx(auto["expert_weights_gib_per_gpu"] * 33 / 32, rel=1e-3)


def test_table_output(reference_model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", str(reference_model_path), "--topology", "TEP8"]) == 0
    out = capsys.readouterr().out
    assert "KV budget" in out and "fits:" in out and "Maximum concurrency" in out


def test_sweep_sorted_by_concurrency(reference_model_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", str(reference_model_path), "--sweep", "--gpus", "16", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["topology"] for r in rows} >= {"TP8", "TEP8", "TP4DP4+EP"}
    fitting = [r for r in rows if r["fits"]]
    per_gpu = [r["max_concurrency_instance"] / r["num_gpus"] for r in fitting]
    assert per_gpu == sorted(per_gpu, reverse=True)
    assert all(r["num_gpus"] <= 16 for r in rows)


@pytest.mark.parametrize(("args", "field"), [  # each error names the flag to change, as `frontier`'s do
    (["--topology", "TP3"], "--topology"),
    (["--topology", "TP4DP4+EP", "--gpus", "8"], "--topology"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
    (["--gpu-memory-utilization", "-0.2"], "--gpu-memory-utilization"),
    (["--hardware", "tpu9"], "--hardware"),
    (["--isl", "0"], "--isl"),
    (["--kv-cache-memory-bytes", "lots"], "--kv-cache-memory-bytes"),
    (["--max-model-len", "100"], "--max-model-len"),
    (["--mtp", "2", "--topology", "TP8"], None),
    (["--kv-cache-dtype", "fp9"], "--kv-cache-dtype"),
    (["--topology", "DEP8", "--num-redundant-experts", "3"], "--eplb-config.num_redundant_experts"),
    (["--topology", "TP8", "--num-redundant-experts", "8"], "--eplb-config.num_redundant_experts"),
])
def test_bad_input_is_one_line_exit_2(reference_model_path: Path, args: list[str], field: str | None,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["memory", str(reference_model_path), *args])
    err = capsys.readouterr().err
    if field is None:  # valid input: the reference model has an MTP layer
        assert code == 0
        return
    assert code == 2
    assert err.startswith(f"error: {field}: ") and "fix:" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_unreadable_and_unknown_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", str(tmp_path / "missing")]) == 2
    (tmp_path / "config.json").write_text('{"model_type": "mamba_x"}')
    assert main(["memory", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "model_type" in err and "Traceback" not in err


@pytest.mark.parametrize("name", ["a" * 300, "~" * 300])  # ENAMETOOLONG; "~..." names a user that does not exist
def test_unusable_model_path_is_one_line_exit_2(tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", name if name.startswith("~") else str(tmp_path / name)]) == 2
    err = capsys.readouterr().err
    assert "MODEL" in err and "Traceback" not in err


def test_console_script_runs_in_a_subprocess(reference_model_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", "from tuner.cli import run; run()", "memory",
                           str(reference_model_path), "--topology", "TP3"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "attention heads" in proc.stderr


def test_sweep_all_sizes_includes_ep48_and_ep72(models_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["memory", str(models_dir / "deepseek-v3"), "--hardware", "gb200", "--sweep", "--gpus", "72", "--json"]
    assert main(base) == 0
    powers = {r["topology"] for r in json.loads(capsys.readouterr().out)}
    assert main([*base, "--all-sizes"]) == 0
    rows = {r["topology"]: r for r in json.loads(capsys.readouterr().out)}
    assert "DEP72" not in powers and {"DEP72", "TP8DP6+EP", "DEP48"} <= set(rows)
    # 256 experts over EP72: the fullest rank holds 4 (256 = 3 x 72 + 40), over EP64 exactly 4 as well
    assert rows["DEP72"]["expert_weights_gib_per_gpu"] == pytest.approx(rows["DEP64"]["expert_weights_gib_per_gpu"])


@pytest.mark.parametrize("field", ["num_attention_heads", "num_key_value_heads", "hidden_size", "head_dim",
                                   "num_hidden_layers", "vocab_size"])
@pytest.mark.parametrize("command", [["memory", "--hardware", "h200", "--topology", "TP8"],
                                     ["frontier", "--hardware", "h200", "--gpus", "16", "--no-replay-verify"]])
def test_a_zero_size_in_config_is_one_line_naming_it(models_dir: Path, tmp_path: Path, field: str,
                                                     command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """A config.json with a size of 0 (heads, layers, vocabulary) was a ZeroDivisionError deep in the memory
    model; it is the config's field and the fix, exit 2."""
    config = json.loads((models_dir / "llama-3.1-70b" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, field: 0}))
    assert main([command[0], str(tmp_path), *command[1:]]) == 2
    err = capsys.readouterr().err
    assert f"{field}: {field} must be a positive integer, got 0" in err and f"fix: correct {field}" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
