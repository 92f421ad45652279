"""What runs on the cluster's hosts: the trial runner (a Ray task in the trial's placement group) and the host
agent (one Ray actor per host) that starts, supervises and reaps processes.

Every process a trial starts inherits TOPOTUNE_TRIAL_TAG=<token> in its environment, and /proc/<pid>/environ keeps
the value a process started with. So when the runner is killed (kill -9, a dead host, a timeout) the host agent
still finds and kills everything the trial started, even processes that left for their own session or process
group, the way Jenkins' ProcessTreeKiller finds a build's processes by its BUILD_ID. This module imports no ray:
the executor wraps these with ray.remote.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tuner.backends import Backend, TrialRequest, TrialResult, TrialStatus

TRIAL_TAG_ENV = "TOPOTUNE_TRIAL_TAG"
TRIAL_LOG = "trial.log"  # stdout/stderr of the runner (and of the backend's own prints and logging)
RUNNER_PID = "runner.pid"  # present while a runner works on the trial (fault-injection tools read it)


@dataclass(frozen=True)
class BackendSpec:
    """How a worker builds the backend: by name (tuner.backends.make_backend) or with a picklable factory."""

    name: str = "simulated"
    options: dict = field(default_factory=dict)
    factory: Callable[[], Backend] | None = None

    def build(self) -> Backend:
        if self.factory is not None:
            return self.factory()
        from tuner.backends import make_backend

        return make_backend(self.name, **self.options)


@contextlib.contextmanager
def _output_to(path: Path | None) -> Iterator[None]:
    """Point fds 1 and 2 at the trial's log (child processes inherit it), then restore them: workers are reused."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with path.open("ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def run_trial(spec: BackendSpec, request_json: str, token: str, attempt: int) -> str:
    """Body of the runner task: the backend's run() with the trial tag set and output in the trial folder.

    Returns the TrialResult as JSON. A backend that raises is a crash of this trial, not of the study.
    """
    request = TrialRequest.model_validate_json(request_json)
    folder = Path(request.artifacts_dir) if request.artifacts_dir else None
    os.environ[TRIAL_TAG_ENV] = token
    started = time.monotonic()
    pid_file = folder / RUNNER_PID if folder else None
    try:
        if pid_file is not None:
            pid_file.parent.mkdir(parents=True, exist_ok=True)
            pid_file.write_text(str(os.getpid()))
        with _output_to(folder / TRIAL_LOG if folder else None):
            print(f"[topotune] trial {request.trial_id} attempt {attempt} pid {os.getpid()} "
                  f"hosts {[h.model_dump() for h in request.hosts]}", flush=True)
            backend: Backend | None = None
            try:
                backend = spec.build()
                result = backend.run(request)
            except Exception as exc:  # a backend bug: stored as the trial's reason, the study goes on
                traceback.print_exc()
                result = TrialResult.failed(TrialStatus.CRASHED, f"{type(exc).__name__}: {exc}",
                                            duration_s=time.monotonic() - started)
            finally:
                if backend is not None:
                    with contextlib.suppress(Exception):
                        backend.close()
            print(f"[topotune] trial {request.trial_id} ended: {result.status.value} {result.reason[:200]}",
                  flush=True)
    finally:
        os.environ.pop(TRIAL_TAG_ENV, None)
        if pid_file is not None:
            with contextlib.suppress(OSError):
                pid_file.unlink()
    if result.artifacts_dir is None and folder is not None:
        result = result.model_copy(update={"artifacts_dir": str(folder)})
    return result.model_dump_json()


# -- finding and killing a trial's processes --------------------------------------------------------------

def tagged_pids(token: str, proc: Path = Path("/proc")) -> list[int]:
    """Processes of this user whose start-up environment carries the trial's tag."""
    needle = f"{TRIAL_TAG_ENV}={token}".encode()
    me = os.getpid()
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def reap(token: str, grace_s: float = 5.0) -> list[int]:
    """SIGTERM the process groups and processes tagged with `token`, SIGKILL what is left after grace_s.

    Returns the pids found. Safe to call again: a second call finds nothing.
    """
    pids = tagged_pids(token)
    if not pids:
        return []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                pgid = os.getpgid(pid)
                if pgid == pid:  # a group leader (start_new_session): signal its whole group
                    os.killpg(pgid, sig)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            _reap_children()
            if not [p for p in pids if _alive(p)]:
                return pids
            time.sleep(0.05)
    return pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"  # a zombie is dead
    except (OSError, IndexError):
        return False


def _reap_children() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


class HostAgent:
    """One per host (Ray actor, no resources): starts a trial's processes there and kills them on request.

    `start` runs a vLLM launch plan's share for this host through tuner.backends.vllm's process helpers (own
    process groups, logs in the trial folder); `stop` tears them down; `reap` kills anything tagged with the trial,
    whoever started it (the runner task, a backend, a process that double-forked).
    """

    def __init__(self) -> None:
        self._processes: dict[str, list] = {}

    def pid(self) -> int:
        return os.getpid()

    def start(self, token: str, specs_json: list[str], log_dir: str) -> list[int]:
        from tuner.backends.vllm._plan import ProcessSpec
        from tuner.backends.vllm._process import start_process

        env = {**os.environ, TRIAL_TAG_ENV: token}
        started = [start_process(ProcessSpec.model_validate_json(s), Path(log_dir), base_env=env)
                   for s in specs_json]
        self._processes.setdefault(token, []).extend(started)
        return [p.popen.pid for p in started]

    def poll(self, token: str) -> list[dict]:
        """Per process: name, exit code (None while running) and the failure its log shows, if any."""
        out = []
        for proc in self._processes.get(token, []):
            failure = proc.failure()
            out.append({"name": proc.spec.name, "returncode": proc.popen.poll(),
                        "failure": None if failure is None else {"status": failure.status.value,
                                                                 "reason": failure.reason}})
        return out

    def stop(self, token: str, grace_s: float = 15.0) -> list[int]:
        """Tear down what `start` started (SIGTERM, then SIGKILL), then anything else tagged with the trial."""
        own = self._processes.pop(token, [])
        if own:
            from tuner.backends.vllm._process import terminate

            terminate(own, grace_s=grace_s)
        return reap(token, grace_s=min(grace_s, 5.0))

    def reap(self, token: str, grace_s: float = 5.0) -> list[int]:
        return self.stop(token, grace_s=grace_s)
