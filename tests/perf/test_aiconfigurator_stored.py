"""aiconfigurator's stored estimates (benchmarks/data/aiconfigurator.yaml), read by benchmarks/fidelity.py: the file
parses, every entry is a public row's, and the mapping of a row onto aiconfigurator's flags is the documented one.
Nothing here runs aiconfigurator (it lives in its own venv; benchmarks/aiconfigurator_runs.py --run does)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml
from _support.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def fidelity():
    return load_benchmark("fidelity")


@pytest.fixture(scope="module")
def runs(fidelity):
    return load_benchmark("aiconfigurator_runs")


def test_stored_estimates_parse_and_match_public_rows(fidelity) -> None:
    _, rows = fidelity.load_table(fidelity.TABLE)
    by_id = {r.id: r for r in rows}
    stored = yaml.safe_load(fidelity.PEER.read_text())["rows"]
    ids = [e["id"] for e in stored]
    assert len(ids) == len(set(ids)), "an id is stored twice"
    assert set(ids) <= set(by_id), "a stored row is not in the public table: re-run --run"
    estimates, skipped = fidelity.load_peer(fidelity.PEER, rows)
    assert set(estimates) | set(skipped) == set(ids) and not set(estimates) & set(skipped)
    assert len(estimates) >= 20, "fewer rows estimated than the comparison needs"
    for e in stored:
        if "why" in e:
            assert e["why"].strip()
            continue
        argv = shlex.split(e["command"])
        assert argv[:3] == ["aiconfigurator", "cli", "estimate"]
        row = by_id[e["id"]]
        assert argv[argv.index("--backend") + 1] == row.engine
        assert argv[argv.index("--isl") + 1] == str(max(1, round(row.isl)))
        assert argv[argv.index("--osl") + 1] == str(max(1, round(row.osl)))
        assert int(argv[argv.index("--batch-size") + 1]) == e["batch_per_rank"]
        assert e["seq_per_s"] > 0 and e.get("tpot_ms", 1.0) > 0
    for row_id, est in estimates.items():
        assert est.tok_s_per_gpu > 0 and (est.tok_s_per_user is None or est.tok_s_per_user > 0), row_id


def test_peer_throughput_counts_the_rows_tokens(fidelity) -> None:
    _, rows = fidelity.load_table(fidelity.TABLE)
    total = next(r for r in rows if r.counts == "total")
    output = next(r for r in rows if r.counts == "output")
    isl, osl = round(total.isl), round(total.osl)
    figures = {"output_tok_s_per_gpu": 100.0, "seq_per_s": 3.0,
               "command": "aiconfigurator cli estimate --tp 2 --dp 4 --batch-size 8"}
    assert fidelity.peer_throughput(figures, total) == pytest.approx(3.0 * (isl + osl) / 8)  # 8 GPUs
    assert fidelity.peer_throughput(figures, output) == 100.0


def test_rows_map_onto_aiconfigurator_flags(fidelity, runs, tmp_path: Path) -> None:
    _, rows = fidelity.load_table(fidelity.TABLE)
    by_id = {r.id: r for r in rows}
    shipped = {"Qwen/Qwen3-8B", "MiniMaxAI/MiniMax-M2.5"}
    dep2 = runs.plan(by_id["dsr1fp4-gb300-2k1k"], shipped)  # DP2 + EP, the peak of a sweep up to 1000 clients
    args = list(dep2.args)
    assert args[args.index("--dp") + 1] == "2" and args[args.index("--moe-ep-size") + 1] == "2"
    assert args[args.index("--model") + 1] == "benchmarks/data/models/deepseek-r1-0528-nvfp4"  # not shipped
    # per attention-DP rank: the ladder up to 1000 clients (its top, 768, is 384 on each of 2 ranks)
    assert max(dep2.batches) == 384 and 1 in dep2.batches
    tep = runs.plan(by_id["minimaxm25-fp8-h100-tep8-c4"], shipped)
    args = list(tep.args)
    assert args[args.index("--model") + 1] == "MiniMaxAI/MiniMax-M2.5"
    assert args[args.index("--moe-ep-size") + 1] == "8" and "--dp" not in args
    assert tep.batches == (4,)
    fp8 = runs.plan(by_id["minimaxm25-fp8-b200-tp2-c4"], shipped)
    assert "--kvcache-quant-mode" in fp8.args and fp8.args[fp8.args.index("--ctx-tokens") + 1] == "16384"
    assert runs.plan(by_id["q3next-b200-c256"], shipped).why  # Qwen3-Next: not an aiconfigurator architecture
