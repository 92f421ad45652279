"""`topotune replay` on the example trace, a distribution and multi-turn sessions, and its bad input."""

from __future__ import annotations

import json

import pytest
from _support.paths import REPO

from tuner.cli import main

MODEL = str(REPO / "examples/models/llama-3.1-70b")


def _json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["replay", MODEL, "--hardware", "h200", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_replay_runs_a_trace_a_distribution_and_sessions(capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    trace = _json(capsys, "--deployment", "2x:TP8", "--workload", str(REPO / "examples/traces/chat-multiturn.jsonl"),
                  "--html", str(tmp_path / "r.html"))
    assert trace["requests"] == 202 and trace["arrival"] == "the trace's own timestamps"
    assert 0.3 < trace["prefix_hit_share"] < 0.75  # the trace re-sends its history: 72% with an unbounded cache
    assert len(trace["per_request"]) == 202 and trace["timeline"]
    assert "TTFT CDF" in (tmp_path / "r.html").read_text()
    dist = _json(capsys, "--deployment", "1P:TP4,1D:TP8", "--workload",
                 str(REPO / "examples/workloads/chat-lognormal.yaml"), "--request-rate", "2", "--num-requests", "200")
    assert dist["requests"] == 200 and dist["num_gpus"] == 12
    sessions = _json(capsys, "--isl", "1000", "--osl", "100", "--turns", "3", "--concurrency", "4",
                     "--num-requests", "60")
    assert sessions["requests"] == 60 and sessions["prefix_hit_share"] > 0.3


@pytest.mark.parametrize(("args", "field"), [
    (["--router", "sticky", "--concurrency", "1"], "--router"),
    (["--deployment", "2P:TP8", "--concurrency", "1"], "--deployment"),
    (["--request-rate", "1", "--concurrency", "2"], "--concurrency"),
    ([], "--request-rate"),
    (["--deployment", "2x:TPX8", "--concurrency", "1"], "--deployment"),  # the library's fields as this command's
    (["--deployment", "2x:TP3", "--concurrency", "1"], "--deployment"),  # flags (they read "topology:")
    (["--hardware", "h2000", "--concurrency", "1"], "--hardware"),
    (["--concurrency", "0"], "--concurrency"),  # the replay request's fields, rendered as flags
    (["--request-rate", "1", "--burstiness-cv", "50"], "--burstiness-cv"),
    (["--concurrency", "1", "--turns", "0"], "--turns"),
    (["--concurrency", "1", "--warmup", "1.5"], "--warmup"),
    (["--concurrency", "1", "--num-requests", "0"], "--num-requests"),
    (["--arrival", "sticky", "--request-rate", "1"], "--arrival"),
])
def test_bad_replay_input_names_the_option(capsys: pytest.CaptureFixture[str], args: list[str], field: str) -> None:
    assert main(["replay", MODEL, "--hardware", "h200", "--isl", "100", "--osl", "10", *args]) == 2
    assert capsys.readouterr().err.startswith(f"error: {field}: ")


def test_live_check_names_its_deployment_option(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["live-check", MODEL, "--deployment", "2x:TPP4", "--from-metrics", "http://127.0.0.1:1/metrics"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --deployment: cannot parse topology 'TPP4'") and "Traceback" not in err
