"""The workload layer of the performance model: a fixed workload keeps today's figures; a mix spreads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.hardware import get_gpu
from tuner.models import ModelSpec
from tuner.perf import RooflineModel, predict_traffic
from tuner.topology import Role, Topology
from tuner.workload import Workload

MIX = {"input_tokens": {"distribution": "lognormal", "mean": 2000, "stddev": 1500},
       "output_tokens": {"distribution": "normal", "mean": 300, "stddev": 100}}


@pytest.fixture(scope="module")
def perf(reference: ModelSpec) -> RooflineModel:
    return RooflineModel(reference, get_gpu("gb300"))


@pytest.mark.parametrize("role", [Role.PREFILL, Role.DECODE, Role.BOTH])
def test_fixed_workload_gives_the_single_shape_figures(perf: RooflineModel, role: Role) -> None:
    """--isl/--osl are the shorthand of a fixed workload: every rate and mean is the single-shape model's."""
    topo = Topology.parse("TEP8", role=role)
    levels = (1, 8, 64, 256)
    osl = 1 if role is Role.PREFILL else 1024
    before = perf.predict_curve(topo, role, isl=8192, osl=osl, concurrencies=levels)
    after = predict_traffic(perf, topo, role, Workload.fixed(8192, 1024, levels)).points
    for b, a in zip(before, after, strict=True):
        for name in ("total_tok_s_per_gpu", "output_tok_s_per_gpu", "tok_s_per_user", "ttft_ms_mean", "ttft_ms_p50",
                     "itl_ms_mean", "request_throughput_rps", "running_requests"):
            assert getattr(a, name) == getattr(b, name), name
        assert a.ttft_ms_p90 == a.ttft_ms_p99 == a.ttft_ms_p50  # every request alike
        if role is not Role.BOTH:
            assert a.itl_ms_p99 == a.itl_ms_p50


def test_aggregated_itl_tail_is_the_prefill_interference(perf: RooflineModel) -> None:
    """Steps that carry a prefill chunk are longer; a request sees Binomial(steps, share) of them, so the ITL tail
    exists in an aggregated instance (p99 > p50) and not in a PD decode instance."""
    both = predict_traffic(perf, Topology.parse("TEP8", role=Role.BOTH), Role.BOTH, Workload(**MIX, concurrency=(64,)))
    decode = predict_traffic(perf, Topology.parse("TEP8", role=Role.DECODE), Role.DECODE,
                             Workload(**MIX, concurrency=(64,)))
    assert both.points[0].itl_ms_p99 > both.points[0].itl_ms_p50
    assert decode.points[0].itl_ms_p99 == decode.points[0].itl_ms_p50


def test_length_mix_spreads_ttft(perf: RooflineModel) -> None:
    topo = Topology.parse("TEP8", role=Role.PREFILL)
    m = predict_traffic(perf, topo, Role.PREFILL, Workload(**MIX, concurrency=(8,))).points[0]
    assert m.ttft_ms_p50 < m.ttft_ms_at("p90") < m.ttft_ms_p99
    assert list(m.ttft_ms_sketch) == sorted(m.ttft_ms_sketch) and len(m.ttft_ms_sketch) == 20
    assert m.share_within(max_ttft_ms=m.ttft_ms_at("p90")) == pytest.approx(0.9, abs=0.01)
    assert m.isl == round(Workload(**MIX).input_tokens.expected)  # the typical prompt the step model prices


def test_open_loop_queues_and_saturates(perf: RooflineModel) -> None:
    topo = Topology.parse("TEP8", role=Role.BOTH)
    curve = predict_traffic(perf, topo, Role.BOTH, Workload(**MIX, arrival="poisson",
                                                            request_rates=(0.5, 4.0, 8.0, 1000.0)))
    assert [p.offered_rps for p in curve.points] == [0.5, 4.0, 8.0]
    assert [s.offered_rps for s in curve.saturated] == [1000.0]  # no latency is printed for it
    assert all(p.request_throughput_rps == p.offered_rps for p in curve.points)  # a stable level serves its load
    p99 = [p.ttft_ms_p99 for p in curve.points]
    assert p99 == sorted(p99) and p99[-1] > p99[0]  # the queue's tail grows with the load
    assert curve.saturated[0].capacity_rps > 8.0


def test_prefix_cache_hits_cut_prefill_work(perf: RooflineModel, tmp_path: Path) -> None:
    """Prompts sharing a 7,680-token prefix (15 of 16 blocks): the prefill instance serves them faster."""
    rows = [{"input_length": 8192, "output_length": 64, "hash_ids": [*range(15), 100 + i]} for i in range(200)]
    trace = tmp_path / "shared.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    topo = Topology.parse("TEP8", role=Role.PREFILL)
    shared = predict_traffic(perf, topo, Role.PREFILL, Workload.from_trace(trace, concurrency=(16,))).points[0]
    cold = predict_traffic(perf, topo, Role.PREFILL, Workload.fixed(8192, 64, (16,))).points[0]
    assert shared.prefix_hit_share == pytest.approx(199 * 7680 / (200 * 8192))
    assert shared.request_throughput_rps > 5 * cold.request_throughput_rps
    assert shared.ttft_ms_p50 < cold.ttft_ms_p50
