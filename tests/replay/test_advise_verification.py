"""`advise(..., replay_verify=True)`: the replay checks the fronts' best deployments and decides the one to run."""

from __future__ import annotations

from pathlib import Path

from tuner.advise import AdviseRequest, Sla, advise
from tuner.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
DENSE = str(ROOT / "examples/models/llama-3.1-70b")


def test_the_replay_decides_the_deployment_at_a_rate() -> None:
    request = AdviseRequest(model=DENSE, hardware="h200", gpus=32, request_rate=6.0,
                            workload=Workload.fixed(2000, 200, concurrency=(1,)),
                            sla=Sla(max_ttft_ms=1000, max_itl_ms=40), replay_verify=True)
    advice = advise(request)
    verification = advice.verification
    assert verification is not None and verification.checked
    # candidates go by fewest GPUs: none checked before the choice met the SLA, and the choice does
    gpus = [v.report.num_gpus for v in verification.checked]
    assert gpus == sorted(gpus)
    choice = verification.choice
    assert choice is not None and choice.meets_sla
    assert choice.report.ttft_ms.p90 <= 1000 and choice.report.itl_ms.p90 <= 40 and not choice.report.queue.grows
    assert all(not v.meets_sla for v in verification.checked[:-1])
    assert advice.operating_deployment == choice.candidate.deployment
    body = advice.as_json()["replay_verification"]
    assert body["choice"]["num_gpus"] == choice.report.num_gpus


def test_without_replay_verify_the_answer_is_unchanged() -> None:
    request = AdviseRequest(model=DENSE, hardware="h200", gpus=32, request_rate=6.0,
                            workload=Workload.fixed(2000, 200, concurrency=(1,)),
                            sla=Sla(max_ttft_ms=1000, max_itl_ms=40))
    advice = advise(request)
    assert advice.verification is None and "replay_verification" not in advice.as_json()


def test_frontier_replay_verify_carries_the_replay_choice_to_the_plan(capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`frontier --replay-verify --json`: the recommendation's operating point is the deployment the replay kept
    (not the analytic winner it may have refused), and `plan --from` deploys exactly that."""
    import json

    from tuner.cli import main

    repo = Path(__file__).resolve().parents[2]
    assert main(["frontier", str(repo / "examples/models/llama-3.1-70b"), "-g", "h200", "--gpus", "16",
                 "--workload", str(repo / "examples/traces/chat-multiturn.jsonl"), "--request-rate", "4",
                 "--max-ttft-ms", "1000", "--max-itl-ms", "40", "--replay-verify", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    choice = out["replay_verification"]["choice"]
    assert choice is not None and choice["meets_sla"]
    point = out["recommendation"]["operating_point"]
    assert point["source"] == "frontier (replay-verified)"
    groups = point["deployment"]["groups"]
    assert sum(g["count"] * g["topology"]["tp"] * g["topology"]["dp"] for g in groups) == choice["num_gpus"]
    assert [g["topology"]["max_num_seqs"] for g in groups] == choice["max_num_seqs"]
    (tmp_path / "r.json").write_text(json.dumps(out))
    assert main(["plan", "--from", str(tmp_path / "r.json"), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["operating_point"]["deployment"] == point["deployment"]
