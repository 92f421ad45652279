"""Pareto fronts, hypervolume, xPyD composition and its errors; the GB300 reference calibration."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuner.backends.vllm import PairingContext, launch_rules, pairing_predicate
from tuner.frontier import (
    Constraints,
    InfeasibleError,
    combined_front,
    compose_disaggregated,
    compose_rate_aggregated,
    compose_rate_disaggregated,
    family_fronts,
    hypervolume_2d,
    pareto_front,
)
from tuner.hardware import get_gpu
from tuner.metrics import ServingMetrics
from tuner.models import load_model
from tuner.perf import RooflineModel, candidate_topologies, sweep_curves
from tuner.topology import Role, Topology

ISL, OSL = 8192, 1024


def _m(*, rps: float, ttft: float, itl: float, conc: int = 1, gpus: int = 8, osl: int = OSL) -> ServingMetrics:
    return ServingMetrics.from_rates(concurrency=conc, num_gpus=gpus, isl=ISL, osl=osl, request_rps=rps,
                                     ttft_ms=ttft, itl_ms=itl, max_concurrency=100, running=conc)


# -- pareto and hypervolume -------------------------------------------------------------------------------
def test_pareto_front_hand_case() -> None:
    pts = [(1.0, 5.0), (2.0, 4.0), (2.0, 3.0), (3.0, 1.0), (0.5, 0.5), (3.0, 0.5)]
    front = pareto_front(pts, x=lambda p: p[0], y=lambda p: p[1])
    assert front == [(1.0, 5.0), (2.0, 4.0), (3.0, 1.0)]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), min_size=1, max_size=40))
def test_pareto_front_properties(pts: list[tuple[int, int]]) -> None:
    front = pareto_front(pts, x=lambda p: p[0], y=lambda p: p[1])

    def dominates(a: tuple[int, int], b: tuple[int, int]) -> bool:
        return a[0] >= b[0] and a[1] >= b[1] and a != b

    assert all(not dominates(p, f) for f in front for p in pts)  # nothing beats a front point
    assert all(any(dominates(f, p) or f == p for f in front) for p in pts)  # every point is covered
    assert [f[0] for f in front] == sorted(f[0] for f in front)


def test_hypervolume_hand_cases() -> None:
    assert hypervolume_2d([(2.0, 3.0)], (0.0, 0.0)) == pytest.approx(6.0)
    assert hypervolume_2d([(1.0, 3.0), (3.0, 1.0)], (0.0, 0.0)) == pytest.approx(5.0)
    assert hypervolume_2d([(1.0, 3.0), (3.0, 1.0), (0.5, 0.5)], (0.0, 0.0)) == pytest.approx(5.0)
    assert hypervolume_2d([(1.0, 1.0)], (2.0, 0.0)) == 0.0


# -- composition ----------------------------------------------------------------------------------------
def _curves() -> tuple[list[tuple[Topology, ServingMetrics]], list[tuple[Topology, ServingMetrics]]]:
    prefill = [(Topology.parse("TP8", role=Role.PREFILL), _m(rps=2.0, ttft=100.0, itl=0.0, osl=1)),
               (Topology.parse("TP4", role=Role.PREFILL), _m(rps=0.8, ttft=300.0, itl=0.0, osl=1, gpus=4))]
    decode = [(Topology.parse("TP8", role=Role.DECODE), _m(rps=1.0, ttft=5.0, itl=10.0, conc=16)),
              (Topology.parse("TP8", role=Role.DECODE), _m(rps=3.0, ttft=8.0, itl=40.0, conc=256))]
    return prefill, decode


def test_compose_picks_fewest_gpus_that_cover_decode_rate() -> None:
    prefill, decode = _curves()
    points = compose_disaggregated(prefill, decode, Constraints(max_gpus=40))
    fast = [p for p in points if p.decode.concurrency == 16]
    one = next(p for p in fast if p.num_decode == 1)
    # 1 decode at 1 rps: TP4 at 0.8 rps needs 2 (8 GPUs), TP8 at 2 rps needs 1 (8 GPUs): tie -> lower TTFT
    assert (one.num_prefill, one.prefill_topology.name, one.num_gpus) == (1, "TP8", 16)
    assert one.total_tok_s_per_gpu == pytest.approx(1.0 * (ISL + OSL) / 16)
    assert one.tok_s_per_user == pytest.approx(100.0) and one.ttft_ms == pytest.approx(105.0)
    three = next(p for p in fast if p.num_decode == 3)  # 3 rps: 2 x TP8 (16 GPUs) beats 4 x TP4 (16) on TTFT
    assert (three.num_prefill, three.num_gpus) == (2, 40)
    assert three.deployment.is_disaggregated and three.deployment.num_gpus == 40
    assert three.name == "2P(TP8) 3D(TP8)"
    assert three.metrics.total_tok_s_per_gpu == pytest.approx(three.total_tok_s_per_gpu)
    assert three.metrics.concurrency == 48 and three.metrics.ttft_ms_p50 == pytest.approx(105.0)
    assert all(p.num_gpus <= 40 for p in points)


def test_combined_front_and_families() -> None:
    prefill, decode = _curves()
    points = compose_disaggregated(prefill, decode, Constraints(max_gpus=72))
    front = combined_front(points)
    assert front[0].tok_s_per_user == pytest.approx(100.0)  # latency end first: the ITL-10 decode point
    assert front[-1].total_tok_s_per_gpu == max(p.total_tok_s_per_gpu for p in points)
    families = family_fronts(points)
    assert set(families) == {p.family for p in points} and "TP8 -> TP8" in families
    assert all(len(curve) <= len([p for p in points if p.family == name]) for name, curve in families.items())


def test_constraints_name_what_removed_everything() -> None:
    prefill, decode = _curves()
    with pytest.raises(InfeasibleError, match=r"no prefill point meets TTFT <= 50 ms \(p90\); the best TTFT is 100"):
        compose_disaggregated(prefill, decode, Constraints(max_gpus=72, max_ttft_ms=50))
    with pytest.raises(InfeasibleError, match=r"no decode point meets ITL <= 5 ms .*best ITL is 10.0") as info:
        compose_disaggregated(prefill, decode, Constraints(max_gpus=72, max_itl_ms=5))
    assert info.value.field == "sla.max_itl_ms"  # the request field; the CLI maps it to --max-itl-ms
    with pytest.raises(InfeasibleError, match="smallest 1P1D pair needs 12 GPUs") as info:
        compose_disaggregated(prefill, decode, Constraints(max_gpus=10))
    assert info.value.field == "gpus"
    with pytest.raises(InfeasibleError, match="once the decode side"):
        compose_disaggregated(prefill, decode, Constraints(max_gpus=72, max_ttft_ms=102))
    with pytest.raises(InfeasibleError, match="pairs"):
        compose_disaggregated(prefill[1:], decode, Constraints(max_gpus=72, pairing=_same_tp))
    with pytest.raises(InfeasibleError, match="no prefill point"):
        compose_disaggregated([], decode, Constraints(max_gpus=72))


def test_itl_limit_keeps_only_fast_decode_and_p99_is_used() -> None:
    prefill, decode = _curves()
    points = compose_disaggregated(prefill, decode, Constraints(max_gpus=72, max_itl_ms=20))
    assert {p.decode.concurrency for p in points} == {16}
    slow_tail = [(t, m.model_copy(update={"itl_ms_p99": 50.0})) for t, m in decode]
    with pytest.raises(InfeasibleError):
        compose_disaggregated(prefill, slow_tail, Constraints(max_gpus=72, max_itl_ms=20, percentile="p99"))


def _same_tp(prefill: Topology, decode: Topology) -> str | None:
    return None if prefill.tp == decode.tp else "tp: prefill and decode TP differ"


# -- the GB300 reference calibration ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def reference_front(reference_model_path: Path) -> tuple[RooflineModel, list]:
    """The reference model's combined PD front on 72 GB300, swept once for the tests that read it."""
    perf = RooflineModel(load_model(reference_model_path), get_gpu("gb300"))
    # EP over DP on the rack's routed all-to-all, as the reference space sets (search_spaces/gb300-nvl72-8k1k.yaml)
    topologies = candidate_topologies(perf, 72, mtp_depths=(0, 1, 2, 3), all2all_backend="flashinfer_nvlink_one_sided")
    curves = sweep_curves(perf, topologies, isl=ISL, osl=OSL, prefill_mtp_depths=(0, 1, 2, 3))
    pairing = pairing_predicate(launch_rules(), PairingContext(model=perf.model, architecture="blackwell"))
    return perf, combined_front(compose_disaggregated(curves.prefill, curves.decode,
                                                      Constraints(max_gpus=72, pairing=pairing)))


def test_reference_frontier_matches_the_campaign(reference_front: tuple[RooflineModel, list]) -> None:
    """Published: ~5,000 total tok/s/GPU at the throughput end, ~180 tok/s/user at the latency end."""
    _, front = reference_front
    throughput_end = max(p.total_tok_s_per_gpu for p in front)
    latency_end = max(p.tok_s_per_user for p in front)
    assert throughput_end == pytest.approx(5000, rel=0.25)
    assert latency_end == pytest.approx(180, rel=0.25)


def test_reference_sweeps_keep_who_wins_where(reference_front: tuple[RooflineModel, list]) -> None:
    """The campaign's lessons (reference-deployment.md) still hold in the model's sweeps."""
    perf, front = reference_front
    by_speed = sorted(front, key=lambda p: p.tok_s_per_user)
    # throughput end: wide decode replicas with expert parallelism over DP ranks (KV headroom)
    assert by_speed[0].decode_topology.ep and by_speed[0].decode_topology.dp >= 8
    # latency end: pure tensor parallelism with MTP
    assert by_speed[-1].decode_topology.dp == 1 and by_speed[-1].decode_topology.mtp >= 1
    # prefill and decode want different topologies somewhere on the front
    assert any(p.prefill_topology.name != p.decode_topology.name for p in front)
    # MTP raises decode throughput while the KV cache is not full
    plain, mtp = Topology.parse("TEP8"), Topology.parse("TEP8", mtp=3)
    low = [perf.predict(t, Role.DECODE, isl=ISL, osl=OSL, concurrency=8).output_tok_s_per_gpu for t in (plain, mtp)]
    assert low[1] > low[0]
    # more GPUs per replica leaves more KV cache per GPU
    small = perf.capacity(Topology.parse("TP2DP4+EP"), Role.DECODE, isl=ISL, osl=OSL) / 8
    big = perf.capacity(Topology.parse("TP4DP4+EP"), Role.DECODE, isl=ISL, osl=OSL) / 16
    assert big > small


# -- open loop: one offered rate ----------------------------------------------------------------------------
def test_rate_composition_picks_the_fewest_gpus_that_carry_the_rate_under_the_sla() -> None:
    """Every count shares the one rate (2 req/s); the prefill side with the fewest GPUs that meets the TTFT bound
    is chosen, tok/s/GPU is the offered rate over the GPUs, and the front trades GPUs for tok/s/user."""
    tp4, tp8 = Topology.parse("TP4", role=Role.PREFILL), Topology.parse("TP8", role=Role.PREFILL)
    d8 = Topology.parse("TP8", role=Role.DECODE)
    prefill = [(tp4, 1, _m(rps=2.0, ttft=900.0, itl=0.0, gpus=4)), (tp4, 2, _m(rps=1.0, ttft=300.0, itl=0.0, gpus=4)),
               (tp8, 1, _m(rps=2.0, ttft=250.0, itl=0.0))]
    decode = [(d8, 1, _m(rps=2.0, ttft=20.0, itl=25.0)), (d8, 2, _m(rps=1.0, ttft=10.0, itl=12.0))]
    sla = Constraints(max_gpus=32, max_ttft_ms=500.0, max_itl_ms=30.0)
    points = compose_rate_disaggregated(prefill, decode, sla, offered_rps=2.0)
    one = next(p for p in points if p.num_decode == 1)
    # 1 x TP4 (4 GPUs) breaks TTFT <= 500; 2 x TP4 and 1 x TP8 both take 8 GPUs: the lower TTFT (TP8) wins the tie
    assert (one.prefill_topology.name, one.num_prefill, one.num_gpus) == ("TP8", 1, 16)
    assert one.total_tok_s_per_gpu == pytest.approx(2.0 * (ISL + OSL) / 16)
    assert one.ttft_ms == pytest.approx(270.0) and one.tok_s_per_user == pytest.approx(40.0)
    two = next(p for p in points if p.num_decode == 2)
    assert two.num_gpus == 24 and two.total_tok_s_per_gpu == pytest.approx(2.0 * (ISL + OSL) / 24)
    front = combined_front(points)
    assert [p.num_gpus for p in front] == [24, 16]  # latency end first: more GPUs buy tok/s/user
    no_sla = compose_rate_disaggregated(prefill, decode, Constraints(max_gpus=15), offered_rps=2.0)
    assert [(p.num_prefill, p.prefill_topology.name, p.num_gpus) for p in no_sla] == [(1, "TP4", 12)]
    assert compose_rate_disaggregated(prefill, decode, Constraints(max_gpus=11), offered_rps=2.0) == []
    assert compose_rate_disaggregated(prefill, decode, Constraints(max_gpus=32, max_itl_ms=10.0),
                                      offered_rps=2.0) == []


def test_rate_aggregation_counts_gpus_and_equal_counts_tie_exactly() -> None:
    tp8, tep8 = Topology.parse("TP8", role=Role.BOTH), Topology.parse("TEP8", role=Role.BOTH)
    rate = 3.0
    curve = [(tp8, 1, _m(rps=rate, ttft=400.0, itl=20.0)), (tep8, 1, _m(rps=rate * (1 + 1e-12), ttft=450.0, itl=30.0)),
             (tp8, 3, _m(rps=rate / 3, ttft=200.0, itl=10.0))]
    points = compose_rate_aggregated(curve, Constraints(max_gpus=24, max_itl_ms=25.0), offered_rps=rate)
    assert [(p.topology.name, p.num_instances, p.num_gpus) for p in points] == [("TP8", 1, 8), ("TP8", 3, 24)]
    assert points[1].total_tok_s_per_gpu == pytest.approx(rate * (ISL + OSL) / 24)
    every = compose_rate_aggregated(curve, Constraints(max_gpus=24), offered_rps=rate)
    front = pareto_front(every, x="total_tok_s_per_gpu", y="tok_s_per_user")
    # TEP8 on 8 GPUs carries the same rate as TP8 on 8 but slower per user: dominated, even with float noise
    assert [(p.topology.name, p.num_gpus) for p in front] == [("TP8", 24), ("TP8", 8)]
    assert compose_rate_aggregated(curve, Constraints(max_gpus=16, max_ttft_ms=300.0), offered_rps=rate) == []
