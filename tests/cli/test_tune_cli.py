"""`topotune tune | studies | show | export` as a user runs them (simulated backend, SQLite)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from _support.paths import REFERENCE_MODEL, REFERENCE_SPACE

from tuner.cli import main
from tuner.workload import Workload

MODEL = str(REFERENCE_MODEL)
SPACE = str(REFERENCE_SPACE)
NAME = "qwen3.8-2.4t-a95b-nvfp4@gb300/8192x1024"


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> str:
    storage = f"sqlite:///{tmp_path_factory.mktemp('cli') / 'studies.db'}"
    assert main(["tune", MODEL, "--space", SPACE, "--trials", "4", "--sampler", "random", "--executor", "local",
                 "--storage", storage, "--json"]) == 0
    return storage


def test_tune_json(tuned: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", NAME, "--storage", tuned, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["name"] == NAME
    assert data["phases"]["decode"]["launched"] == 4 and data["phases"]["decode"]["front"]
    assert data["composed_front"] and all(r["gpus"] <= 72 for r in data["composed_front"])


def test_resume_is_the_same_command(tuned: str, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["tune", MODEL, "--space", SPACE, "--trials", "5", "--sampler", "random", "--executor", "local",
                 "--storage", tuned, "--json", "--phase", "decode"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["phases"]["decode"]["launched"] == 5  # 4 stored + 1 new, nothing re-run


def test_studies_lists_it(tuned: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["studies", "--storage", tuned, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["name"] == NAME and rows[0]["launched"] >= 8


def test_a_study_point_exports_the_batch_it_measured(tuned: str, capsys: pytest.CaptureFixture[str]) -> None:
    """#46: the decode side's --max-num-seqs is the point's running requests per DP rank, not the trial's ladder
    maximum."""
    import math

    from tuner.study import load_campaign

    result, _, _ = load_campaign(tuned, NAME)
    point = result.composed_front[0]
    expected = min(point.decode_topology.max_num_seqs,
                   max(1, math.ceil(point.decode.running_requests / point.decode_topology.dp - 1e-9)))
    capsys.readouterr()
    assert main(["export", NAME, "--point", "0", "--format", "srt-slurm", "--storage", tuned]) == 0
    decode = yaml.safe_load(capsys.readouterr().out)["backend"]["vllm_config"]["decode"]
    assert decode["max-num-seqs"] == str(expected)
    recipe = yaml.safe_load(main_output(["export", NAME, "--point", "0", "--format", "srt-slurm", "--storage", tuned],
                                        capsys))
    assert recipe["benchmark"]["concurrencies"] == [point.num_decode * point.decode.concurrency]  # its own load
    assert expected < point.decode_topology.max_num_seqs  # the front's point ran fewer than the ladder allowed


def main_output(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(args) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("fmt", ["vllm", "compose", "kubernetes", "dynamo", "srt-slurm"])
def test_export_formats(tuned: str, fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / f"recipe.{fmt}"
    assert main(["export", NAME, "--point", "0", "--format", fmt, "--storage", tuned, "--output", str(out)]) == 0
    text = out.read_text()
    if fmt == "vllm":
        assert "vllm serve" in text and "--kv-transfer-config" in text and "vllm-router" in text
    else:
        docs = [d for d in yaml.safe_load_all(text) if d]
        data = docs[0]
        if fmt == "kubernetes":
            assert any(d["kind"] == "LeaderWorkerSet" for d in docs) or any(d["kind"] == "Deployment" for d in docs)
        elif fmt == "dynamo":
            assert data["kind"] == "DynamoGraphDeployment"
        else:
            assert data["services"] if fmt == "compose" else data["backend"]["vllm_config"]["decode"]


def test_show_table(tuned: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["show", NAME, "--storage", tuned]) == 0
    out = capsys.readouterr().out
    assert "decode front" in out and "composed PD front" in out


@pytest.mark.parametrize(("args", "field"), [
    (["export", NAME, "--point", "999"], "--point"),
    (["export", NAME, "--format", "helm"], "--format"),
    (["show", "nobody@gb300/1x1"], "STUDY"),
    (["tune", MODEL, "--space", "/nonexistent.yaml"], "--space"),
    (["tune", MODEL, "--space", SPACE, "--sampler", "bayes"], "--sampler"),
    (["tune", MODEL, "--space", SPACE, "--trials", "0"], "--trials"),
    # a resume under other bounds (an ITL in seconds) would judge old and new trials differently: refused, not run
    (["tune", MODEL, "--space", SPACE, "--trials", "6", "--executor", "local", "--max-itl-ms", "0.05"],
     "error: --max-itl-ms: "),
    # its fix names the flags too, the study's bound and another storage: the library's fields as the CLI's
    (["tune", MODEL, "--space", SPACE, "--trials", "6", "--executor", "local", "--max-itl-ms", "0.05"],
     "(fix: resume with the study's --max-itl-ms (50.0), or run the new bounds as a new study (another --storage))"),
    (["tune", MODEL, "--space", SPACE, "--trials", "6", "--executor", "local", "--percentile", "p99"],
     "error: --percentile: "),
])
def test_bad_input_exit_2_and_nothing_lost(tuned: str, args: list[str], field: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main([*args, "--storage", tuned]) == 2
    err = capsys.readouterr().err
    assert field in err and "Traceback" not in err
    assert main(["studies", "--storage", tuned, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["launched"] >= 8


def test_bad_space_leaves_studies_untouched(tuned: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(SPACE).read_text().replace("max_num_seqs: [16, 64, 256]", "max_num_seqz: [16]"))
    capsys.readouterr()
    main(["studies", "--storage", tuned, "--json"])
    before = json.loads(capsys.readouterr().out)
    assert main(["tune", MODEL, "--space", str(bad), "--storage", tuned, "--executor", "local"]) == 2
    assert "max_num_seqz" in capsys.readouterr().err
    main(["studies", "--storage", tuned, "--json"])
    assert json.loads(capsys.readouterr().out) == before


def test_unreachable_storage(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["studies", "--storage", "postgresql+psycopg://x@127.0.0.1:1/none"]) == 2
    assert "--storage" in capsys.readouterr().err


def test_calibrate_fits_a_noisy_study(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A study measured with 10% noise: the fit cannot make the error worse and writes a usable file."""
    storage = f"sqlite:///{tmp_path / 'noisy.db'}"
    assert main(["tune", MODEL, "--space", SPACE, "--trials", "4", "--sampler", "random", "--executor", "local",
                 "--storage", storage, "--noise", "0.1", "--json"]) == 0
    capsys.readouterr()
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate", NAME, "--storage", storage, "--output", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["points"] > 8 and 0 < data["error_after"] <= data["error_before"]
    assert yaml.safe_load(out.read_text())["hbm_efficiency"] > 0
    assert main(["frontier", MODEL, "--gpus", "16", "--calibration", str(out), "--json"]) == 0
    capsys.readouterr()
    assert main(["calibrate", NAME, "--storage", storage, "--factors", "attention_flop_efficiency, hbm_efficiency",
                 "--json"]) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert set(chosen["factors"]) == {"attention_flop_efficiency", "hbm_efficiency"}
    assert chosen["error_after"] <= chosen["error_before"]
    assert main(["calibrate", NAME, "--storage", storage, "--factors", "warp_speed"]) == 2
    err = capsys.readouterr().err
    assert "--factors" in err and "attention_flop_efficiency" in err  # names the flag and the valid choices


def _trace_space(tmp_path: Path, trace: Path) -> Path:
    """The reference space on a trace: its prefill phase measures the trace's own prompts."""
    space = yaml.safe_load(Path(SPACE).read_text())
    space["workload"] = {"trace": str(trace)}
    space["phases"]["prefill"].pop("workload")
    space["phases"] = {"prefill": space["phases"]["prefill"]}
    path = tmp_path / "trace-space.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


def test_tune_on_a_trace_shows_prefix_hits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from _support.paths import REPO

    space = _trace_space(tmp_path, REPO / "examples" / "traces" / "chat-multiturn.jsonl")
    storage = f"sqlite:///{tmp_path / 'trace.db'}"
    assert main(["tune", MODEL, "--space", str(space), "--trials", "3", "--sampler", "random", "--executor",
                 "local", "--storage", storage, "--max-ttft-ms", "0"]) == 0
    out = capsys.readouterr().out
    assert "SLA: ITL <= 50 ms at p90" in out  # --max-ttft-ms 0 lifted the space's TTFT bound, the ITL one stays
    assert main(["show", "qwen3.8-2.4t-a95b-nvfp4@gb300/3932x221", "--storage", storage, "--json"]) == 0
    front = json.loads(capsys.readouterr().out)["phases"]["prefill"]["front"]
    reuse = Workload.from_trace(REPO / "examples" / "traces" / "chat-multiturn.jsonl").trace.prefix_reuse
    assert front and all(p["metrics"]["prefix_hit_share"] == pytest.approx(reuse, abs=0.02) for p in front)


def test_a_bad_trace_is_refused_with_its_line_and_nothing_lost(tuned: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "bad.jsonl"
    trace.write_text('{"input_length": 100, "output_length": 10}\n{"input_length": 100}\n')
    capsys.readouterr()
    main(["studies", "--storage", tuned, "--json"])
    before = json.loads(capsys.readouterr().out)
    assert main(["tune", MODEL, "--space", str(_trace_space(tmp_path, trace)), "--storage", tuned,
                 "--executor", "local"]) == 2
    assert "bad.jsonl line 2: output_length" in capsys.readouterr().err
    main(["studies", "--storage", tuned, "--json"])
    assert json.loads(capsys.readouterr().out) == before
