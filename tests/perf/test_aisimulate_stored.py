"""aisimulate's stored predictions (benchmarks/data/aisimulate.yaml), read by benchmarks/workload_fidelity.py: the
file parses, every entry is a public workload row's with the command and configuration that made it, and the side
by side scores them. Nothing here runs aisimulate (it lives in its own venv; benchmarks/aisimulate_runs.py --run
does)."""

from __future__ import annotations

import math
import shlex

import pytest
import yaml
from _support.benchmarks import load_benchmark

SYSTEMS = {"h100": "h100_sxm", "h200": "h200_sxm"}


@pytest.fixture(scope="module")
def wf():
    return load_benchmark("workload_fidelity")


def test_stored_runs_parse_and_match_public_rows(wf) -> None:
    rows = {r["id"]: r for r in yaml.safe_load(wf.TABLE.read_text())["rows"]}
    stored = yaml.safe_load(wf.AISIMULATE.read_text())
    ids = [e["id"] for e in stored["rows"]]
    assert len(ids) == len(set(ids)), "an id is stored twice"
    assert set(ids) <= set(rows), "a stored row is not in the public table: re-run --run"
    for e in stored["rows"]:
        row = rows[e["id"]]
        assert row["engine"] == "vllm"
        if "why" in e:
            assert e["why"].strip()
            continue
        argv = shlex.split(e["command"])
        assert argv[:3] == ["aisimulate", "predict", "-c"]
        assert argv[3] == f".topotune/aisimulate/{e['id']}/config.yaml"
        engine = e["config"]["engine"]
        assert engine["hardware"] == SYSTEMS[row["gpu"]] and engine["backend"] == "vllm"
        load = e["config"]["traffic"]["load"]
        assert load == ({"type": "trace_timestamps"} if row["load"]["kind"] == "rate"
                        else {"type": "concurrency", "concurrency": row["load"]["max_concurrency"]})
        assert ("queue_grows" in e["window"]) == (row["load"]["kind"] == "rate"), e["id"]
        for name in ("ttft_ms", "itl_ms"):
            w = e["window"][name]
            assert 0 < w["p50"] <= w["p90"] <= w["p99"], (e["id"], name)
        assert e["window"]["warmup_requests"] == math.ceil(0.1 * (e["window"]["requests"]
                                                                  + e["window"]["warmup_requests"]))


def test_load_and_errors_follow_the_stored_figures(wf) -> None:
    version, runs = wf.load_aisimulate()
    assert version.startswith("0.13")
    rows = {r["id"]: r for r in yaml.safe_load(wf.TABLE.read_text())["rows"]}
    scored = [r for r in runs.values() if r.figures]
    assert len(scored) >= 10, "fewer rows predicted than the comparison needs"
    assert any(not r.like_for_like for r in scored), "the cache-aware rows should be flagged"
    for run in scored:
        errors = wf.peer_errors(rows[run.id], run)
        assert errors, run.id
        row = rows[run.id]
        for key, value in errors.items():
            measured = wf._measured(row)[key]
            assert not (key.startswith("itl_") and wf.measuring_tool(row) == "vllm bench serve"), \
                "aisimulate gives per-request ITL, not vllm bench serve's token gaps"
            if key == "itl_mean" and row["source"] in wf.LINE_TIMESTAMP_SOURCES:
                predicted = run.figures["tpot_mean"]
                # inference-perf timed every SSE line: 2 gaps per token plus [DONE], so a per-token ITL reads
                # (osl - 1) / (2 osl + 1) of itself there
                osl = float(row["workload"]["osl_nominal"])
                predicted *= (osl - 1) / (2 * osl + 1)
            else:
                predicted = run.figures[key]
            assert value == pytest.approx(math.log(predicted / measured))


def test_side_by_side_counts_only_like_for_like_rows(wf) -> None:
    _, runs = wf.load_aisimulate()
    rows = {r["id"]: r for r in yaml.safe_load(wf.TABLE.read_text())["rows"]}
    # the replay's errors stood in by fixed ratios: the side by side must pick the rows and the closer tool
    fake = [wf.Scored(rows[i], None, {k: math.log(1.1) for k in wf._measured(rows[i]) if k.startswith("ttft_")},
                      "test") for i, r in runs.items() if r.figures]
    lines = wf.aisimulate_side_by_side(fake)
    like = [i for i, r in runs.items() if r.figures and r.like_for_like]
    assert f"{len(like)} rows both run" in lines[0]
    unlike = [i for i, r in runs.items() if r.figures and not r.like_for_like]
    assert any(line.strip().startswith(f"not compared ({len(unlike)};") for line in lines)
    closer = {line.split(" on ")[0].split()[-1]: int(line.split(" on ")[1].split()[0])
              for line in lines if line.strip().startswith("TTFT closer with")}
    expected = sum(wf._row_ttft(wf.peer_errors(rows[i], runs[i])) > math.log(1.1) for i in like)
    assert closer["replay"] == expected and closer["replay"] + closer["aisimulate"] == len(like)
    # no replay verdicts given (saturated None): none counted
    assert any("against the source's 0 clear ones" in line for line in lines)
