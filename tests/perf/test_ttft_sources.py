"""benchmarks/ttft_sources.py (why the replayed TTFT p50 misses held out by source): the prefill-speed scale it
solves for reproduces the figure it was solved on, and the typical prompt it splits is the length mix's median.
Nothing here fits a class or replays (the benchmark does)."""

from __future__ import annotations

import math

import pytest
from _support.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def ts():
    load_benchmark("fidelity")
    load_benchmark("workload_fidelity")
    return load_benchmark("ttft_sources")


def test_solved_prefill_scale_reproduces_the_measured_throughput(ts) -> None:
    """The scale s on prefill compute found for a long-prompt burst makes the model predict the burst's measured
    tok/s/GPU, and a faster prefill predicts more tok/s (the bisection's premise)."""
    _, rows = ts.fidelity.load_table(ts.fidelity.TABLE)
    row = next(r for r in rows if r.id == "q14b-h100-32k")
    replayer = ts.fidelity.Replayer()
    cal = ts.fidelity.PRIORS["hopper"]

    def inverse_tput(c):
        return 1.0 / replayer.predict(row, c).tok_s_per_gpu

    s = ts._solve(inverse_tput, 1.0 / row.tok_s_per_gpu, cal)
    assert 0.2 < s < 6.0
    scaled = cal.model_copy(update={n: cal.factor(n) * s for n in ts.SCALED})
    assert replayer.predict(row, scaled).tok_s_per_gpu == pytest.approx(row.tok_s_per_gpu, rel=5e-3)
    faster = cal.model_copy(update={n: cal.factor(n) * s * 1.2 for n in ts.SCALED})
    assert replayer.predict(row, faster).tok_s_per_gpu > row.tok_s_per_gpu


def test_solve_says_nan_when_no_scale_in_range_reaches_the_figure(ts) -> None:
    cal = ts.fidelity.PRIORS["hopper"]
    assert math.isnan(ts._solve(lambda c: 1.0, 2.0, cal))


def test_typical_prompt_is_the_mix_median(ts) -> None:
    """ShareGPT's prompts are replayed lognormal with CV 1, whose median is the mean / sqrt(2); fixed prompts are
    their nominal length."""
    assert ts._typical_isl({"workload": {"isl_mean": 232.6}}) == round(232.6 / math.sqrt(2))
    assert ts._typical_isl({"workload": {"isl_nominal": 20000}}) == 20000
    assert all(r["engine"] == "vllm" and r["load"]["kind"] == "closed" for r in ts.ttft_rows())
