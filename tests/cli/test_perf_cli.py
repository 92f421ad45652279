"""`topotune simulate` and `topotune frontier` as a user runs them: JSON, tables, one-line errors (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from _support.hostile import hostile_path

from tuner.cli import main


@pytest.fixture(scope="module")
def ref(models_dir: Path) -> str:
    local = models_dir / "qwen3.8-2.4t-a95b-nvfp4"
    return str(local if local.exists() else Path("/work/shared/models/qwen3.8-2.4t-a95b-nvfp4"))


def test_simulate_decode_json(ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", ref, "--hardware", "gb300", "--topology", "TEP8", "--role", "decode", "--mtp", "3",
                 "--isl", "1", "--osl", "1000", "--concurrency", "1,8,64,256", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    points = data["points"]
    assert [p["concurrency"] for p in points] == [1, 8, 64, 256]
    assert data["topology"].startswith("TEP8 MTP3") and data["role"] == "decode"
    tput = [p["total_tok_s"] for p in points]
    user = [p["tok_s_per_user"] for p in points]
    assert tput == sorted(tput) and user == sorted(user, reverse=True)
    assert all(p["step"]["step_ms"] > 0 and p["osl"] == 1000 for p in points)


def test_simulate_prefill_table(ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["simulate", ref, "--topology", "TP4DP2+EP", "--role", "prefill", "--isl", "8192",
                 "--concurrency", "1,4"])
    assert code == 0
    out = capsys.readouterr().out
    assert "TP4DP2+EP prefill" in out and "TTFT ms" in out


def test_simulate_fp8_kv_cache_doubles_what_the_cache_holds(capsys: pytest.CaptureFixture[str]) -> None:
    """MiniMax-M2 keeps a BF16 KV cache by default; `--kv-cache-dtype fp8` halves its bytes per token, so the same
    free memory holds twice the requests (the weights and the activation peak do not change)."""
    held = {}
    for dtype in ("auto", "fp8"):
        code = main(["simulate", "examples/models/minimax-m2", "--hardware", "b200", "--topology", "TP2",
                     "--role", "aggregated", "--isl", "7372", "--osl", "921", "--concurrency", "8",
                     "--gpu-memory-utilization", "0.9", "--kv-cache-dtype", dtype, "--json"])
        assert code == 0
        data = json.loads(capsys.readouterr().out)
        held[dtype] = data["points"][0]["max_concurrency"]
        assert ("kv=fp8" in data["topology"]) == (dtype == "fp8")
    assert held["fp8"] == pytest.approx(2 * held["auto"], rel=0.01)


@pytest.mark.parametrize("command", ["simulate", "frontier"])
def test_an_unknown_kv_cache_dtype_names_the_flag_and_the_choices(ref: str, command: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code = main([command, ref, "--kv-cache-dtype", "fp9"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "kv-cache-dtype" in err and "fp9" in err and "use auto" in err


@pytest.mark.parametrize(("args", "field"), [
    (["--role", "mixed"], "--role"),
    (["--concurrency", "1,x"], "--concurrency"),
    (["--concurrency", "0"], "--concurrency"),
    (["--topology", "TP3"], "error: --topology: "),
    (["--topology", "DEP8"], "does not fit"),
    (["--isl", "0"], "--isl"),
    (["--hardware", "h2000"], "error: --hardware: "),  # the library's fields named as this command's flags
    (["--max-num-seqs", "0"], "error: --max-num-seqs: "),
])
def test_simulate_bad_input_is_one_line(ref: str, capsys: pytest.CaptureFixture[str], args: list[str],
                                        field: str) -> None:
    code = main(["simulate", ref, *args])
    err = capsys.readouterr().err
    assert code == 2
    assert field in err and "Traceback" not in err


def test_frontier_json_and_html(ref: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    html = tmp_path / "front.html"
    code = main(["frontier", ref, "--hardware", "gb300", "--gpus", "72", "--isl", "8192", "--osl", "1024",
                 "--max-ttft-ms", "2000", "--json", "--html", str(html)])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    front = data["front"]
    assert len(front) >= 5 and data["constraints"]["pairing"].startswith("vLLM 0.32.0")
    assert all(p["num_gpus"] <= 72 and p["ttft_ms"] <= 2000 for p in front)
    assert all(p["prefill_topology"].startswith(("TP", "DEP", "TEP", "DP")) for p in front)
    users = [p["tok_s_per_user"] for p in front]
    assert users == sorted(users)  # throughput end first
    text = html.read_text()
    assert "combined Pareto front" in text and "every deployment" in text and "aggregated front" in text


def test_frontier_table(ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frontier", ref, "--gpus", "32", "--max-mtp", "0"]) == 0
    out = capsys.readouterr().out
    assert "tok/s/GPU" in out and "1P(" in out


def test_frontier_impossible_sla_names_the_constraint(ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["frontier", ref, "--max-ttft-ms", "10"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--max-ttft-ms" in err and "no prefill point meets TTFT <= 10 ms" in err and "best TTFT" in err


def test_frontier_budget_too_small(ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frontier", ref, "--gpus", "8", "--mode", "disagg"]) == 2
    assert "--gpus" in capsys.readouterr().err


def test_frontier_aggregated_fits_where_pd_cannot(ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    """8 GPUs hold no 1P1D pair of the reference model, but one aggregated instance serves both phases."""
    assert main(["frontier", ref, "--gpus", "8", "--max-mtp", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["front"] == [] and data["aggregated_front"]
    assert all(p["num_gpus"] <= 8 for p in data["aggregated_front"])
    assert [w["mode"] for w in data["winners"]] == ["aggregated"]


def test_frontier_shows_both_modes_and_who_wins(ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frontier", ref, "--gpus", "72", "--max-mtp", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["front"] and data["aggregated_front"] and data["mode"] == "both"
    modes = {w["mode"] for w in data["winners"]}
    assert modes <= {"aggregated", "disaggregated"} and modes
    for w in data["winners"]:
        assert w["from_tok_s_per_user"] <= w["to_tok_s_per_user"]
    # at the throughput end of 8k/1k the PD front holds (the decode instances never stall on prefill)
    best_pd = max(p["total_tok_s_per_gpu"] for p in data["front"])
    best_agg = max(p["total_tok_s_per_gpu"] for p in data["aggregated_front"])
    assert data["winners"][0]["mode"] == ("disaggregated" if best_pd > best_agg else "aggregated")


def test_simulate_aggregated_charges_prefill_to_the_itl(ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["simulate", ref, "--topology", "TEP8", "--concurrency", "64", "--json"]
    assert main([*args, "--role", "decode"]) == 0
    decode = json.loads(capsys.readouterr().out)["points"][0]
    assert main([*args, "--role", "aggregated"]) == 0
    agg = json.loads(capsys.readouterr().out)
    point = agg["points"][0]
    assert agg["role"] == "aggregated"
    assert point["itl_ms_mean"] > 1.2 * decode["itl_ms_mean"]  # prefill chunks stall every decoding request
    assert 0 < point["step"]["chunk_share"] <= 1 and point["step"]["chunk_step_ms"] > point["step"]["step_ms"]


def _bomb(levels: int = 9, width: int = 9) -> str:
    """Billion laughs: a few hundred bytes that expand to width**levels nodes when walked."""
    lines = ['a0: &a0 [0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8, 0.8]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\nhbm_efficiency: 0.8\n"


# A bad --calibration file, what its error names (after "--calibration: ") and what it says.
BAD_CALIBRATIONS = {
    "unknown factor": ("hbm_efficency: 0.8\n", "hbm_efficency", "did you mean hbm_efficiency?"),
    "out of bounds": ("hbm_efficiency: 3\n", "hbm_efficiency", "less than or equal to 1"),
    "text": ("hbm_efficiency: fast\n", "hbm_efficiency", "must be a number, got text ('fast')"),
    "quoted number": ("hbm_efficiency: '0.8'\n", "hbm_efficiency", "write it unquoted"),
    "boolean": ("hbm_efficiency: true\n", "hbm_efficiency", "must be a number, got a boolean"),
    "list value": ("hbm_efficiency: [0.8]\n", "hbm_efficiency", "must be a number, got a list"),
    "null": ("hbm_efficiency:\n", "hbm_efficiency", "must be a number, got null"),
    "infinite": ("allreduce_latency_us: .inf\n", "allreduce_latency_us", "must be finite"),
    "number key": ("1: 0.8\n", "1", "a factor is named by text"),
    "list": ("[0.8]\n", "", "holds a list, not a mapping"),
    "scalar": ("0.8\n", "", "holds 0.8, not a mapping"),
    "syntax": ("hbm_efficiency: [\n", "", "cal.yaml:2: not valid YAML"),
    "bomb": (_bomb(), "", "YAML nodes"),
    "aliases": (_bomb(levels=4, width=30), "", "aliases"),
    "deep": ("[" * 40 + "]" * 40, "", "nests deeper"),
    "huge": ("# pad\n" * 20_000 + "hbm_efficiency: 0.8\n", "", "at most 64.0 KiB is read"),
    "directory": (None, "", "is a directory, not a regular file"),
    "fifo": (None, "", "is a FIFO (named pipe), not a regular file"),
}


@pytest.mark.parametrize("kind", list(BAD_CALIBRATIONS))
def test_a_bad_calibration_file_names_the_flag_the_factor_and_the_fix(
        ref: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str) -> None:
    """--calibration goes through the library's guarded reader (tuner.perf.calibrated: tuner/files.py,
    tuner/_yaml.py, each factor checked strictly): an unknown factor, a bound, a wrong type, a non-mapping, an alias
    bomb, absurd nesting, a directory, a FIFO (a naive read blocks forever) or a huge file is one line naming the
    flag (and the factor) and the fix, exit 2, in every command that takes the flag."""
    text, factor, says = BAD_CALIBRATIONS[kind]
    path = hostile_path(tmp_path / "cal.yaml", kind, text or "")
    for command in (["frontier", ref], ["simulate", ref, "--role", "decode", "--topology", "TP4"]):
        assert main([*command, "--calibration", str(path)]) == 2
        err = capsys.readouterr().err
        assert f"--calibration: {factor + ': ' if factor else ''}" in err, err
        assert says in err and "(fix: " in err and "Traceback" not in err, err


def test_a_calibration_file_written_by_calibrate_is_read_back(ref: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """What `topotune calibrate --out` writes (every factor, an unset attention efficiency as null) is a valid
    --calibration: the strict checks refuse only what is wrong."""
    from tuner.perf import default_calibration

    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump({**default_calibration("gb300").model_dump(), "hbm_efficiency": 0.6}))
    assert main(["simulate", ref, "--role", "decode", "--topology", "TEP8", "--json",
                 "--calibration", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["calibration"]["hbm_efficiency"] == 0.6


def _mix_trace(tmp_path: Path) -> Path:
    rows = [{"timestamp": 100 * i, "input_length": 1000 + 300 * (i % 7), "output_length": 100 + 20 * (i % 5),
             "hash_ids": [0, 1, 2 + i]} for i in range(50)]
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_workload_command_summarises_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workload", str(_mix_trace(tmp_path)), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["requests"] == 50 and data["arrival_rps"] == pytest.approx(49 / 4.9)
    assert data["input_tokens"]["longest"] == 2800 and data["output_tokens"]["p50"] == 140
    assert 0 < data["prefix_reuse"] < 1
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"input_length": 5, "output_length": 3}\n{"input_length": 0, "output_length": 3}\n')
    assert main(["workload", str(bad)]) == 2
    assert "bad.jsonl line 2: input_length" in capsys.readouterr().err


def test_frontier_recommends_under_the_sla(ref: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """One answer: the best of each mode under the SLA, the winner and its margin, and commands that carry the
    operating point; no front point breaks a bound or the per-user floor."""
    args = ["frontier", ref, "--gpus", "32", "--max-mtp", "1", "--workload", str(_mix_trace(tmp_path)),
            "--max-ttft-ms", "1500", "--max-itl-ms", "40", "--min-tok-s-user", "30", "--percentile", "p90"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    pick = data["recommendation"]
    assert pick["winner"] in ("disaggregated", "aggregated") and pick["margin"] >= 1.0
    for p in data["front"] + data["aggregated_front"]:
        assert p["ttft_ms"] <= 1500 and p["itl_ms"] <= 40 and p["tok_s_per_user"] >= 30
    best = max(data["front"] + data["aggregated_front"], key=lambda p: p["total_tok_s_per_gpu"])
    assert pick[pick["winner"]]["total_tok_s_per_gpu"] == best["total_tok_s_per_gpu"]
    assert main([*args, "--weights", "/models/ref-weights"]) == 0
    out = capsys.readouterr().out
    assert "Recommendation" in out and "wins by x" in out and "vllm serve /models/ref-weights" in out
    assert "--max-num-seqs" in out


def test_simulate_open_loop_says_saturated(ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", ref, "--topology", "TEP8", "--role", "aggregated", "--isl", "2000", "--osl", "200",
                 "--request-rate", "1,100000", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [p["offered_rps"] for p in data["points"]] == [1.0]
    assert data["saturated"][0]["offered_rps"] == 100000.0


def test_frontier_open_loop_carries_the_offered_rate(ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--request-rate: every instance of a side shares the one rate, tok/s/GPU is that rate's tokens over the GPUs,
    no point breaks the SLA, and the recommendation is the fewest GPUs (the concurrency ladder is not swept)."""
    rate = 6.0
    assert main(["frontier", ref, "--gpus", "32", "--max-mtp", "0", "--isl", "2000", "--osl", "200",
                 "--request-rate", str(rate), "--max-ttft-ms", "1000", "--max-itl-ms", "40", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["offered_rps"], data["arrival"], data["offered_tok_s"]) == (rate, "poisson", rate * 2200)
    assert data["front"] and data["aggregated_front"]
    for p in data["front"]:
        assert p["num_prefill"] * p["prefill_rps_per_instance"] == pytest.approx(rate, rel=1e-3)
        assert p["num_decode"] * p["decode_rps_per_instance"] == pytest.approx(rate, rel=1e-3)
    for p in data["aggregated_front"]:
        assert p["num_instances"] * p["rps_per_instance"] == pytest.approx(rate, rel=1e-3)
    every = data["front"] + data["aggregated_front"]
    for p in every:
        assert p["ttft_ms"] <= 1000 and p["itl_ms"] <= 40 and p["num_gpus"] <= 32
        assert p["total_tok_s_per_gpu"] == pytest.approx(rate * 2200 / p["num_gpus"], abs=0.1)
    gpus = sorted(p["num_gpus"] for p in data["front"])
    speed = [p["tok_s_per_user"] for p in sorted(data["front"], key=lambda p: p["num_gpus"])]
    assert speed == sorted(speed) and len(set(gpus)) == len(gpus)  # more GPUs only to be faster per user
    pick = data["recommendation"]
    assert pick["winner_num_gpus"] == min(p["num_gpus"] for p in every)
    assert pick[pick["winner"]]["num_gpus"] == pick["winner_num_gpus"]
    assert main(["frontier", ref, "--gpus", "32", "--max-mtp", "0", "--isl", "2000", "--osl", "200",
                 "--request-rate", str(rate), "--max-ttft-ms", "1000", "--max-itl-ms", "40"]) == 0
    out = capsys.readouterr().out
    assert f"fewest GPUs that carry 6 req/s under the limits: {pick['winner_num_gpus']}" in out
    assert "P req/s" in out and "req/s/inst" in out and "vllm serve" in out


def test_frontier_open_loop_at_the_traces_own_rate(ref: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    trace = str(_mix_trace(tmp_path))  # 50 requests over 4.9 s
    assert main(["frontier", ref, "--gpus", "16", "--max-mtp", "0", "--workload", trace, "--arrival", "trace",
                 "--mode", "agg", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["arrival"] == "trace" and data["offered_rps"] == pytest.approx(49 / 4.9)
    assert data["aggregated_front"] and data["front"] == []
    assert main(["frontier", ref, "--gpus", "16", "--arrival", "trace"]) == 2  # no trace, no rate of its own
    assert "--arrival" in capsys.readouterr().err


def test_frontier_open_loop_says_how_many_gpus_carry_the_rate(ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A rate no deployment in the budget carries is an error naming --gpus and a count that does carry it."""
    args = ["frontier", ref, "--max-mtp", "0", "--isl", "2000", "--osl", "200", "--request-rate", "60",
            "--mode", "agg"]
    assert main([*args, "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert "--gpus" in err and "carries 60 req/s" in err
    needed = int(err.split("--gpus ")[-1].split(")")[0])
    assert needed > 8
    assert main([*args, "--gpus", str(needed), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["recommendation"]["winner_num_gpus"] <= needed


def test_frontier_open_loop_sla_miss_names_the_bound(ref: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["frontier", ref, "--gpus", "32", "--max-mtp", "0", "--isl", "2000", "--osl", "200", "--request-rate", "5"]
    assert main([*args, "--max-ttft-ms", "5"]) == 2
    err = capsys.readouterr().err
    assert "--max-ttft-ms" in err and "the best TTFT is" in err and "5 req/s" in err
    assert main([*args, "--max-itl-ms", "0.5"]) == 2
    err = capsys.readouterr().err
    assert "--max-itl-ms" in err and "the best ITL is" in err


def test_frontier_says_when_the_steady_state_model_decided(models_dir: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """An SLA the replay decides by default, but a closed loop past the clients it replays: the text answer says
    the steady-state model decided and names the flag that replays it (docs/workloads.md "Deciding with it")."""
    args = ["frontier", str(models_dir / "llama-3.1-70b"), "-g", "h200", "--gpus", "16", "--isl", "2000", "--osl",
            "200", "--max-itl-ms", "300", "--max-mtp", "0", "--mode", "agg"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert ("decided by the steady-state model (closed loop at 768 clients, past the 256 the replay checks by "
            "default (--replay-verify replays it))") in out


@pytest.mark.parametrize(("block", "says"), [
    ("isl: 1000\nosl: 0\n", "error: --workload: osl: Input should be greater than or equal to 1"),
    ("input_tokens: {distribution: lognormal, mean: 2000}\nosl: 100\n",
     "error: --workload: input_tokens.lognormal.stddev: Field required"),
])
def test_a_bad_workload_block_names_its_field_under_the_option(tmp_path: Path, block: str, says: str,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The block's field after the option, as every nested field is named (`--calibration: factor`); it read
    `--workload.osl`, a flag that does not exist."""
    path = tmp_path / "w.yaml"
    path.write_text(block)
    assert main(["workload", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(says) and "Traceback" not in err
