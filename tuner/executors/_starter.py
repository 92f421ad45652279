"""The backend-side view of the host agents: a process starter (tuner.launch.ProcessStarter) that runs each process
of a trial on the host Ray placed it on, used by run_trial under the RayExecutor for a backend that declares
`ExecutorNeeds(process_starter=True)`.

Routing: a process goes to the agent of the node its HostAssignment names (node_id, from the placement group's
bundles); an assignment without a known node falls back to the agent whose node has that address. The agent
starts the process on its host with the trial tag, writes its log there (the same path as on the runner's host:
on one machine, or with a shared artifacts folder, the logs land in the trial folder; otherwise they stay on the
host that ran the process) and classifies its failures there, from that log.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError

from tuner.backends import HostAssignment, TrialStatus
from tuner.launch import Failure, LaunchSpec, ProcessHandle, ProcessPolicy

log = logging.getLogger(__name__)
# A slow answer is not a lost agent: on a loaded host (the trial's own servers pin its cores) one call can wait
# for minutes. A call that times out is asked again at the next poll; the agent is lost when Ray reports its
# actor dead (at once) or when it has answered nothing for SILENCE_LIMIT_S (a hung agent Ray still sees alive;
# usually the trial's own timeout ends the trial first).
CALL_TIMEOUT_S = 30.0
SILENCE_LIMIT_S = 600.0


class AgentProcess:
    """A process a host agent started: status and log come from that agent."""

    def __init__(self, agent: Any, token: str, spec: LaunchSpec, record: dict, *,
                 call_timeout_s: float = CALL_TIMEOUT_S, silence_limit_s: float = SILENCE_LIMIT_S) -> None:
        self.agent = agent
        self.call_timeout_s = call_timeout_s
        self.silence_limit_s = silence_limit_s
        self.token = token
        self.spec = spec
        self.record = record
        self.node_id: str = record["node_id"]
        self.pid: int = record["pid"]
        self.log_path = Path(record["log_path"])
        self.answered_at = time.monotonic()

    def log_text(self, max_bytes: int = 4_000_000) -> str:
        """The log as the agent's host has it; "" only when the agent is gone (a slow one is waited for: the
        startup figures are read from this text)."""
        try:
            return ray.get(self.agent.log_text.remote(self.token, self.spec.name, max_bytes),
                           timeout=self.silence_limit_s)
        except RayError:  # GetTimeoutError included
            return ""

    def failure(self) -> Failure | None:
        try:
            status = ray.get(self.agent.status.remote(self.token, self.spec.name), timeout=self.call_timeout_s)
        except GetTimeoutError:  # before RayError, its base class
            silent_s = time.monotonic() - self.answered_at
            if silent_s < self.silence_limit_s:
                log.warning("%s: host agent on node %s slow (no answer for %.0f s); asking again",
                            self.spec.name, self.node_id[:8], silent_s)
                return None
            return Failure(TrialStatus.CRASHED, f"{self.spec.name}: host agent on node {self.node_id[:8]} "
                                                f"answered nothing for {silent_s:.0f} s")
        except RayError as exc:
            return Failure(TrialStatus.CRASHED, f"{self.spec.name}: host agent on node {self.node_id[:8]} lost "
                                                f"({type(exc).__name__}: {str(exc)[:200]})")
        self.answered_at = time.monotonic()
        found = status["failure"]
        return None if found is None else Failure(TrialStatus(found["status"]), found["reason"])


class AgentStarter:
    """Routes each process to the HostAgent of its node (node_id first, then address)."""

    def __init__(self, token: str, agents: Mapping[str, Any], addresses: Mapping[str, str],
                 record_path: Path | None = None) -> None:
        self.token = token
        self.agents = dict(agents)
        self.addresses = dict(addresses)
        self.record_path = record_path
        self.launched: list[dict] = []

    def node_for(self, spec: LaunchSpec, host: HostAssignment | None) -> str:
        if host is not None and host.node_id in self.agents:
            return host.node_id
        address = host.address if host is not None else spec.host
        matches = [n for n in self.agents if self.addresses.get(n) == address]
        if len(matches) > 1:
            log.warning("%s: %d nodes have address %s; using %s", spec.name, len(matches), address, matches[0][:8])
        if matches:
            return matches[0]
        raise RuntimeError(f"no host agent for {spec.name} on {address} (node {host.node_id if host else None}); "
                           f"agents on {sorted(self.addresses.get(n, n) for n in self.agents)}")

    def start(self, spec: LaunchSpec, log_dir: Path, host: HostAssignment | None = None, *,
              policy: ProcessPolicy | None = None) -> AgentProcess:
        node = self.node_for(spec, host)
        agent = self.agents[node]
        # one call, not polled: wait as long as a silent agent is given (the trial's timeout usually ends first)
        record = ray.get(agent.launch.remote(self.token, spec, str(log_dir), policy), timeout=SILENCE_LIMIT_S)
        record["planned_node_id"] = host.node_id if host is not None else None
        self.launched.append(record)
        if self.record_path is not None:
            with contextlib.suppress(OSError):
                self.record_path.parent.mkdir(parents=True, exist_ok=True)
                self.record_path.write_text(json.dumps(self.launched, indent=2))
        return AgentProcess(agent, self.token, spec, record)

    def stop(self, processes: Sequence[ProcessHandle], grace_s: float) -> None:
        """Each agent tears down its share at the same time (SIGTERM to the groups, SIGKILL after grace_s)."""
        by_node: dict[str, list[str]] = {}
        for proc in processes:
            if isinstance(proc, AgentProcess):
                by_node.setdefault(proc.node_id, []).append(proc.spec.name)
        refs = [self.agents[node].stop_processes.remote(self.token, names, grace_s)
                for node, names in by_node.items()]
        for ref in refs:
            try:
                ray.get(ref, timeout=grace_s + CALL_TIMEOUT_S)
            except (RayError, GetTimeoutError) as exc:  # the executor's reap (by trial tag) still follows
                log.warning("host agent could not stop trial processes: %s", exc)
