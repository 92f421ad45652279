"""Fitting calibration factors: synthetic measurements from known factors must be recovered."""

from __future__ import annotations

import pytest

from tuner.errors import ConfigError
from tuner.hardware import GpuSpec
from tuner.models import ModelSpec
from tuner.perf import MeasuredPoint, RooflineModel, default_calibration, fit_calibration, mean_relative_error
from tuner.topology import Role, Topology

TRUE_FACTORS = {"hbm_efficiency": 0.72, "prefill_flop_efficiency": 0.55, "kernel_latency_us": 2.5,
                "mtp_acceptance": 0.6}


def _measurements(model: ModelSpec, gpu: GpuSpec) -> list[MeasuredPoint]:
    truth = RooflineModel(model, gpu, default_calibration("gb300").model_copy(update=TRUE_FACTORS))
    points = []
    for name, mtp in (("TEP8", 0), ("TEP8", 3), ("TP4DP4+EP", 0), ("TP4DP4+EP", 2)):
        topo = Topology.parse(name, mtp=mtp)
        for c in (1, 16, 128, 512):
            points.append(MeasuredPoint(topo, Role.DECODE, truth.predict(topo, Role.DECODE, isl=8192, osl=1024,
                                                                         concurrency=c)))
    for name in ("TP8", "TP4DP2+EP"):
        topo = Topology.parse(name)
        for c in (1, 4):
            points.append(MeasuredPoint(topo, Role.PREFILL, truth.predict(topo, Role.PREFILL, isl=8192, osl=1,
                                                                          concurrency=c)))
    return points


def test_fit_recovers_perturbed_factors(reference: ModelSpec, gb300: GpuSpec) -> None:
    points = _measurements(reference, gb300)
    result = fit_calibration(reference, gb300, points, default_calibration("gb300"))
    assert result.error_before > 0.05  # the defaults are visibly off
    assert result.error_after < 1e-4
    for name, value in TRUE_FACTORS.items():
        assert getattr(result.calibration, name) == pytest.approx(value, rel=0.01), name
    assert result.factors == tuple(TRUE_FACTORS) and result.num_points == len(points)


def test_fit_of_a_subset_reduces_error(reference: ModelSpec, gb300: GpuSpec) -> None:
    points = _measurements(reference, gb300)
    result = fit_calibration(reference, gb300, points, factors=("hbm_efficiency", "step_overhead_ms"))
    assert result.error_after < result.error_before
    assert result.calibration.mtp_acceptance == default_calibration("gb300").mtp_acceptance  # untouched
    perf = RooflineModel(reference, gb300, result.calibration)
    assert mean_relative_error(perf, points) == pytest.approx(result.error_after)


def test_fit_rejects_bad_input(reference: ModelSpec, gb300: GpuSpec) -> None:
    with pytest.raises(ConfigError) as info:
        fit_calibration(reference, gb300, [])
    assert info.value.field == "measured_points"
    points = _measurements(reference, gb300)[:2]
    with pytest.raises(ConfigError) as info:
        fit_calibration(reference, gb300, points, factors=("warp_speed",))
    assert info.value.field == "factors" and "hbm_efficiency" in (info.value.fix or "")


def test_fit_recovers_the_prefill_attention_efficiency(reference: ModelSpec, gb300: GpuSpec) -> None:
    """Long prompts spend most prefill time in attention: its efficiency is fittable on its own, starting
    from the prefill one when the calibration leaves it unset."""
    truth = RooflineModel(reference, gb300, default_calibration("gb300").model_copy(
        update={"attention_flop_efficiency": 0.22}))
    points = [MeasuredPoint(Topology.parse(name), Role.PREFILL,
                            truth.predict(Topology.parse(name), Role.PREFILL, isl=isl, osl=1, concurrency=c))
              for name in ("TP8", "TP4DP2+EP") for isl in (8192, 65536) for c in (1, 4)]
    start = default_calibration("gb300").model_copy(update={"attention_flop_efficiency": None})
    result = fit_calibration(reference, gb300, points, start, factors=("attention_flop_efficiency",))
    assert result.error_before > 0.05
    assert result.calibration.attention_flop_efficiency == pytest.approx(0.22, rel=0.02)
    assert result.calibration.prefill_flop_efficiency == start.prefill_flop_efficiency  # untouched
