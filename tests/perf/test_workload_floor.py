"""benchmarks/workload_floor.py (the in-sample floor of the replay's error on the published workload rows) and the
held-out grouping it shares with benchmarks/workload_fidelity.py: a source is held out under either table's name,
the stored floor fits cover every held-out calibration within the fit's bounds, and the noise and pooling
arithmetic. Nothing here replays or fits (the benchmark does)."""

from __future__ import annotations

import json
import math

import pytest
import yaml
from _support.benchmarks import load_benchmark

from tuner.perf import Calibration


@pytest.fixture(scope="module")
def floor():
    load_benchmark("workload_fidelity")
    return load_benchmark("workload_floor")


@pytest.fixture(scope="module")
def cals(floor):
    return floor.wf.Calibrations()


def test_a_source_is_held_out_under_either_tables_name(cals) -> None:
    """GPUStack's GLM-4.x/H200 page is `gpustack-glm-4x-h200` in the workload table and `gpustack-glm-4.6-h200` in
    the fixed-length one: holding the row's source out must drop the fixed-length rows of that page."""
    assert cals.key("h200", "gpustack-glm-4x-h200") == ("hopper", frozenset({"gpustack-glm-4.6-h200"}))
    assert cals.key("h100", "gpustack-qwen3-8b-h100") == ("hopper", frozenset({"gpustack-qwen3-8b-h100"}))
    assert cals.key("h100", "llmd-kvcache-37cap-llama70b-h100") == ("hopper", frozenset())


def test_stored_floors_cover_every_held_out_fit_within_bounds(floor, cals) -> None:
    stored = json.loads(floor.STORED.read_text())
    rows = [r for r in yaml.safe_load(floor.wf.TABLE.read_text())["rows"]
            if r["engine"] == "vllm" and r["load"]["kind"] != "burst"]
    groups = {floor.group_of(cals, str(r["gpu"]), str(r["source"])) for r in rows}
    names = {t.name for t in floor.TARGETS}
    assert set(stored["fits"]["joint"]) == names and set(stored["fits"]["per_fit"]) == names
    fitted = [(target, "one calibration", fields) for target, fields in stored["fits"]["joint"].items() if fields]
    for target, fits in stored["fits"]["per_fit"].items():
        assert fits or stored["fits"]["joint"][target], f"{target}: no floor fitted at all"
        if fits:
            assert set(fits) == groups, target
            fitted += [(target, group, fields) for group, fields in fits.items()]
    for target, group, fields in fitted:
        cal = Calibration(**fields)
        for name in floor.fidelity.FIT_FACTORS:
            lo, hi = floor.fidelity._factor_bounds(name)
            assert lo * 0.999 <= getattr(cal, name) <= hi * 1.001, (target, group, name)


def test_noise_spread_is_max_over_min(floor) -> None:
    rows = yaml.safe_load(floor.wf.TABLE.read_text())["rows"]
    lines = floor.noise_lines(rows)
    q8b = next(line for line in lines if "Qwen3-8B" in line and "ttft_p50" in line)
    assert "60.38 / 64.78 / 60.26 / 60.77" in q8b and "7.5%" in q8b  # 64.78 / 60.26 - 1
    rounding = next(line for line in lines if "printed to 1 ms" in line)
    assert "4.5%" in rounding  # 0.5 ms of the smallest llm-d ITL mean (11 ms)


def test_pooled_takes_the_figures_the_replay_gave(floor) -> None:
    ttft = next(t for t in floor.TARGETS if t.name == "TTFT p90/p99")
    scored = [({"id": "a"}, {"ttft_p90": math.log(2.0), "ttft_p50": math.log(9.0)}),
              ({"id": "b"}, {"ttft_p99": math.log(1 / 1.5)}),
              ({"id": "c"}, {"ttft_p90": math.log(1.1)})]
    figures = floor.pooled(scored, ttft)
    assert figures.n == 3
    assert figures.median_pct == pytest.approx(50.0)
    assert figures.worst_x == pytest.approx(2.0)
