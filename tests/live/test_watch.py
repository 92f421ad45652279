"""The deployment watch's decisions on real vLLM windows: a baseline, steady windows, one advice per traffic change
(confirmed by the next window), SLA attainment below target, and the state the service stores between periods."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from _support.metrics_servers import exposition

from tuner.live import (
    Expected,
    Thresholds,
    TrafficProfile,
    WatchAdvice,
    WatchAdviceRequest,
    WatchState,
    WatchTarget,
    state_from_json,
    state_json,
    tick,
)
from tuner.workload import VllmCounters, live_traffic, parse_exposition


def _inc(before: str, after: str) -> VllmCounters:
    return parse_exposition(exposition(after), "s").minus(parse_exposition(exposition(before), "s"), source="s")


PHASE1 = _inc("cpu_idle.txt", "cpu_after_40.txt")  # ~350-token prompts, 70% prefix hits, 5 req/s over 8 s
PHASE2 = _inc("cpu_after_40.txt", "cpu_after_56.txt")  # 600-token prompts, no prefix, 16 requests over 9 s
IDLE = _inc("cpu_idle.txt", "cpu_idle.txt")


@pytest.fixture
def target(models_dir: Path) -> WatchTarget:
    return WatchTarget(deployment="TP4", serve_flags="--max-num-seqs 64",
                       advice=WatchAdviceRequest(model_path=str(models_dir / "llama-3.1-70b"), hardware="gb300",
                                            max_gpus=16, max_ttft_ms=None, max_itl_ms=None))


def test_one_change_fires_once_on_the_window_that_confirms_it(target: WatchTarget) -> None:
    state = WatchState()
    kinds = []
    ticks = []
    for inc, seconds in [(PHASE1, 8.0), (PHASE1, 8.0), (IDLE, 8.0), (PHASE1, 8.0), (PHASE2, 9.0), (PHASE2, 9.0),
                         (PHASE2, 9.0), (PHASE2, 9.0)]:
        t = tick(target, state, inc, seconds, ("s",))
        state = t.state
        kinds.append(t.kind)
        ticks.append(t)
    assert kinds == ["baseline", "baseline", "idle", "steady", "pending", "advice", "baseline", "steady"]
    fired = ticks[5]
    assert any("input length p50 350 -> 600" in r for r in fired.reasons)
    assert any(r.startswith("request rate 5 -> 1.78") for r in fired.reasons)
    assert any("prefix-cache hit share 70% -> 0%" in r for r in fired.reasons)
    # the real frontier answered for the new traffic, with its commands and what it is expected to give
    assert fired.advice is not None and "vllm serve" in fired.advice.commands
    assert fired.expected is not None and fired.expected.gpus_now == 4
    assert fired.expected.summary
    assert fired.state.baseline is not None and fired.state.baseline.input_p50 == pytest.approx(600)


def test_a_partial_first_window_only_settles_the_baseline(target: WatchTarget) -> None:
    partial = live_traffic(PHASE1, 20.0, ("s",))  # the watch started mid-window: 40 % of the rate
    assert partial.arrival_rps == pytest.approx(2.0)
    kinds = []
    state = WatchState()
    for seconds in (20.0, 8.0, 8.0, 8.0):
        t = tick(target, state, PHASE1, seconds, ("s",))
        kinds.append(t.kind)
        state = t.state
    assert kinds == ["baseline", "baseline", "steady", "steady"]


def test_a_quiet_window_breaks_a_pending_change(target: WatchTarget) -> None:
    state = WatchState()
    kinds = []
    for inc, seconds in [(PHASE1, 8.0), (PHASE1, 8.0), (PHASE2, 9.0), (IDLE, 9.0), (PHASE1, 8.0)]:
        t = tick(target, state, inc, seconds, ("s",))
        kinds.append(t.kind)
        state = t.state
    assert kinds == ["baseline", "baseline", "pending", "idle", "steady"]


def test_a_wobble_within_the_thresholds_never_fires(target: WatchTarget) -> None:
    state = tick(target, WatchState(), PHASE1, 8.0, ("s",)).state
    state = tick(target, state, PHASE1, 8.0, ("s",)).state
    for seconds in (7.0, 9.0, 8.5, 7.5):  # the rate moves by up to 14%: under the 25% threshold
        t = tick(target, state, PHASE1, seconds, ("s",))
        assert t.kind == "steady"
        state = t.state


def test_sla_attainment_below_target_fires_once_until_it_recovers(target: WatchTarget) -> None:
    live = live_traffic(PHASE1, 8.0, ("s",))
    # a TTFT bound that about half the window's requests miss, measured from vLLM's TTFT histogram
    bound = live.ttft.p50_ms
    strict = WatchTarget(deployment="TP4", serve_flags="", thresholds=Thresholds(min_attainment=0.9),
                         advice=WatchAdviceRequest(model_path=target.advice.model_path, hardware="gb300", max_gpus=16,
                                              max_ttft_ms=bound, max_itl_ms=None))
    state = WatchState()
    kinds = []
    for _ in range(5):
        t = tick(strict, state, PHASE1, 8.0, ("s",), advise=fixed_advice, gain=no_gain)
        kinds.append(t.kind)
        state = t.state
    assert kinds == ["pending", "advice", "baseline", "steady", "steady"]
    assert state.sla_alerted
    assert 0.4 < live.share_within(max_ttft_ms=bound, max_itl_ms=None) < 0.6


def fixed_advice(request: WatchAdviceRequest, workload: object) -> WatchAdvice:
    """The decisions alone: a fixed answer instead of the frontier's."""
    return WatchAdvice("TP8", "aggregated", 8, 100.0, 20.0, 1000.0, 0.99, "vllm serve ...")


def no_gain(*_args: object) -> Expected:
    return Expected(4, 8, 0.5, 0.99, True, "SLA regained")


def test_the_state_survives_a_json_round_trip() -> None:
    profile = TrafficProfile(1.5, 300, 500, 40, 60, 0.3, math.nan, 12)
    back = state_from_json(state_json(WatchState(baseline=profile, baseline_windows=2, pending=1, sla_alerted=True)))
    assert back.pending == 1 and back.sla_alerted and back.baseline is not None and back.baseline_windows == 2
    assert back.baseline.rate_rps == 1.5 and math.isnan(back.baseline.attainment)
    assert state_from_json(None) == WatchState()


def test_a_bad_percentile_is_checked_once_and_names_the_watch_field(target: WatchTarget) -> None:
    """`Sla` is the one check of the SLA's percentile; the watch's error names its own field and the fix."""
    from dataclasses import replace

    from tuner.errors import TopotuneError
    from tuner.live import advise_traffic

    bad = replace(target.advice, percentile="p95")
    with pytest.raises(TopotuneError) as caught:
        advise_traffic(bad, live_traffic(PHASE1, 8.0, ("s",)).workload)
    assert caught.value.field == "percentile" and "p95" in caught.value.message
    assert caught.value.fix == "use p50, p90 or p99"
