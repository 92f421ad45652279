"""tuner.launch: a process is judged by its backend's policy, and the alive check treats zombies as dead."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tuner.backends import TrialStatus
from tuner.launch import Failure, LocalStarter, ProcessPolicy, process_alive, start_process, terminate


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
