"""Real subprocesses: process-group teardown leaves nothing, health waits see deaths and timeouts."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from _support.processes import process_alive

from tuner.backends import TrialStatus
from tuner.backends.vllm._plan import ProcessSpec
from tuner.backends.vllm._process import (
    clean_temp_files,
    free_port_block,
    start_process,
    temp_files_snapshot,
    terminate,
    wait_healthy,
)

# A parent that spawns two children, each spawning a grandchild; every process ignores SIGTERM so only the
# SIGKILL after the grace period can end them, and writes its pid so the test can check each one.
TREE = r"""
import os, signal, subprocess, sys, time
pids = sys.argv[1]
depth = int(sys.argv[2])
signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(pids, "a") as fh:
    fh.write(f"{os.getpid()}\n")
if depth > 0:
    for _ in range(2):
        subprocess.Popen([sys.executable, __file__, pids, str(depth - 1)])
print("tree up", flush=True)
while True:
    time.sleep(0.1)
"""


def spec(name: str, argv: list[str], health_url: str | None = None) -> ProcessSpec:
    return ProcessSpec(name=name, host="127.0.0.1", argv=tuple(argv), env={"PYTHONUNBUFFERED": "1"}, role="both",
                       health_url=health_url)


def test_teardown_kills_the_whole_tree_even_when_sigterm_is_ignored(tmp_path: Path) -> None:
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    pids_file = tmp_path / "pids"
    proc = start_process(spec("tree", [sys.executable, str(script), str(pids_file), "2"]), tmp_path / "logs")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if pids_file.exists() and len(pids_file.read_text().split()) == 7:
            break
        time.sleep(0.1)
    pids = [int(p) for p in pids_file.read_text().split()]
    assert len(pids) == 7 and all(process_alive(p) for p in pids)
    started = time.monotonic()
    terminate([proc], grace_s=1.0)
    assert time.monotonic() - started < 10
    assert not [p for p in pids if process_alive(p)]
    assert "tree up" in (tmp_path / "logs" / "tree.log").read_text()


def test_teardown_is_fast_when_processes_obey_sigterm(tmp_path: Path) -> None:
    proc = start_process(spec("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"]), tmp_path)
    started = time.monotonic()
    terminate([proc], grace_s=10.0)
    assert time.monotonic() - started < 3
    assert proc.popen.returncode is not None


def test_wait_healthy_reports_a_crash_from_the_log(tmp_path: Path) -> None:
    code = ("import sys; print('(EngineCore pid=1) ERROR 11-30 10:00:01 [core.py:1] torch.OutOfMemoryError: "
            "CUDA out of memory. Tried to allocate 2.00 GiB', flush=True); sys.exit(1)")
    proc = start_process(spec("server", [sys.executable, "-c", code], "http://127.0.0.1:1/health"), tmp_path)
    failure = wait_healthy([proc], timeout_s=20, poll_s=0.1, probe=lambda url: False)
    terminate([proc])
    assert failure is not None and failure.status is TrialStatus.OOM
    assert failure.reason.startswith("server: out of memory")


# What vLLM's engine core logs when the KV cache cannot hold one request; the process then exits by itself (1.5 s
# later here) and, signalled meanwhile, hangs (here: a SIGTERM handler that never returns) until SIGKILL.
FAILED_START = r"""
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: time.sleep(3600))
print("(EngineCore pid=1) ERROR 12-07 13:27:40 [core.py:1510] ValueError: To serve at least one request with the "
      "model's max seq len (2816), (0.0 GiB KV cache is needed, which is larger than the available KV cache memory "
      "(0.0 GiB).", flush=True)
time.sleep(1.5)
sys.exit(1)
"""


def test_a_server_that_logged_its_failure_exits_on_its_own_before_any_signal(tmp_path: Path) -> None:
    """vLLM's API server, signalled while its engine core's failed start-up unwinds, hung until SIGKILL; left
    alone it exits. Teardown waits for that exit."""
    script = tmp_path / "failed_start.py"
    script.write_text(FAILED_START)
    proc = start_process(spec("server", [sys.executable, str(script)], "http://127.0.0.1:1/health"), tmp_path)
    failure = wait_healthy([proc], timeout_s=20, poll_s=0.1, probe=lambda url: False)
    assert failure is not None and failure.status is TrialStatus.KV_TOO_SMALL
    started = time.monotonic()
    terminate([proc], grace_s=10.0)
    assert proc.popen.returncode == 1  # its own exit, not SIGKILL after the grace
    assert time.monotonic() - started < 10


def test_wait_healthy_times_out_and_succeeds(tmp_path: Path) -> None:
    proc = start_process(spec("slow", [sys.executable, "-c", "import time; time.sleep(30)"], "http://x/health"),
                         tmp_path)
    try:
        failure = wait_healthy([proc], timeout_s=0.5, poll_s=0.1, probe=lambda url: False)
        assert failure is not None and failure.status is TrialStatus.TIMEOUT and "slow" in failure.reason
        assert wait_healthy([proc], timeout_s=5, poll_s=0.1, probe=lambda url: True) is None
    finally:
        terminate([proc])


def test_headless_process_death_is_seen_while_waiting(tmp_path: Path) -> None:
    head = start_process(spec("head", [sys.executable, "-c", "import time; time.sleep(30)"], "http://x/health"),
                         tmp_path)
    worker = start_process(spec("node1", [sys.executable, "-c", "import os; os.abort()"]), tmp_path)
    try:
        failure = wait_healthy([head, worker], timeout_s=20, poll_s=0.1, probe=lambda url: False)
    finally:
        terminate([head, worker])
    assert failure is not None and failure.status is TrialStatus.CRASHED and "node1" in failure.reason


def test_clean_temp_files_only_removes_new_ones(tmp_path: Path) -> None:
    pattern = str(tmp_path / "vllm_dist_*")
    old = tmp_path / "vllm_dist_old"
    old.write_text("x")
    before = temp_files_snapshot(pattern)
    new = tmp_path / "vllm_dist_new"
    new.write_text("y")
    assert clean_temp_files(before, pattern) == [str(new)]
    assert old.exists() and not new.exists()


def test_free_port_block() -> None:
    import socket

    base = free_port_block(5)
    for port in range(base, base + 5):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_free_port_block_passes_over_a_taken_block_wherever_its_scan_starts() -> None:
    """The scan starts at a random block and wraps: in a range of two blocks, the first held here, every call
    (whichever block it starts at) returns the second."""
    import socket

    base = free_port_block(10)
    held = [socket.socket() for _ in range(5)]
    try:
        for port, sock in enumerate(held, start=base):
            sock.bind(("127.0.0.1", port))
        assert {free_port_block(5, start=base, end=base + 10) for _ in range(20)} == {base + 5}
    finally:
        for sock in held:
            sock.close()


def test_free_port_block_stays_below_the_kernels_ephemeral_ports(tmp_path) -> None:
    """Outgoing connections take ephemeral ports: a trial's block is chosen below them (read from the kernel's
    ip_local_port_range; Linux's default 32768 when it cannot be read)."""
    from tuner.launch._ports import _ephemeral_low

    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40000\t60999\n")
    assert _ephemeral_low(ranges) == 40000
    assert _ephemeral_low(tmp_path / "absent") == 32768
    low = _ephemeral_low()
    assert all(free_port_block(200) + 200 <= low for _ in range(20))
