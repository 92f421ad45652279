"""A burst of N prompts sent at once (vllm bench serve --request-rate inf): admission, then a decode-only tail."""

from __future__ import annotations

import pytest

from tuner.errors import ConfigError
from tuner.hardware import GpuSpec
from tuner.models import ModelSpec
from tuner.perf import RooflineModel, default_calibration
from tuner.topology import Role, Topology

TOPO = Topology.parse("TP4", gpu_memory_utilization=0.9, max_num_seqs=1024, max_num_batched_tokens=8192)


@pytest.fixture(scope="module")
def perf(dense: ModelSpec, gb300: GpuSpec) -> RooflineModel:
    return RooflineModel(dense, gb300, default_calibration("gb300"))


def test_a_queued_burst_lasts_longer_than_its_steady_state(perf: RooflineModel) -> None:
    """500 prompts of 2K / 100 queue for the token budget: the run is the admission at the steady state's pace
    plus the tail where the last requests decode alone, so throughput is below the steady state's and the mean
    TPOT (tail steps are short) below the steady mean step."""
    point = perf.aggregated_point(TOPO, 500, isl=2000, osl=100)
    run = perf.burst_run(TOPO, 500, isl=2000, osl=100)
    assert run.admission_steps >= 500 * 2000 / 8192 - 1e-9  # the token budget bounds how fast prompts enter
    assert run.tail_steps == pytest.approx(point.decode_steps) and run.flat_steps == 0
    assert run.tail_step_ms < point.mean_step_ms
    assert run.duration_ms == pytest.approx(run.admission_steps * point.mean_step_ms
                                            + run.tail_steps * run.tail_step_ms)
    steady = perf.predict(TOPO, Role.BOTH, isl=2000, osl=100, concurrency=500)
    burst = perf.predict_burst(TOPO, isl=2000, osl=100, prompts=500)
    assert burst.total_tok_s_per_gpu < steady.total_tok_s_per_gpu
    assert burst.tok_s_per_user > steady.tok_s_per_user
    assert burst.total_tok_s_per_gpu == pytest.approx(500 * 2100 / (run.duration_ms / 1e3) / 4)


def test_a_burst_that_fits_at_once_decodes_together(perf: RooflineModel) -> None:
    """100 prompts of 1K / 2K enter within a few budget-sized steps, decode together, then finish together."""
    run = perf.burst_run(TOPO, 100, isl=1000, osl=2000)
    assert run.admission_steps == pytest.approx(100 * 1000 / (8192 - 50))  # half the burst decodes meanwhile
    assert run.flat_steps == pytest.approx(run.decode_steps - run.admission_steps)
    assert run.tail_peak == 100
    # nearly every decode step carries all 100 requests: the TPOT is close to the 100-request decode step
    assert run.tpot_ms == pytest.approx(run.flat_step_ms, rel=0.05)


def test_decode_tokens_are_conserved(perf: RooflineModel) -> None:
    for prompts, isl, osl in ((500, 2000, 100), (100, 1000, 2000), (40, 32000, 100)):
        run = perf.burst_run(TOPO, prompts, isl=isl, osl=osl)
        peak = run.tail_peak
        decoded = (run.admission_decoding * run.admission_steps + run.prompts * run.flat_steps
                   + peak * run.tail_steps / 2)
        assert decoded == pytest.approx(run.prompts * run.decode_steps, rel=1e-9)


def test_bad_burst_is_refused(perf: RooflineModel) -> None:
    with pytest.raises(ConfigError):
        perf.predict_burst(TOPO, isl=2000, osl=100, prompts=0)


def test_a_kv_bound_burst_enters_at_the_steady_rate(perf: RooflineModel) -> None:
    """When the KV cache holds fewer requests than the burst, prompts enter as running ones finish."""
    state = perf.state(TOPO, Role.BOTH, isl=32000, osl=100)
    prompts = 4 * perf.running_cap(state)
    point = perf.aggregated_point(TOPO, prompts, isl=32000, osl=100)
    run = perf.burst_run(TOPO, prompts, isl=32000, osl=100)
    assert point.running_per_rank < prompts
    assert run.admission_steps == pytest.approx(prompts / point.starts_per_step)
    assert run.admission_step_ms == point.mean_step_ms
