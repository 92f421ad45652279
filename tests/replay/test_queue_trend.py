"""The replay report's queue trend: the slope of requests in flight over send time, in closed form, well conditioned
however large the timestamps (np.polyfit on them warned RankWarning and answered a slope of ~0)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from tuner.replay._report import least_squares_slope, queue_trend


def test_large_timestamps_with_a_small_spread_give_the_slope_without_a_warning() -> None:
    step_ms = 2.0 ** -10  # ~1 us between sends, at ~1.1e12 ms (an epoch in milliseconds)
    sent_ms = [2.0 ** 40 + k * step_ms for k in range(40)]
    in_flight = list(range(40))  # one more in flight per send: 1 / step requests per second
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # RankWarning (numpy.exceptions) or any other
        trend = queue_trend(sent_ms, in_flight)
    # within 1%: the seconds themselves (ms / 1e3 at ~1.1e9 s) are rounded to ~2e-7 s, a fifth of a step
    assert trend.growth_rps == pytest.approx(1e3 / step_ms, rel=0.01)
    assert trend.grows and trend.in_flight_end == 39


def test_the_slope_is_the_least_squares_fit_where_that_was_well_conditioned() -> None:
    rng = np.random.default_rng(7)
    t = np.sort(rng.uniform(0.0, 120.0, 300))
    y = rng.integers(0, 64, 300).astype(float) + 0.3 * t
    assert least_squares_slope(t, y) == pytest.approx(float(np.polyfit(t, y, 1)[0]), rel=1e-9)
    assert least_squares_slope(np.full(5, 3.0), np.arange(5.0)) == 0.0  # no spread: no slope
