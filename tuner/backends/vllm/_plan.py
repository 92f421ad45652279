"""Launch plans: the exact argv and environment of every process a deployment needs, per host.

Pure functions (no processes, no sockets): the same plan is printed by `topotune plan`, started by the
local runner on CPU, and started host by host by the Ray executor on a GPU cluster.

Layout rules (vLLM docs/serving/data_parallel_deployment.md, multi-node serving):
- one host: one `vllm serve` with --tensor-parallel-size/--data-parallel-size;
- DP ranks over several hosts (TP fits in a host): the first host runs the API server and
  `--data-parallel-size-local`, the others add `--data-parallel-start-rank N --headless`, all pointing at
  `--data-parallel-address`/`--data-parallel-rpc-port` of the first host;
- one DP rank whose TP spans hosts (TEP8 on two 4-GPU hosts): `--nnodes/--node-rank/--master-addr/--master-port`,
  `--headless` on node ranks > 0.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tuner.backends._base import HostAssignment
from tuner.deployment import Deployment, InstanceGroup
from tuner.errors import ConfigError
from tuner.topology import Role, Topology

Device = Literal["cuda", "cpu"]
ProcessRole = Literal["prefill", "decode", "both", "router"]


class PlanSettings(BaseModel):
    """What a plan needs besides the deployment and the hosts (all ports are bases, offset per instance)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    vllm_argv: tuple[str, ...] = ("vllm",)
    router_argv: tuple[str, ...] = ("vllm-router",)
    model_path: str
    served_model_name: str = "model"
    device: Device = "cuda"
    bind_host: str = "0.0.0.0"  # what the API servers listen on; clients use the host's address
    api_port_base: int = Field(8100, gt=0, lt=65536)
    router_port: int = Field(8000, gt=0, lt=65536)
    dp_rpc_port_base: int = Field(13345, gt=0, lt=65536)
    master_port_base: int = Field(29500, gt=0, lt=65536)
    nixl_side_channel_port_base: int = Field(5600, gt=0, lt=65536)
    max_model_len: int | None = Field(None, ge=1)
    extra_flags: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    router_policy: str = "round_robin"
    # The PD front: vllm-router (run here for real), or NVIDIA Dynamo (`dynamo.frontend` + `dynamo.vllm` workers
    # registered with it; the argv follows Dynamo's own vLLM launch scripts, not run on this machine).
    front: Literal["vllm-router", "dynamo"] = "vllm-router"
    dynamo_python: tuple[str, ...] = ("python3",)
    router_extra_flags: tuple[str, ...] = ()
    # CPU only: "auto" lets vLLM bind OMP threads; "ids" binds each worker to the core ids given as gpu_ids
    # (measured: two instances or TP2 on a 2-core machine need explicit "0|1" binds).
    cpu_threads_bind: Literal["auto", "ids"] | None = None


class ProcessSpec(BaseModel):
    """One process to start on one host."""

    model_config = ConfigDict(frozen=True)

    name: str  # unique in the plan; used for log file names
    host: str
    argv: tuple[str, ...]
    env: dict[str, str]
    role: ProcessRole
    instance: int | None = None  # index of the vLLM instance in the plan (None for the router)
    port: int | None = None  # the HTTP port it serves (None when headless)
    health_url: str | None = None

    def shell(self) -> str:
        """A copyable command line (display only: processes are always started from argv)."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + shlex.join(self.argv)


class InstancePlacement(BaseModel):
    """The hosts (with their device ids) that one vLLM instance runs on, first host first."""

    model_config = ConfigDict(frozen=True)

    role: Role
    index_in_group: int
    topology: Topology
    hosts: tuple[HostAssignment, ...]


class LaunchPlan(BaseModel):
    """Every process of one deployment. Servers first (in instance order), then the front, if any."""

    model_config = ConfigDict(frozen=True)

    processes: tuple[ProcessSpec, ...]
    endpoint: str  # base URL clients (AIPerf, the accuracy gate) talk to
    placements: tuple[InstancePlacement, ...]

    @property
    def servers(self) -> tuple[ProcessSpec, ...]:
        return tuple(p for p in self.processes if p.role != "router")

    @property
    def fronts(self) -> tuple[ProcessSpec, ...]:
        return tuple(p for p in self.processes if p.role == "router")

    def hosts(self) -> list[str]:
        seen: dict[str, None] = {}
        for p in self.processes:
            seen.setdefault(p.host, None)
        return list(seen)

    def for_host(self, host: str) -> tuple[ProcessSpec, ...]:
        return tuple(p for p in self.processes if p.host == host)


# -- deployment strings -----------------------------------------------------------------------------------

_GROUP = re.compile(r"^(\d+)\s*([PD])\s*:\s*(.+)$", re.IGNORECASE)


def parse_deployment(text: str, *, mtp: int = 0, **engine: object) -> Deployment:
    """'3P:TP4DP2+EP,1D:TEP8' (PD), '2x:TP4' or 'TP4' (aggregated). MTP applies to decode/aggregated only."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise ConfigError("empty deployment", field="deployment", fix="write e.g. TEP8 or 3P:TP4DP2+EP,1D:TEP8")
    if len(parts) == 1 and not _GROUP.match(parts[0]):
        count_match = re.match(r"^(\d+)\s*x\s*:\s*(.+)$", parts[0], re.IGNORECASE)
        count, name = (int(count_match[1]), count_match[2]) if count_match else (1, parts[0])
        return Deployment.single(Topology.parse(name, mtp=mtp, **engine), count=count)
    groups: dict[str, tuple[int, Topology]] = {}
    for part in parts:
        match = _GROUP.match(part)
        if not match:
            raise ConfigError(f"cannot parse {part!r}", field="deployment",
                              fix="write each group as <count>P:<topology> or <count>D:<topology>")
        kind = match[2].upper()
        if kind in groups:
            raise ConfigError(f"two {kind} groups", field="deployment", fix="give one P and one D group")
        topo = Topology.parse(match[3], mtp=mtp if kind == "D" else 0, **engine)
        groups[kind] = (int(match[1]), topo)
    if set(groups) != {"P", "D"}:
        raise ConfigError("a disaggregated deployment needs one P and one D group", field="deployment",
                          fix="write e.g. 1P:TP4,1D:TP4")
    (np, ptopo), (nd, dtopo) = groups["P"], groups["D"]
    return Deployment.disaggregated(ptopo, np, dtopo, nd)


# -- placement ------------------------------------------------------------------------------------------

def _instances(deployment: Deployment) -> list[tuple[InstanceGroup, int]]:
    """Instances in launch order: prefill group, then decode (or the aggregated group)."""
    order = {Role.PREFILL: 0, Role.BOTH: 1, Role.DECODE: 2}
    groups = sorted(deployment.groups, key=lambda g: order[g.role])
    return [(g, i) for g in groups for i in range(g.count)]


def place_instances(deployment: Deployment, hosts: tuple[HostAssignment, ...] | list[HostAssignment]
                    ) -> tuple[InstancePlacement, ...]:
    """Hand the hosts' device ids to the instances in launch order (prefill, then decode).

    `hosts` lists, in order, the devices Ray (or the user) gave the trial; the same address may appear
    several times (one entry per instance share). Devices are consumed in order, so an executor that lists
    each instance's hosts one after the other gets exactly its placement back.
    """
    slots = [(h.address, h.node_id, gpu) for h in hosts for gpu in h.gpu_ids]
    needed = deployment.num_gpus
    if len(slots) < needed:
        raise ConfigError(f"deployment {deployment.name} needs {needed} devices, the hosts give {len(slots)}",
                          field="hosts", fix="assign more hosts or devices to the trial")
    out: list[InstancePlacement] = []
    cursor = 0
    for group, index in _instances(deployment):
        take = slots[cursor:cursor + group.topology.num_gpus]
        cursor += group.topology.num_gpus
        merged: list[HostAssignment] = []
        for address, node_id, gpu in take:
            if merged and (merged[-1].address, merged[-1].node_id) == (address, node_id):  # one node: one host
                last = merged[-1]
                merged[-1] = HostAssignment(address=address, node_id=last.node_id, gpu_ids=(*last.gpu_ids, gpu))
            else:
                merged.append(HostAssignment(address=address, node_id=node_id, gpu_ids=(gpu,)))
        out.append(InstancePlacement(role=group.role, index_in_group=index, topology=group.topology,
                                     hosts=tuple(merged)))
    return tuple(out)


def uniform_hosts(num_gpus: int, gpus_per_host: int, addresses: list[str] | None = None
                  ) -> tuple[HostAssignment, ...]:
    """Hosts filled one after the other (for `topotune plan` and single-machine runs)."""
    count = -(-num_gpus // gpus_per_host)
    names = addresses or [f"host{i}" for i in range(count)]
    if len(names) < count:
        raise ConfigError(f"{num_gpus} devices need {count} hosts of {gpus_per_host}, got {len(names)}",
                          field="--hosts", fix="list more host addresses")
    return tuple(HostAssignment(address=names[i],
                                gpu_ids=tuple(range(min(gpus_per_host, num_gpus - i * gpus_per_host))))
                 for i in range(count))


# -- argv -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Ports:
    api: int
    dp_rpc: int
    master: int
    nixl: int


def _ports(settings: PlanSettings, instance: int, topo: Topology) -> _Ports:
    # NIXL opens one side channel per DP rank at base + dp_rank, so instances are spaced by their DP size.
    return _Ports(api=settings.api_port_base + instance, dp_rpc=settings.dp_rpc_port_base + instance,
                  master=settings.master_port_base + instance,
                  nixl=settings.nixl_side_channel_port_base + instance * max(8, topo.dp))


def _kv_transfer_config(role: Role, device: Device) -> str | None:
    if role is Role.BOTH:
        return None
    config: dict[str, str] = {"kv_connector": "NixlConnector",
                              "kv_role": "kv_producer" if role is Role.PREFILL else "kv_consumer"}
    if device == "cpu":
        config["kv_buffer_device"] = "cpu"
    return json.dumps(config, separators=(",", ":"))


def _device_env(settings: PlanSettings, host: HostAssignment, workers_on_host: int, single_worker: bool
                ) -> dict[str, str]:
    ids = [str(i) for i in host.gpu_ids]
    if settings.device == "cuda":
        return {"CUDA_VISIBLE_DEVICES": ",".join(ids)}
    mode = settings.cpu_threads_bind or ("auto" if single_worker else "ids")
    if mode == "auto":
        return {"VLLM_CPU_OMP_THREADS_BIND": "auto"}
    # One entry per worker on this host, '|'-separated; a worker owning several cores gets a range.
    per_worker = max(1, len(ids) // max(1, workers_on_host))
    chunks = [ids[i:i + per_worker] for i in range(0, len(ids), per_worker)]
    binds = [c[0] if len(c) == 1 else f"{c[0]}-{c[-1]}" for c in chunks]
    return {"VLLM_CPU_OMP_THREADS_BIND": "|".join(binds)}


def _server_processes(settings: PlanSettings, placement: InstancePlacement, instance: int,
                      single_worker: bool, disaggregated: bool) -> list[ProcessSpec]:
    topo = placement.topology
    ports = _ports(settings, instance, topo)
    hosts = placement.hosts
    head = hosts[0].address
    role_name = placement.role.value
    dynamo = settings.front == "dynamo" and disaggregated
    if dynamo:  # a Dynamo worker: vLLM's engine flags, no HTTP server of its own (the frontend serves)
        common = [*settings.dynamo_python, "-m", "dynamo.vllm", "--model", settings.model_path,
                  "--served-model-name", settings.served_model_name, *topo.vllm_flags(),
                  "--disaggregation-mode", role_name]
    else:
        common = [*settings.vllm_argv, "serve", settings.model_path, "--served-model-name",
                  settings.served_model_name, *topo.vllm_flags()]
    if settings.max_model_len:
        common += ["--max-model-len", str(settings.max_model_len)]
    # A phase trial (prefill-only or decode-only sweep) runs without a connector: nothing to transfer to.
    kv = _kv_transfer_config(placement.role, settings.device) if disaggregated else None
    if kv:
        common += ["--kv-transfer-config", kv]
    common += list(settings.extra_flags)

    multi_host = len(hosts) > 1
    spans_tp = multi_host and topo.dp == 1
    if multi_host and not spans_tp:
        sizes = [len(h.gpu_ids) for h in hosts]
        if any(s % topo.tp for s in sizes):
            raise ConfigError(f"{topo.name}: a TP{topo.tp} group would straddle hosts with {sizes} devices",
                              field="hosts", fix="give each host a multiple of TP devices, or use TP <= host size")
    out: list[ProcessSpec] = []
    start_rank = 0
    for node_rank, host in enumerate(hosts):
        argv = list(common)
        primary = node_rank == 0
        workers_here = len(host.gpu_ids)
        if multi_host and spans_tp:
            argv += ["--nnodes", str(len(hosts)), "--node-rank", str(node_rank), "--master-addr", head,
                     "--master-port", str(ports.master)]
        elif multi_host:
            local = len(host.gpu_ids) // topo.tp
            argv += ["--data-parallel-size-local", str(local), "--data-parallel-address", head,
                     "--data-parallel-rpc-port", str(ports.dp_rpc)]
            if not primary:
                argv += ["--data-parallel-start-rank", str(start_rank)]
            start_rank += local
        if primary and not dynamo:
            argv += ["--host", settings.bind_host, "--port", str(ports.api)]
        elif not primary:
            argv.append("--headless")
        env = dict(settings.env)
        env.update(_device_env(settings, host, workers_here, single_worker))
        if kv:
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = host.address
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(ports.nixl)
        if dynamo:
            env["DYN_SYSTEM_PORT"] = str(ports.api)  # the worker's status endpoint
        name = f"{role_name}{placement.index_in_group}" + (f"-node{node_rank}" if multi_host else "")
        out.append(ProcessSpec(
            name=name, host=host.address, argv=tuple(argv), env=env, role=role_name, instance=instance,
            port=ports.api if primary and not dynamo else None,
            health_url=f"http://{_reach(settings, host.address)}:{ports.api}/health"
            if primary and not dynamo else None))
    return out


def _reach(settings: PlanSettings, address: str) -> str:
    """The address clients use for a server on `address`: a server bound to loopback (the CPU path: one
    machine) is only reachable there, whatever address the host has on the cluster (e.g. Ray's node IP)."""
    loopback = settings.bind_host in ("localhost", "::1") or settings.bind_host.startswith("127.")
    return settings.bind_host if loopback else address


def _router(settings: PlanSettings, servers: list[ProcessSpec], disaggregated: bool, host: str) -> ProcessSpec:
    if settings.front == "dynamo" and disaggregated:  # workers register themselves with the frontend
        return ProcessSpec(name="frontend", host=host, role="router", env=dict(settings.env),
                           argv=(*settings.dynamo_python, "-m", "dynamo.frontend", "--http-port",
                                 str(settings.router_port)), port=settings.router_port,
                           health_url=f"http://{_reach(settings, host)}:{settings.router_port}/health")
    argv = [*settings.router_argv, "--host", settings.bind_host, "--port", str(settings.router_port)]
    urls = {role: [f"http://{_reach(settings, p.host)}:{p.port}" for p in servers if p.role == role and p.port]
            for role in ("prefill", "decode", "both")}
    if disaggregated:
        argv.append("--vllm-pd-disaggregation")
        for url in urls["prefill"]:
            argv += ["--prefill", url]
        for url in urls["decode"]:
            argv += ["--decode", url]
    else:
        argv += ["--worker-urls", *urls["both"]]
    argv += ["--policy", settings.router_policy, *settings.router_extra_flags]
    return ProcessSpec(name="router", host=host, argv=tuple(argv), env=dict(settings.env), role="router",
                       port=settings.router_port,
                       health_url=f"http://{_reach(settings, host)}:{settings.router_port}/health")


def build_plan(deployment: Deployment, hosts: tuple[HostAssignment, ...] | list[HostAssignment],
               settings: PlanSettings) -> LaunchPlan:
    """Every process of the deployment on the given hosts; a front (vllm-router) when there is more than one
    API server or prefill/decode are split."""
    placements = place_instances(deployment, hosts)
    single_worker = len(placements) == 1 and placements[0].topology.num_gpus == 1
    servers: list[ProcessSpec] = []
    for instance, placement in enumerate(placements):
        servers += _server_processes(settings, placement, instance, single_worker, deployment.is_disaggregated)
    api_servers = [p for p in servers if p.port]
    if len(api_servers) == 1 and not deployment.is_disaggregated:  # one server: no front
        only = api_servers[0]
        return LaunchPlan(processes=tuple(servers), endpoint=f"http://{_reach(settings, only.host)}:{only.port}",
                          placements=placements)
    front_host = placements[0].hosts[0].address
    router = _router(settings, servers, deployment.is_disaggregated, front_host)
    return LaunchPlan(processes=(*servers, router),
                      endpoint=f"http://{_reach(settings, front_host)}:{settings.router_port}",
                      placements=placements)
