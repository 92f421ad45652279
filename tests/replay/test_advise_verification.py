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
