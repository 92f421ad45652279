"""RayExecutor: trials as Ray work with exact resource shapes, retried when their worker dies, killed at timeout.

Per trial: one placement group per vLLM instance (tuner.executors._placement), reserved atomically before the trial
starts, so Ray's own resource accounting keeps every study on the cluster within its GPUs. The backend's run()
executes in a runner task in bundle 0 of the first group, with TrialRequest.hosts filled from where the bundles
landed. A host agent per host (tuner.executors._host) starts the processes the backend plans for its host (for the
vllm backend, through tuner.executors._starter) and kills everything a trial started when its runner dies or
times out. Placement groups are removed whenever a trial ends.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError, RayTaskError
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

from tuner.backends import TrialRequest, TrialResult, TrialStatus
from tuner.errors import ConfigError, TopologyError
from tuner.executors._base import Executor, TrialHandle
from tuner.executors._host import RUNNER_PID, BackendSpec, HostAgent, run_trial
from tuner.executors._placement import (
    ClusterCapacity,
    InstanceShape,
    check_placeable,
    host_assignments,
    spread_ok,
)
from tuner.executors._session import ensure_ray

log = logging.getLogger(__name__)
EXECUTOR_RECORD = "executor.json"  # placement, attempts and failure reasons, beside the trial's logs


def _device_ids() -> list[int]:
    """Runs in one bundle: the GPU Ray gave it (a probe, for backends that start GPU processes themselves)."""
    return [int(g) for g in ray.get_gpu_ids()]


@dataclass
class _Reservation:
    shapes: list[InstanceShape]
    groups: list[PlacementGroup]
    bundle_nodes: list[list[str]]


@dataclass
class _Flight:
    handle: TrialHandle
    token: str
    reservation: _Reservation
    request: TrialRequest
    ref: ray.ObjectRef | None = None
    started_at: float = 0.0
    deadline: float = 0.0
    reasons: list[str] = field(default_factory=list)
    reaped_pids: list[int] = field(default_factory=list)


class RayExecutor(Executor):
    """Runs trials on the connected Ray cluster (see `RayExecutor.start` for the local default / RAY_ADDRESS).

    max_parallel: trials in flight at most; fewer when the cluster's free GPUs run out (can_start says so).
    max_retries: re-runs of a trial whose worker or host died (TrialHandle.attempts counts runs).
    timeout_grace_s: the backend gets request.timeout_s to stop on its own; the executor kills it this much later.
    wait_when_idle_s: with nothing of ours running, can_start waits this long for GPUs held by other studies
        instead of answering False (a driver with nothing running takes False as "never fits").
    probe_devices: ask Ray for each bundle's GPU id (one small task per GPU); default: when the backend declares
        `ExecutorNeeds(device_ids=True)` (the simulator and test backends start no GPU process).
    agent_launch: hand the runner the host agents of the trial's nodes, so the backend starts each process on
        its own host (tuner.executors._starter); default: when it declares `ExecutorNeeds(process_starter=True)`.
    """

    def __init__(self, backend: str | BackendSpec = "simulated", backend_options: dict[str, Any] | None = None, *,
                 gpus_per_host: int, max_parallel: int = 1, max_retries: int = 2, cpus_per_bundle: float = 0.01,
                 reserve_timeout_s: float = 2.0, wait_when_idle_s: float = 300.0, timeout_grace_s: float = 5.0,
                 kill_grace_s: float = 5.0, probe_devices: bool | None = None,
                 agent_launch: bool | None = None) -> None:
        if not ray.is_initialized():
            raise ConfigError("Ray is not initialised", field="executor",
                              fix="create the executor with RayExecutor.start(...) or call ray.init first")
        if max_parallel < 1 or gpus_per_host < 1:
            raise ConfigError("max_parallel and gpus_per_host must be >= 1", field="--parallel")
        self.spec = backend if isinstance(backend, BackendSpec) else BackendSpec(backend, dict(backend_options or {}))
        self.gpus_per_host = gpus_per_host
        self.max_parallel = max_parallel
        self.max_retries = max_retries
        self.cpus_per_bundle = cpus_per_bundle
        self.reserve_timeout_s = reserve_timeout_s
        self.wait_when_idle_s = wait_when_idle_s
        self.timeout_grace_s = timeout_grace_s
        self.kill_grace_s = kill_grace_s
        needs = self.spec.executor_needs()
        self.probe_devices = probe_devices if probe_devices is not None else needs.device_ids
        self.agent_launch = agent_launch if agent_launch is not None else needs.process_starter
        self.last_refusal: str | None = None  # why can_start last said no (for the driver's message)
        self._runner = ray.remote(num_cpus=cpus_per_bundle, max_retries=0)(run_trial)
        self._probe = ray.remote(num_gpus=1, num_cpus=0, max_retries=0)(_device_ids)
        self._flights: dict[TrialHandle, _Flight] = {}
        self._reserved: dict[str, _Reservation] = {}
        self._settled: list[TrialHandle] = []  # failed at submit (no reservation): returned by the next wait
        self._agents: dict[str, ray.actor.ActorHandle] = {}
        self._addresses: dict[str, str] = {}
        self._capacity: ClusterCapacity | None = None
        self._capacity_at = 0.0

    # -- factory --------------------------------------------------------------------------------------
    @classmethod
    def start(cls, settings: Any, cluster: Any, backend_name: str = "simulated",
              backend_options: dict[str, Any] | None = None, max_parallel: int = 1, **options: Any) -> RayExecutor:
        """The executor `topotune tune --executor ray` uses.

        settings: TunerSettings (ray_address from RAY_ADDRESS, ray_port); cluster: the space's ClusterSpec. With no
        RAY_ADDRESS a local head starts (once per process) with cluster.num_gpus logical GPUs; otherwise the
        executor connects and uses the cluster's real GPUs. Call shutdown() when done (the Ray session itself is
        shared by the process and ends with it, or with tuner.executors.shutdown_ray()).
        """
        from tuner.hardware import get_gpu

        ensure_ray(address=settings.ray_address, num_gpus=cluster.num_gpus, port=settings.ray_port)
        per_host = cluster.gpus_per_host or get_gpu(cluster.gpu).gpus_per_host
        return cls(backend_name, backend_options, gpus_per_host=per_host, max_parallel=max_parallel, **options)

    # -- capacity and placement ------------------------------------------------------------------------
    def capacity(self, refresh: bool = False) -> ClusterCapacity:
        if refresh or self._capacity is None or time.monotonic() - self._capacity_at > 10.0:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            self._addresses = {n["NodeID"]: n["NodeManagerAddress"] for n in nodes}
            gpus = tuple(int(n["Resources"].get("GPU", 0)) for n in nodes if n["Resources"].get("GPU", 0) >= 1)
            self._capacity = ClusterCapacity(node_gpus=gpus, gpus_per_host=self.gpus_per_host)
            self._capacity_at = time.monotonic()
        return self._capacity

    def check_placeable(self, request: TrialRequest) -> list[InstanceShape]:
        """The instance shapes, or TopologyError when the cluster can never hold this deployment."""
        return check_placeable(request.deployment, self.capacity(), self.cpus_per_bundle)

    def _reserve(self, request: TrialRequest, timeout_s: float) -> _Reservation | None:
        """Reserve every instance's group at once; None (nothing held) when they are not all ready in time or a
        multi-host instance landed on more hosts than it needs."""
        shapes = self.check_placeable(request)
        groups = [placement_group(s.bundles, strategy=s.strategy, name=f"topotune:{request.trial_id}:{i}")
                  for i, s in enumerate(shapes)]
        ready, _ = ray.wait([g.ready() for g in groups], num_returns=len(groups), timeout=timeout_s)
        if len(ready) < len(groups):
            self._remove(groups)
            return None
        nodes = [self._bundle_nodes(g, s) for g, s in zip(groups, shapes, strict=True)]
        for s, n in zip(shapes, nodes, strict=True):
            if not spread_ok(n, s):
                log.info("%s landed on %d hosts (at most %d): retrying later", s.label, len(set(n)), s.max_hosts)
                self._remove(groups)
                return None
        return _Reservation(shapes=shapes, groups=groups, bundle_nodes=nodes)

    @staticmethod
    def _bundle_nodes(group: PlacementGroup, shape: InstanceShape) -> list[str]:
        table = placement_group_table(group)["bundles_to_node_id"]
        return [table[i] for i in range(shape.num_gpus)]

    @staticmethod
    def _remove(groups: Sequence[PlacementGroup]) -> None:
        for g in groups:
            with contextlib.suppress(Exception):
                remove_placement_group(g)

    def _free_gpus(self) -> float:
        return ray.available_resources().get("GPU", 0.0)

    # -- Executor API ---------------------------------------------------------------------------------
    def at_capacity(self) -> bool:
        return len(self._flights) >= self.max_parallel

    def can_start(self, request: TrialRequest) -> bool:
        if len(self._flights) >= self.max_parallel:
            return False
        try:
            self.check_placeable(request)
        except TopologyError as exc:
            self.last_refusal = exc.user_message()
            return False
        if request.trial_id in self._reserved:
            return True
        idle = not self._flights
        deadline = time.monotonic() + (self.wait_when_idle_s if idle else 0.0)
        while True:
            # Ray's free-GPU figure lags a removal by ~0.5 s: a cheap filter while our trials run; when idle
            # the reservation itself is the check (an infeasible group just stays pending until the timeout).
            if idle or self._free_gpus() >= request.deployment.num_gpus:
                reservation = self._reserve(request, self.reserve_timeout_s)
                if reservation is not None:
                    self._reserved[request.trial_id] = reservation
                    self.last_refusal = None
                    return True
            if time.monotonic() >= deadline:
                self.last_refusal = f"{request.deployment.num_gpus} GPUs are not free now"
                return False
            time.sleep(0.1)

    def submit(self, request: TrialRequest) -> TrialHandle:
        """Start the trial. Raises TopologyError (before anything starts) when it can never be placed."""
        self.check_placeable(request)
        handle = TrialHandle(request)
        reservation = self._reserved.pop(request.trial_id, None) or self._reserve(request, request.timeout_s)
        if reservation is None:
            reason = f"could not reserve {request.deployment.num_gpus} GPUs within {request.timeout_s:.0f} s"
            handle.result = TrialResult.failed(TrialStatus.CRASHED, reason, artifacts_dir=request.artifacts_dir)
            self._settled.append(handle)
            return handle
        flight = _Flight(handle=handle, token=uuid.uuid4().hex, reservation=reservation, request=request)
        self._flights[handle] = flight
        self._launch(flight)
        return handle

    def _launch(self, flight: _Flight) -> None:
        res = flight.reservation
        self.capacity(refresh=any(n not in self._addresses for nodes in res.bundle_nodes for n in nodes))
        devices = None
        if self.probe_devices:
            refs = [[self._probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                g, placement_group_bundle_index=b)).remote() for b in range(s.num_gpus)]
                for g, s in zip(res.groups, res.shapes, strict=True)]
            devices = [[ids[0] for ids in ray.get(row)] for row in refs]
        hosts = host_assignments(res.shapes, res.bundle_nodes, self._addresses, devices)
        request = flight.handle.request.model_copy(update={"hosts": hosts})
        flight.request = request
        strategy = PlacementGroupSchedulingStrategy(res.groups[0], placement_group_bundle_index=0,
                                                    placement_group_capture_child_tasks=True)
        agents = addresses = None
        if self.agent_launch:
            nodes = list(dict.fromkeys(n for row in res.bundle_nodes for n in row))
            agents = {n: self._agent(n) for n in nodes}
            addresses = {n: self._addresses.get(n, "127.0.0.1") for n in nodes}
        flight.ref = self._runner.options(scheduling_strategy=strategy).remote(
            self.spec, request.model_dump_json(), flight.token, flight.handle.attempts, agents, addresses)
        flight.started_at = time.monotonic()
        flight.deadline = flight.started_at + request.timeout_s + self.timeout_grace_s
        flight.handle.extra.update(hosts=[h.model_dump() for h in hosts], bundle_nodes=res.bundle_nodes,
                                   token=flight.token)

    def wait(self, handles: Sequence[TrialHandle], timeout_s: float) -> list[TrialHandle]:
        end = time.monotonic() + timeout_s
        finished = [h for h in handles if h in self._settled]
        self._settled = [h for h in self._settled if h not in finished]
        while not finished:
            flights = [self._flights[h] for h in handles if h in self._flights]
            if not flights:
                break
            now = time.monotonic()
            wait_s = max(0.0, min(end, min(f.deadline for f in flights)) - now)
            refs = {f.ref: f for f in flights}
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=wait_s)
            if ready:
                ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
            for ref in ready:
                if self._collect(refs[ref]):
                    finished.append(refs[ref].handle)
            now = time.monotonic()
            for f in flights:
                if f.handle in self._flights and f.ref not in ready and now >= f.deadline:
                    self._kill_timed_out(f)
                    finished.append(f.handle)
            if time.monotonic() >= end:
                break
        return finished

    def _collect(self, flight: _Flight) -> bool:
        """Finish the trial from its runner's answer; False when it was relaunched after its worker died."""
        try:
            result = TrialResult.model_validate_json(ray.get(flight.ref))
        except RayTaskError as exc:  # run_trial catches backend errors: this is a bug in the runner itself
            result = TrialResult.failed(TrialStatus.CRASHED, f"runner error: {str(exc).splitlines()[0][:500]}")
        except RayError as exc:  # the worker, its host or the object died: retry with the same reservation
            reason = f"attempt {flight.handle.attempts}: trial worker died ({type(exc).__name__}: " \
                     f"{_first_line(exc)})"
            flight.reaped_pids += self._reap(flight)
            flight.reasons.append(reason)
            if flight.request.artifacts_dir:  # the dead runner could not remove its pid file
                with contextlib.suppress(OSError):
                    (Path(flight.request.artifacts_dir) / RUNNER_PID).unlink()
            log.warning("trial %s: %s", flight.request.trial_id, reason)
            if flight.handle.attempts <= self.max_retries and self._still_reserved(flight):
                flight.handle.attempts += 1
                self._launch(flight)
                return False
            result = TrialResult.failed(TrialStatus.CRASHED, f"{reason}; gave up after {flight.handle.attempts} "
                                        f"attempts ({self.max_retries} retries)")
        self._finish(flight, result)
        return True

    def _still_reserved(self, flight: _Flight) -> bool:
        """After a host died Ray reschedules the group's bundles: wait for it, then re-read where they are."""
        res = flight.reservation
        ready, _ = ray.wait([g.ready() for g in res.groups], num_returns=len(res.groups), timeout=30.0)
        if len(ready) < len(res.groups):
            return False
        res.bundle_nodes = [self._bundle_nodes(g, s) for g, s in zip(res.groups, res.shapes, strict=True)]
        return all(spread_ok(n, s) for n, s in zip(res.bundle_nodes, res.shapes, strict=True))

    def _kill_timed_out(self, flight: _Flight) -> None:
        self._stop_runner(flight)
        flight.reaped_pids += self._reap(flight)
        timeout_s = flight.request.timeout_s
        self._finish(flight, TrialResult.failed(
            TrialStatus.TIMEOUT, f"no result after {timeout_s:.0f} s (+{self.timeout_grace_s:.0f} s grace): killed "
            f"the trial's worker and {len(set(flight.reaped_pids))} processes it started",
            duration_s=time.monotonic() - flight.started_at))

    def _stop_runner(self, flight: _Flight) -> None:
        if flight.ref is None:
            return
        with contextlib.suppress(Exception):
            ray.cancel(flight.ref, force=True)
        with contextlib.suppress(Exception):  # let the kill land before reaping what the worker started
            ray.wait([flight.ref], timeout=self.kill_grace_s)

    def _agent(self, node_id: str) -> ray.actor.ActorHandle:
        if node_id not in self._agents:
            self._agents[node_id] = ray.remote(HostAgent).options(
                num_cpus=0, max_restarts=-1, max_task_retries=-1,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote()
        return self._agents[node_id]

    def _reap(self, flight: _Flight) -> list[int]:
        """Kill every process the trial started, on every host it had (runs in each host's agent)."""
        nodes = {n for row in flight.reservation.bundle_nodes for n in row}
        killed: list[int] = []
        for node in nodes:
            try:
                killed += ray.get(self._agent(node).reap.remote(flight.token, self.kill_grace_s),
                                  timeout=self.kill_grace_s + 30)
            except (RayActorError, GetTimeoutError) as exc:
                log.warning("host agent on %s could not reap trial %s: %s", node[:8], flight.request.trial_id, exc)
                self._agents.pop(node, None)
        return killed

    def _finish(self, flight: _Flight, result: TrialResult) -> None:
        self._remove(flight.reservation.groups)
        self._flights.pop(flight.handle, None)
        if result.artifacts_dir is None and flight.request.artifacts_dir:
            result = result.model_copy(update={"artifacts_dir": flight.request.artifacts_dir})
        flight.handle.result = result
        flight.handle.extra.update(attempt_reasons=list(flight.reasons), reaped_pids=sorted(set(flight.reaped_pids)))
        if flight.request.artifacts_dir:
            with contextlib.suppress(OSError):
                folder = Path(flight.request.artifacts_dir)
                folder.mkdir(parents=True, exist_ok=True)
                (folder / EXECUTOR_RECORD).write_text(json.dumps({
                    "trial_id": flight.request.trial_id, "attempts": flight.handle.attempts,
                    "attempt_reasons": flight.reasons, "status": result.status.value, "reason": result.reason,
                    "hosts": [h.model_dump() for h in flight.request.hosts],
                    "instances": [{"instance": s.label, "strategy": s.strategy, "bundle_nodes": n}
                                  for s, n in zip(flight.reservation.shapes, flight.reservation.bundle_nodes,
                                                  strict=True)],
                    "reaped_pids": sorted(set(flight.reaped_pids))}, indent=2))

    def cancel(self, handle: TrialHandle) -> None:
        flight = self._flights.get(handle)
        reservation = self._reserved.pop(handle.request.trial_id, None)
        if reservation is not None:
            self._remove(reservation.groups)
        if flight is None:
            handle.result = handle.result or TrialResult.failed(TrialStatus.CRASHED, "cancelled")
            return
        self._stop_runner(flight)
        flight.reaped_pids += self._reap(flight)
        self._finish(flight, TrialResult.failed(TrialStatus.CRASHED, "cancelled"))

    def in_flight(self) -> list[TrialHandle]:
        return list(self._flights)

    def shutdown(self) -> None:
        """Cancel running trials, free every placement group of this executor, stop its host agents."""
        for handle in list(self._flights):
            self.cancel(handle)
        for reservation in self._reserved.values():
            self._remove(reservation.groups)
        self._reserved.clear()
        for agent in self._agents.values():
            with contextlib.suppress(Exception):
                ray.kill(agent)
        self._agents.clear()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__

