"""`topotune workload --from-metrics / --from-prometheus` as a user runs it: JSON keys, --out, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _support.metrics_servers import MetricsPage, PrometheusAnswers, exposition, serving

from tuner.cli import main
from tuner.cli._traffic import load_workload


def test_from_metrics_json_has_todays_keys_plus_the_measured_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                                  ) -> None:
    out = tmp_path / "live.yaml"
    with serving(MetricsPage(exposition("cpu_idle.txt"), exposition("cpu_after_40.txt"))) as url:
        code = main(["workload", "--from-metrics", url, "--window", "1s", "--json", "--out", str(out)])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert {"describe", "input_tokens", "output_tokens", "max_model_len", "prefix_hit_share_by_cache_tokens",
            "requests", "duration_s", "arrival_rps", "prefix_reuse", "measured"} <= set(data)
    assert data["requests"] == 40 and data["input_tokens"]["mean"] == pytest.approx(349.5, abs=1)
    assert data["arrival_rps"] == pytest.approx(40 / data["duration_s"], rel=1e-3)
    assert data["prefix_reuse"] == pytest.approx(9728 / 13980, abs=1e-4)
    assert set(data["measured"]) == {"ttft_ms", "itl_ms", "request_itl_ms"}
    assert data["measured"]["ttft_ms"]["samples"] == 40
    # the file is a workload every --workload option reads: the same lengths, prefix and rate
    back = load_workload(out, isl=1, osl=1, concurrency=(1,))
    assert back.open_loop and back.request_rates == (pytest.approx(data["arrival_rps"], rel=1e-4),)
    assert back.input_tokens.expected == pytest.approx(data["input_tokens"]["mean"], abs=0.5)
    assert back.prefix is not None
    assert main(["workload", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["input_tokens"] == data["input_tokens"]


def test_from_prometheus_prints_the_window(capsys: pytest.CaptureFixture[str]) -> None:
    with serving(PrometheusAnswers(exposition("cpu_idle.txt"), exposition("cpu_after_40.txt"))) as url:
        code = main(["workload", "--from-prometheus", url, "--query", '{model_name="tiny"}', "--range", "8s"])
    assert code == 0
    out = capsys.readouterr().out
    assert "40 requests finished in 8.0 s: 5 req/s" in out and "TTFT" in out


@pytest.mark.parametrize(("argv", "message"), [
    (["--from-metrics", "http://127.0.0.1:1/metrics", "--window", "1s"], "cannot reach http://127.0.0.1:1/metrics"),
    (["--window", "1s"], "give one trace or workload file"),
    (["--from-metrics", "http://a:1", "--from-prometheus", "http://b:9090"], "give one source"),
    (["--from-metrics", "http://127.0.0.1:1", "--window", "ten minutes"], "--window"),
])
def test_bad_sources_are_one_line_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["workload", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_non_vllm_endpoint_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    with serving(MetricsPage("# TYPE up gauge\nup 1\n")) as url:
        assert main(["workload", "--from-metrics", url, "--window", "1s"]) == 2
    err = capsys.readouterr().err
    assert f"{url}/metrics" in err and "exposes no vLLM metrics" in err
