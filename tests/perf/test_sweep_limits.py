"""The fast frontier: a sweep that stops each ladder at its first level past the SLA gives the fronts and the
recommendation of the exhaustive sweep, from fewer predicted points."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.frontier import Constraints, combined_front, compose_aggregated, compose_disaggregated, pareto_front
from tuner.hardware import get_gpu
from tuner.models import ModelSpec
from tuner.perf import Curves, LevelLimits, RooflineModel, candidate_topologies, sweep_curves
from tuner.workload import Workload

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO / "examples" / "traces" / "chat-multiturn.jsonl"


def _fronts(curves: Curves, c: Constraints) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    """Both fronts as plain tuples (deployment, per-GPU rate, per-user rate, latencies at the percentile)."""
    pd = combined_front(compose_disaggregated(curves.prefill, curves.decode, c))
    agg = pareto_front(compose_aggregated(curves.aggregated, c), x="total_tok_s_per_gpu", y="tok_s_per_user")
    return ([(p.name, p.num_gpus, p.total_tok_s_per_gpu, p.tok_s_per_user, p.ttft_ms, p.itl_ms) for p in pd],
            [(p.name, p.num_gpus, p.total_tok_s_per_gpu, p.tok_s_per_user, p.ttft_ms, p.itl_ms) for p in agg])


def _sweeps(model: ModelSpec, gpu: str, workload: Workload, limits: LevelLimits, depths: tuple[int, ...],
            gpus: int) -> tuple[Curves, Curves]:
    perf = RooflineModel(model, get_gpu(gpu))
    topologies = candidate_topologies(perf, gpus, mtp_depths=depths)
    kwargs = {"isl": workload.isl, "osl": workload.osl, "prefill_mtp_depths": depths,
              "aggregated_mtp_depths": depths, "workload": workload}
    return (sweep_curves(perf, topologies, **kwargs),  # type: ignore[arg-type]
            sweep_curves(perf, topologies, limits=limits, **kwargs))  # type: ignore[arg-type]


@pytest.mark.parametrize(("case", "limits"), [
    ("reference-trace", LevelLimits(max_ttft_ms=1000, max_itl_ms=30, percentile="p90")),
    ("reference-fixed", LevelLimits(max_ttft_ms=2000, max_itl_ms=50, min_tok_s_per_user=40, percentile="p99")),
    ("dense-lognormal", LevelLimits(max_ttft_ms=1500, max_itl_ms=40, percentile="p50")),
])
def test_sla_limited_sweep_gives_the_exhaustive_fronts(request: pytest.FixtureRequest, case: str,
                                                       limits: LevelLimits) -> None:
    if case.startswith("reference"):
        model, gpu, gpus, depths = request.getfixturevalue("reference"), "gb300", 72, (0, 2)
    else:
        model, gpu, gpus, depths = request.getfixturevalue("dense"), "h200", 16, (0,)
    workload = {"reference-trace": lambda: Workload.from_trace(TRACE),
                "reference-fixed": lambda: Workload.fixed(8192, 1024),
                "dense-lognormal": lambda: Workload.model_validate({
                    "input_tokens": {"distribution": "lognormal", "mean": 3000, "stddev": 2000},
                    "output_tokens": {"distribution": "normal", "mean": 400, "stddev": 150}})}[case]()
    full, fast = _sweeps(model, gpu, workload, limits, depths, gpus)
    constraints = Constraints(max_gpus=gpus, max_ttft_ms=limits.max_ttft_ms, max_itl_ms=limits.max_itl_ms,
                              min_tok_s_per_user=limits.min_tok_s_per_user,
                              percentile=limits.percentile)  # type: ignore[arg-type]
    assert fast.num_points < 0.9 * full.num_points  # the SLA removed levels before they were predicted
    pd, agg = _fronts(full, constraints)
    assert pd and agg  # both modes have points under these SLAs: the comparison says something
    assert _fronts(fast, constraints) == (pd, agg)
    # the recommendation is each front's throughput end: the same deployment, the same figures
    assert max(pd, key=lambda p: p[2]) == max(_fronts(fast, constraints)[0], key=lambda p: p[2])


def test_no_limits_predicts_every_level(reference: ModelSpec) -> None:
    """Without a bound nothing is cut: the same points as a sweep without limits."""
    perf = RooflineModel(reference, get_gpu("gb300"))
    topologies = candidate_topologies(perf, 16)
    plain = sweep_curves(perf, topologies, isl=8192, osl=1024)
    unbounded = sweep_curves(perf, topologies, isl=8192, osl=1024, limits=LevelLimits())
    assert unbounded.num_points == plain.num_points
    assert [m for _, m in unbounded.decode] == [m for _, m in plain.decode]
