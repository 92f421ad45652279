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
import functools
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tuner.backends import Backend, ExecutorNeeds, TrialRequest, TrialResult, TrialStatus
from tuner.launch import (
    LaunchSpec,
    ProcessPolicy,
    RunningProcess,
    clean_temp_files,
    process_alive,
    start_process,
    temp_files_snapshot,
    terminate,
)

TRIAL_TAG_ENV = "TOPOTUNE_TRIAL_TAG"
TRIAL_LOG = "trial.log"  # stdout/stderr of the runner (and of the backend's own prints and logging)
RUNNER_PID = "runner.pid"  # present while a runner works on the trial (fault-injection tools read it)
LAUNCHES = "launches.json"  # processes host agents started for the trial: name, pid, agent pid, node id


@dataclass(frozen=True)
class BackendSpec:
    """How a worker builds the backend: by name (tuner.backends.make_backend) or with a picklable factory.

    needs: what the backend needs from the executor; default: what its class declares (the factory's class,
    a partial's class, else the class registered under `name`; a test backend of no known class needs nothing).
    """

    name: str = "simulated"
    options: dict = field(default_factory=dict)
    factory: Callable[[], Backend] | None = None
    needs: ExecutorNeeds | None = None

    def executor_needs(self) -> ExecutorNeeds:
        if self.needs is not None:
            return self.needs
        if self.factory is None:
            from tuner.backends import backend_class

            return backend_class(self.name).needs
        made = self.factory.func if isinstance(self.factory, functools.partial) else self.factory
        return made.needs if isinstance(made, type) and issubclass(made, Backend) else ExecutorNeeds()

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


def run_trial(spec: BackendSpec, request_json: str, token: str, attempt: int, agents: dict | None = None,
              addresses: dict[str, str] | None = None) -> str:
    """Body of the runner task: the backend's run() with the trial tag set and output in the trial folder.

    agents: node id -> that host's HostAgent actor. Given, a backend that declares
    `ExecutorNeeds(process_starter=True)` gets an AgentStarter: each process of its plan starts on the node its
    host assignment names, through that node's agent (what was started where goes to LAUNCHES in the trial folder).
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
                if agents and backend.needs.process_starter:
                    from tuner.executors._starter import AgentStarter

                    starter = AgentStarter(token, agents, addresses or {}, folder / LAUNCHES if folder else None)
                    result = backend.run(request, starter=starter)  # type: ignore[call-arg]
                else:
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
    from tuner.executors._reaper import pids_tagged

    return pids_tagged(TRIAL_TAG_ENV, token, proc)


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
            if not [p for p in pids if process_alive(p)]:
                return pids
            time.sleep(0.05)
    return pids


def _reap_children() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


class HostAgent:
    """One per host (Ray actor, no resources): starts a trial's processes there and kills them on request.

    `launch` starts one process of a trial on this host through tuner.launch (own process group,
    TOPOTUNE_TRIAL_TAG in its environment, log written here under the given folder, failures judged by the
    backend's ProcessPolicy); it knows no backend;
    `status`/`log_text` answer for it (the failure is classified here, from the log on this host);
    `stop_processes`/`stop` tear them down (SIGTERM to the groups, SIGKILL after the grace); `reap` kills
    anything tagged with the trial, whoever started it (the runner task, a backend, a process that
    double-forked). tuner.executors._starter.AgentStarter is the backend-side view of these calls.
    """

    def __init__(self) -> None:
        self._processes: dict[str, list[RunningProcess]] = {}
        # per trial, per temp-file pattern of its processes' policy: the files present before its first start
        self._temp_before: dict[str, dict[str, set[str]]] = {}

    def pid(self) -> int:
        return os.getpid()

    @staticmethod
    def node_id() -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def launch(self, token: str, spec: LaunchSpec, log_dir: str, policy: ProcessPolicy | None = None) -> dict:
        """Start one process here (any LaunchSpec, judged by the backend's policy); returns what was started
        where (name, pid, agent pid, node id, log)."""
        policy = policy or ProcessPolicy()
        if policy.temp_glob:
            self._temp_before.setdefault(token, {}).setdefault(policy.temp_glob,
                                                                temp_files_snapshot(policy.temp_glob))
        proc = start_process(spec, Path(log_dir), base_env={**os.environ, TRIAL_TAG_ENV: token}, policy=policy)
        self._processes.setdefault(token, []).append(proc)
        return {"name": proc.spec.name, "host": proc.spec.host, "pid": proc.popen.pid, "agent_pid": os.getpid(),
                "node_id": self.node_id(), "log_path": str(proc.log_path)}

    def start(self, token: str, specs: list[LaunchSpec], log_dir: str, policy: ProcessPolicy | None = None
              ) -> list[int]:
        return [self.launch(token, s, log_dir, policy)["pid"] for s in specs]

    def _find(self, token: str, name: str) -> RunningProcess | None:
        return next((p for p in self._processes.get(token, []) if p.spec.name == name), None)

    def status(self, token: str, name: str) -> dict:
        """Exit code (None while running) and the failure its log shows ("gone" when this agent has no such
        process: it was stopped, or the agent restarted)."""
        proc = self._find(token, name)
        if proc is None:
            return {"returncode": None, "failure": {"status": "crashed",
                                                    "reason": f"{name}: no such process on this host's agent"}}
        failure = proc.failure()
        return {"returncode": proc.popen.poll(),
                "failure": None if failure is None else {"status": failure.status.value, "reason": failure.reason}}

    def log_text(self, token: str, name: str, max_bytes: int = 4_000_000) -> str:
        proc = self._find(token, name)
        return "" if proc is None else proc.log_text(max_bytes)

    def poll(self, token: str) -> list[dict]:
        """Per process: name, exit code (None while running) and the failure its log shows, if any."""
        return [{"name": p.spec.name, **self.status(token, p.spec.name)} for p in self._processes.get(token, [])]

    def stop_processes(self, token: str, names: list[str], grace_s: float = 15.0) -> list[int]:
        """Tear down these processes of the trial (SIGTERM to their groups, SIGKILL after grace_s)."""
        own = self._processes.get(token, [])
        chosen = [p for p in own if p.spec.name in set(names)]
        terminate(chosen, grace_s=grace_s)
        self._processes[token] = [p for p in own if p not in chosen]
        if not self._processes[token]:
            self._forget(token)
        return [p.popen.pid for p in chosen]

    def _forget(self, token: str) -> None:
        self._processes.pop(token, None)
        for pattern, before in self._temp_before.pop(token, {}).items():
            clean_temp_files(before, pattern)

    def stop(self, token: str, grace_s: float = 15.0) -> list[int]:
        """Tear down what `launch` started (SIGTERM, then SIGKILL), then anything else tagged with the trial."""
        own = self._processes.get(token, [])
        if own:
            terminate(own, grace_s=grace_s)
        killed = reap(token, grace_s=min(grace_s, 5.0))
        self._forget(token)
        return [p.popen.pid for p in own] + killed

    def reap(self, token: str, grace_s: float = 5.0) -> list[int]:
        return self.stop(token, grace_s=grace_s)
