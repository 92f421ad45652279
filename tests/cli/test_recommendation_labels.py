"""#46: the recommendation's labels say what happened: a mode not swept says so, a tie is a tie, the winner's
reason is in words, and simulated figures never read "Verified on"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.advise import AdviseRequest, Recommendation, Sla, advise
from tuner.advise._recommend import why_it_wins
from tuner.cli import main
from tuner.cli._perf import _print_recommendation
from tuner.frontier import AggregatedPoint, ComposedPoint, Constraints
from tuner.metrics import ServingMetrics
from tuner.topology import Role, Topology
from tuner.workload import Workload

REPO = Path(__file__).resolve().parents[2]
LLAMA = str(REPO / "examples" / "models" / "llama-3.1-70b")
TRACE = str(REPO / "examples" / "traces" / "chat-multiturn.jsonl")


def _metrics(gpus: int, running: int) -> ServingMetrics:
    return ServingMetrics.from_rates(concurrency=running, num_gpus=gpus, isl=1024, osl=128, request_rps=4.0,
                                     ttft_ms=200.0, itl_ms=30.0, max_concurrency=256, running=running)


def _tie() -> Recommendation:
    tp8 = Topology.parse("TP8", max_num_seqs=256)
    pd = ComposedPoint(prefill_topology=tp8.model_copy(update={"role": Role.PREFILL}), num_prefill=1,
                       decode_topology=tp8.model_copy(update={"role": Role.DECODE}), num_decode=1,
                       prefill=_metrics(8, 8), decode=_metrics(8, 64), num_gpus=16, total_tok_s_per_gpu=1000.0,
                       tok_s_per_user=33.3, ttft_ms=400.0, itl_ms=30.0, family="TP8/TP8")
    agg = AggregatedPoint(topology=tp8, num_instances=2, instance=_metrics(8, 64), num_gpus=16,
                          total_tok_s_per_gpu=1000.0 / 1.004, tok_s_per_user=33.3, ttft_ms=300.0, itl_ms=30.0,
                          family="TP8")
    return Recommendation(pd, agg)


def test_a_tie_is_a_tie(capsys: pytest.CaptureFixture[str]) -> None:
    from dataclasses import replace

    advice = advise(AdviseRequest(model=LLAMA, hardware="h200", gpus=16, sla=Sla(max_itl_ms=40),
                                  workload=Workload.fixed(1024, 128, concurrency=(1,))))
    assert _tie().tie
    _print_recommendation(replace(advice, recommendation=_tie()))
    out = capsys.readouterr().out
    assert "a tie" in out and "wins" not in out and "why: decode-bound" in out


def test_why_names_what_binds() -> None:
    why = why_it_wins(_tie(), Constraints(max_gpus=16, max_itl_ms=40))
    assert why.startswith("decode-bound: ITL 30.0 ms (p90) under the 40 ms limit holds at 64 running requests per "
                          "decode rank only on a dedicated decode TP8")
    # a per-user floor tighter than the ITL bound is the limit that binds: the answer says where it comes from
    floor = why_it_wins(_tie(), Constraints(max_gpus=16, max_itl_ms=40, min_tok_s_per_user=32))
    assert floor.startswith("decode-bound: ITL 30.0 ms (p90) under the 31.25 ms limit (1000 / the 32 tok/s/user floor) "
                            "holds at 64")


def test_a_mode_not_swept_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frontier", LLAMA, "-g", "h200", "--gpus", "16", "--mode", "agg", "--max-itl-ms", "40"]) == 0
    out = capsys.readouterr().out
    assert "best disaggregated: not swept (--mode agg)" in out and "none meets the limits" not in out
    assert "aggregated only: --mode agg" in out and "why: every GPU serves prompts and answers" in out
    assert "Figures: simulated (vLLM 0.32 rules), not measured." in out and "Verified on" not in out


def test_the_json_recommendation_carries_why_and_tie(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["frontier", LLAMA, "-g", "h200", "--gpus", "16", "--workload", TRACE, "--max-itl-ms", "40",
                 "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)["recommendation"]
    assert rec["why"].startswith("decode-bound") and rec["tie"] is False
    assert rec["operating_point"]["measured_on"] == "simulated (vLLM 0.32 rules)"


def test_the_recommended_script_is_never_wrapped(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped (not a terminal), with any COLUMNS: each command is one line a shell runs as meant."""
    import shlex

    monkeypatch.setenv("COLUMNS", "400")
    assert main(["frontier", LLAMA, "-g", "h200", "--gpus", "16", "--workload", TRACE, "--max-itl-ms", "40"]) == 0
    script = capsys.readouterr().out.split("#!/usr/bin/env bash", 1)[1]
    commands = [line for line in script.splitlines() if line and not line.startswith("#")]
    servers = [c for c in commands if " serve " in c]
    assert servers and all(c.endswith(" &") and "--max-model-len" in c for c in servers)
    assert all(len(shlex.split(c)) > 10 for c in servers)  # quotes balanced: the JSON configs stay one word
    assert all(c in ("set -euo pipefail", "wait") or c.endswith(" &") for c in commands)


def test_out_writes_the_recommended_script(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`frontier --out FILE`: the script goes to the file (a bash script, each `vllm serve` one line), not stdout."""
    import shlex
    import subprocess

    monkeypatch.setenv("COLUMNS", "60")
    script = tmp_path / "deploy.sh"
    assert main(["frontier", LLAMA, "-g", "h200", "--gpus", "16", "--workload", TRACE, "--max-itl-ms", "40",
                 "--out", str(script)]) == 0
    captured = capsys.readouterr()
    assert "#!/usr/bin/env bash" not in captured.out and "Recommendation" in captured.out
    assert f"script written to {script}" in " ".join(captured.err.split())
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and text.endswith("wait\n")
    servers = [line for line in text.splitlines() if " serve " in line and not line.startswith("#")]
    assert servers and all(s.endswith(" &") and "--max-model-len" in s and len(shlex.split(s)) > 10
                           for s in servers)
    assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
