"""benchmarks/decode_terms.py (DeepSeek-R1's batch-4 decode step priced term by term, #45): each factor it says
would alone close the gap to a measured ITL does, plugged into the model, price the step at that ITL. Nothing here
fits a class (the benchmark does): the Hopper physics priors stand in for the fit."""

from __future__ import annotations

import pytest
from _support.benchmarks import load_benchmark

from tuner.hardware import get_gpu
from tuner.models import load_model
from tuner.perf import RooflineModel
from tuner.perf._steps import decode_step
from tuner.topology import Role, Topology


@pytest.fixture(scope="module")
def dt():
    load_benchmark("fidelity")
    load_benchmark("workload_fidelity")
    return load_benchmark("decode_terms")


@pytest.mark.parametrize("measured_ms", [18.84, 12.0])
def test_each_implied_factor_reproduces_the_measured_step(dt, measured_ms: float) -> None:
    model = load_model(dt.wf._model_dir("examples/models/deepseek-v3"))
    gpu = get_gpu("h200")
    cal = dt.fidelity.PRIORS["hopper"]
    topo = Topology.parse("TP8", role=Role.BOTH)
    costs = RooflineModel(model, gpu, cal).state(topo, Role.BOTH, isl=1024, osl=128).costs

    def step(c):
        return decode_step(costs, gpu, c, requests_per_rank=4, total_requests=4, context_tokens=335, mtp_depth=0)

    priced = step(cal)
    assert priced.step_ms < measured_ms  # the premise: the model prices this step faster than measured
    factors = dt.implied_factors(costs, gpu, cal, priced, measured_ms)
    for name, value in factors.items():
        assert step(cal.model_copy(update={name: value})).step_ms == pytest.approx(measured_ms, rel=1e-6), name
    assert factors["kernel_latency_us"] > cal.kernel_latency_us
    assert factors["moe_gemm_efficiency"] < cal.moe_gemm_efficiency
    assert factors["hbm_efficiency"] < cal.hbm_efficiency
