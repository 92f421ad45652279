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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError

from tuner.backends import HostAssignment, TrialStatus
from tuner.launch import Failure, LaunchSpec, ProcessHandle, ProcessPolicy

log = logging.getLogger(__name__)
CALL_TIMEOUT_S = 60.0  # an agent call (start, status, log) that takes longer: the agent is lost


class AgentProcess:
    """A process a host agent started: status and log come from that agent."""

    def __init__(self, agent: Any, token: str, spec: LaunchSpec, record: dict) -> None:
        self.agent = agent
        self.token = token
        self.spec = spec
        self.record = record
        self.node_id: str = record["node_id"]
        self.pid: int = record["pid"]
        self.log_path = Path(record["log_path"])

    def log_text(self, max_bytes: int = 4_000_000) -> str:
        try:
            return ray.get(self.agent.log_text.remote(self.token, self.spec.name, max_bytes), timeout=CALL_TIMEOUT_S)
        except (RayError, GetTimeoutError):
            return ""

    def failure(self) -> Failure | None:
        try:
            status = ray.get(self.agent.status.remote(self.token, self.spec.name), timeout=CALL_TIMEOUT_S)
        except (RayError, GetTimeoutError) as exc:
            return Failure(TrialStatus.CRASHED, f"{self.spec.name}: host agent on node {self.node_id[:8]} lost "
                                                f"({type(exc).__name__})")
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
        record = ray.get(agent.launch.remote(self.token, spec, str(log_dir), policy),
                         timeout=CALL_TIMEOUT_S)
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
