"""tuner.launch: a process is judged by its backend's policy, the alive check treats zombies as dead, and a server
that lost its port to another process before binding it starts again on a fresh block."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tuner.backends import TrialStatus
from tuner.launch import (
    Failure,
    LocalStarter,
    PortsLost,
    ProcessPolicy,
    RunningProcess,
    free_port_block,
    http_ok,
    lost_port,
    process_alive,
    start_on_free_ports,
    start_process,
    terminate,
    wait_healthy,
)

HANG_GUARD_S = 120  # not a timing assertion: only so a server that never answers fails instead of blocking the run


@dataclass(frozen=True)
class Spec:
    """Any object shaped like LaunchSpec starts: the launch layer knows no backend's spec class."""

    name: str
    argv: tuple[str, ...]
    host: str = "127.0.0.1"
    env: dict[str, str] = field(default_factory=dict)
    health_url: str | None = None

    def shell(self) -> str:
        return " ".join(self.argv)


def _says_boom(text: str, returncode: int | None = None) -> Failure | None:
    return Failure(TrialStatus.OOM, "boom line") if "BOOM" in text else None


def _wait_exit(proc) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 30
    while proc.popen.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)


def test_the_policy_reads_the_log_and_the_default_reads_the_exit_code(tmp_path: Path) -> None:
    argv = (sys.executable, "-c", "print('BOOM', flush=True); raise SystemExit(3)")
    judged = LocalStarter().start(Spec("judged", argv), tmp_path, policy=ProcessPolicy(classify=_says_boom))
    plain = start_process(Spec("plain", argv), tmp_path)
    for proc in (judged, plain):
        _wait_exit(proc)
    assert judged.failure() == Failure(TrialStatus.OOM, "judged: boom line")
    failure = plain.failure()
    assert failure is not None and failure.status is TrialStatus.CRASHED and "exited with code 3" in failure.reason
    assert (tmp_path / "plain.log").read_text().startswith("# ")  # the command line, then the output


def test_temp_files_of_the_policy_are_the_only_ones_removed(tmp_path: Path) -> None:
    from tuner.launch import clean_temp_files, temp_files_snapshot

    pattern = str(tmp_path / "shm_*")
    (tmp_path / "shm_old").write_text("")
    before = temp_files_snapshot(pattern)
    (tmp_path / "shm_new").write_text("")
    (tmp_path / "other").write_text("")
    assert clean_temp_files(before, pattern) == [str(tmp_path / "shm_new")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "shm_old"]
    assert clean_temp_files(set(), None) == [] and temp_files_snapshot(None) == set()


def test_a_zombie_is_not_alive(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while process_alive(child.pid) and time.monotonic() < deadline:  # exited but not reaped: a zombie
        time.sleep(0.05)
    assert not process_alive(child.pid)
    assert Path(f"/proc/{child.pid}").exists()  # still in the process table until reaped
    child.wait()
    running = start_process(Spec("sleeper", ("sleep", "30")), tmp_path)
    assert process_alive(running.popen.pid)
    terminate([running], grace_s=1.0)
    assert not process_alive(running.popen.pid)


@dataclass
class _HttpServers:
    """Starts of a real `python -m http.server` on a block's port, for start_on_free_ports: the first `lose` find
    their port taken (this test binds and listens on it between the choice of the block and the server's bind)."""

    logs: Path
    lose: int
    code: tuple[str, ...] = ("-m", "http.server", "--bind", "127.0.0.1")
    bases: list[int] = field(default_factory=list)
    held: list[socket.socket] = field(default_factory=list)

    def __call__(self, base: int, attempt: int) -> RunningProcess:
        self.bases.append(base)
        if attempt < self.lose:
            sock = socket.socket()
            sock.bind(("127.0.0.1", base))
            sock.listen()
            self.held.append(sock)
        server = start_process(Spec(f"server{attempt}", (sys.executable, *self.code, "--directory", str(self.logs),
                                                         str(base)), health_url=f"http://127.0.0.1:{base}/"),
                               self.logs)
        failure = wait_healthy([server], HANG_GUARD_S, poll_s=0.1)
        if failure is not None:
            terminate([server], grace_s=5)
            raise RuntimeError(failure.reason)
        return server

    def log(self, attempt: int) -> list[str]:
        return [(self.logs / f"server{attempt}.log").read_text(errors="replace")]

    def close(self) -> None:
        for sock in self.held:
            sock.close()


def test_a_server_that_lost_its_port_starts_again_on_a_fresh_block(tmp_path: Path) -> None:
    starts = _HttpServers(tmp_path, lose=2)
    try:
        server = start_on_free_ports(starts, ports=1, logs=starts.log, where=tmp_path)
        try:
            assert http_ok(server.spec.health_url or "")
        finally:
            terminate([server], grace_s=5)
    finally:
        starts.close()
    assert len(starts.bases) == 3 and len(set(starts.bases)) == 3  # the lost ports are still held: never chosen
    assert all(lost_port(starts.log(n)[0]) for n in (0, 1)) and not lost_port(starts.log(2)[0])


def test_a_server_that_keeps_losing_its_port_is_given_up_on_with_where_its_logs_are(tmp_path: Path) -> None:
    starts = _HttpServers(tmp_path, lose=99)
    try:
        with pytest.raises(PortsLost, match=r"3 starts in a row, each on a fresh block of 1") as caught:
            start_on_free_ports(starts, ports=1, attempts=3, logs=starts.log, where=tmp_path)
    finally:
        starts.close()
    assert str(tmp_path) in str(caught.value)
    assert len(starts.bases) == 3


def test_a_failure_that_is_no_lost_port_is_not_retried(tmp_path: Path) -> None:
    starts = _HttpServers(tmp_path, lose=0, code=("-c", "import sys; sys.exit('no such model')"))
    with pytest.raises(RuntimeError, match="no such model") as caught:
        start_on_free_ports(starts, ports=1, logs=starts.log, where=tmp_path)
    assert not isinstance(caught.value, PortsLost)
    assert len(starts.bases) == 1


def test_a_base_the_caller_fixed_is_kept_even_when_its_port_was_lost(tmp_path: Path) -> None:
    starts = _HttpServers(tmp_path, lose=1)
    fixed = free_port_block(1)
    try:
        with pytest.raises(RuntimeError) as caught:
            start_on_free_ports(starts, ports=1, logs=starts.log, where=tmp_path, base=fixed)
    finally:
        starts.close()
    assert not isinstance(caught.value, PortsLost) and lost_port(starts.log(0)[0])
    assert starts.bases == [fixed]
