"""A simulated trial under the study's SLA reports its latencies and SLA attainment from the replay (#45): each
request counted against both bounds, what the study's SLA constraint and goodput then read."""

from __future__ import annotations

from pathlib import Path

from tuner.backends import SimulatedBackend, TrialRequest
from tuner.deployment import Deployment
from tuner.space import StudyConstraints
from tuner.topology import Role, Topology
from tuner.workload import Workload

LLAMA = str(Path(__file__).resolve().parents[2] / "examples/models/llama-3.1-70b")
TRAFFIC = Workload.model_validate({
    "input_tokens": {"distribution": "lognormal", "mean": 2000, "stddev": 1500, "max_tokens": 16000},
    "output_tokens": {"distribution": "normal", "mean": 300, "stddev": 100}, "concurrency": (8, 64)})


def _request(role: Role, **sla: float) -> TrialRequest:
    topo = Topology.parse("TP8", role=role)
    return TrialRequest(trial_id="t", model_path=LLAMA, gpu="h200", deployment=Deployment.single(topo),
                        workload=TRAFFIC, **sla)


def test_an_aggregated_trial_under_an_sla_reports_the_replays_attainment() -> None:
    result = SimulatedBackend().run(_request(Role.BOTH, max_ttft_ms=400, max_itl_ms=30))
    analytic = SimulatedBackend(replay=False).run(_request(Role.BOTH, max_ttft_ms=400, max_itl_ms=30))
    constraints = StudyConstraints(max_ttft_ms=400, max_itl_ms=30)
    for point, steady in zip(result.points, analytic.points, strict=True):
        share = point.replayed_sla_attainment
        assert share is not None and 0.0 <= share <= 1.0
        assert constraints.judge(point).sla_attainment == share  # the study reads the replay's count
        assert point.ttft_ms_sketch and point.itl_ms_sketch
        assert point.request_throughput_rps == steady.request_throughput_rps  # rates stay the model's
    # more clients queue more prompts: fewer requests within 400 ms TTFT
    low, high = result.points
    assert high.replayed_sla_attainment < low.replayed_sla_attainment  # type: ignore[operator]


def test_no_sla_or_a_phase_trial_keeps_the_analytic_figures() -> None:
    free = SimulatedBackend().run(_request(Role.BOTH))
    prefill = SimulatedBackend().run(_request(Role.PREFILL, max_ttft_ms=400))
    assert all(p.replayed_sla_attainment is None for p in (*free.points, *prefill.points))
    assert free.points == SimulatedBackend(replay=False).run(_request(Role.BOTH)).points
