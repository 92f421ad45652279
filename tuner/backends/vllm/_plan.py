"""Launch plans: the exact argv and environment of every process a deployment needs, per host.

Pure functions (no processes; the only lookup is the host-name resolver a caller passes): the same plan is
printed by `topotune plan`, started by the local runner on CPU, started host by host by the Ray executor on a GPU
cluster, and exported as recipes. Version-dependent choices come from _versions.py (one table).

Layout rules (vLLM docs/serving/data_parallel_deployment.md, multi-node serving):
- one host: one `vllm serve` with --tensor-parallel-size/--data-parallel-size;
- DP ranks over several hosts (TP fits in a host): the first host runs the API server and
  `--data-parallel-size-local`, the others add `--data-parallel-start-rank N --headless`, all pointing at
  `--data-parallel-address`/`--data-parallel-rpc-port` of the first host;
- TP spanning whole hosts (TEP8 on two 4-GPU hosts; TP8DP2 on four): `--nnodes/--node-rank/--master-addr/
  --master-port` (plus `--data-parallel-address/--data-parallel-rpc-port` with DP, as srt-slurm's spans-nodes
  path), `--headless` on node ranks > 0; vLLM infers each node's DP rank;
- anything else (a TP group straddling hosts unevenly) is refused with the reason (check_host_split).
PD instances also get: the decode side's speculative config on prefill too, --block-size pinned on both sides,
the hybrid-model settings and the multi-node NVLink UCX settings the targeted version needs, a VLLM_PORT range
per process and host names resolved to addresses.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tuner.backends.vllm._pairing import PairingContext, check_pd_pairing
from tuner.backends.vllm._versions import LaunchRules, entry, launch_rules
from tuner.deployment import Deployment, HostAssignment, InstanceGroup, check_host_split
from tuner.errors import ConfigError, TopologyError
from tuner.hardware import gpu_architecture, has_multi_node_nvlink
from tuner.models import ModelSpec
from tuner.operating_point import OperatingPoint
from tuner.router import DeployedRouterPolicy, RouterPolicy
from tuner.topology import KNOBS, Role, Topology, knob_default

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
    # vLLM scans upward from VLLM_PORT for its internal ports: each server process gets its own range, so
    # processes sharing a host never race for one port (srt-slurm does the same).
    vllm_port_base: int = Field(20000, gt=0, lt=65536)
    vllm_port_stride: int = Field(10, ge=1)
    max_model_len: int | None = Field(None, ge=1)
    extra_flags: tuple[str, ...] = ()
    env: dict[str, str] = Field(default_factory=dict)
    router_policy: DeployedRouterPolicy = RouterPolicy.ROUND_ROBIN
    router_extra_flags: tuple[str, ...] = ()
    # The vLLM version the plan targets (tuner.backends.vllm._versions): None = the newest the table checks.
    vllm_version: str | None = None
    # Hybrid (GDN/mamba) models need their own PD settings (conv-state layout, HMA, TP pairing).
    model_is_hybrid: bool = False
    # GPUs whose NVLink domain spans hosts (GB200/GB300 NVL72): UCX carries NIXL over multi-node NVLink.
    multi_node_nvlink: bool = False
    # --block-size on both PD sides (None: the version table's GPU value on cuda, vLLM's own choice on CPU).
    pd_block_size: int | None = Field(None, ge=1)
    # The GPU catalog's architecture ("blackwell" = SM10x, "hopper"): the attention backend, so the kernel block
    # size the PD pairing check reads (None: blackwell on cuda, cpu on CPU).
    gpu_architecture: str | None = None
    # CPU only: "auto" lets vLLM bind OMP threads; "ids" binds each worker to the core ids given as gpu_ids
    # (measured: two instances or TP2 on a 2-core machine need explicit "0|1" binds).
    cpu_threads_bind: Literal["auto", "ids"] | None = None
    # The workload re-sends prefixes (a trace's hash ids, shared prompts): say --enable-prefix-caching rather than
    # lean on a version's default.
    prefix_caching: bool = False

    def rules(self) -> LaunchRules:
        return launch_rules(self.vllm_version)

    def pairing(self, model: ModelSpec | None) -> PairingContext:
        """What the PD pairing check reads: the model (None: unreadable here, TP rules only), the block size
        pinned on both sides and the attention backend's architecture."""
        cuda = self.device == "cuda"
        return PairingContext(
            model=model, architecture=self.gpu_architecture or ("blackwell" if cuda else "cpu"),
            block_size=self.pd_block_size or (self.rules().pd_block_size_cuda if cuda else None),
            prefix_caching="--no-enable-prefix-caching" not in self.extra_flags,
            hybrid=None if model is not None else self.model_is_hybrid)


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


# -- placement ------------------------------------------------------------------------------------------

def _instances(deployment: Deployment) -> list[tuple[InstanceGroup, int]]:
    """Instances in launch order: prefill group, then decode (or the aggregated group)."""
    return [(g, i) for g in deployment.groups_in_launch_order for i in range(g.count)]


def place_instances(deployment: Deployment, hosts: tuple[HostAssignment, ...] | list[HostAssignment]
                    ) -> tuple[InstancePlacement, ...]:
    """Hand the hosts' device ids to the instances in launch order (prefill, then decode).

    `hosts` lists, in order, the devices Ray (or the user) gave the trial; the same address may appear
    several times (one entry per instance share). Devices are consumed in order, so an executor that lists
    each instance's hosts one after the other gets exactly its placement back. A share vLLM cannot run
    (check_host_split) is refused with the reason.
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
        check_host_split(group.topology, [len(h.gpu_ids) for h in merged])
        out.append(InstancePlacement(role=group.role, index_in_group=index, topology=group.topology,
                                     hosts=tuple(merged)))
    return tuple(out)


def pack_hosts(deployment: Deployment, gpus_per_host: int, addresses: list[str] | None = None
               ) -> tuple[HostAssignment, ...]:
    """Hosts for `topotune plan` and exported recipes: first fit, never splitting a TP group across hosts.

    An instance that fits one host goes whole onto the first host with room; a larger one places DP rank by
    DP rank (each rank inside one host); a TP group larger than a host takes whole new hosts. Listed per
    instance, in launch order, as place_instances consumes them.
    """
    free: list[list[int]] = []
    shares: list[tuple[int, tuple[int, ...]]] = []
    for group, _ in _instances(deployment):
        topo = group.topology
        per_host: dict[int, list[int]] = {}
        if topo.tp > gpus_per_host:
            if topo.tp % gpus_per_host:
                raise TopologyError(f"{topo.name}: TP{topo.tp} cannot span whole hosts of {gpus_per_host} GPUs",
                                    field="deployment", fix=f"use a TP that divides {gpus_per_host} or is a "
                                    f"multiple of it")
            for _ in range(topo.dp * topo.tp // gpus_per_host):
                free.append([])
                per_host[len(free) - 1] = list(range(gpus_per_host))
        else:
            chunks = [topo.num_gpus] if topo.num_gpus <= gpus_per_host else [topo.tp] * topo.dp
            for size in chunks:
                host = next((i for i, f in enumerate(free) if len(f) >= size), None)
                if host is None:
                    free.append(list(range(gpus_per_host)))
                    host = len(free) - 1
                per_host.setdefault(host, []).extend(free[host][:size])
                free[host] = free[host][size:]
        shares += [(host, tuple(ids)) for host, ids in per_host.items()]
    names = addresses or [f"host{i}" for i in range(len(free))]
    if len(names) < len(free):
        raise ConfigError(f"{deployment.name} needs {len(free)} hosts of {gpus_per_host} GPUs, got {len(names)}",
                          field="--hosts", fix="list more host addresses")
    return tuple(HostAssignment(address=names[host], gpu_ids=ids) for host, ids in shares)


def uniform_hosts(num_gpus: int, gpus_per_host: int, addresses: list[str] | None = None
                  ) -> tuple[HostAssignment, ...]:
    """Hosts filled one after the other (single-instance runs on one machine)."""
    count = -(-num_gpus // gpus_per_host)
    names = addresses or [f"host{i}" for i in range(count)]
    if len(names) < count:
        raise ConfigError(f"{num_gpus} devices need {count} hosts of {gpus_per_host}, got {len(names)}",
                          field="--hosts", fix="list more host addresses")
    return tuple(HostAssignment(address=names[i],
                                gpu_ids=tuple(range(min(gpus_per_host, num_gpus - i * gpus_per_host))))
                 for i in range(count))


# -- addresses ------------------------------------------------------------------------------------------

Resolver = Callable[[str], str]


def keep_names(address: str) -> str:
    """For printed plans with placeholder hosts (host0, host1): the names stay as written."""
    return address


def resolve_address(address: str) -> str:
    """A host name as the IPv4 address the other hosts use: NIXL's side channel and vLLM's DP/torch rendezvous
    take addresses, and a name can resolve differently (or not at all) on another host."""
    try:
        ipaddress.ip_address(address)
        return address
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(address, None, socket.AF_INET)[0][4][0]
    except (OSError, IndexError):
        raise ConfigError(f"host {address!r} does not resolve to an address", field="hosts",
                          fix="give the host's IP address, or a name every host resolves") from None


def _check_resolved(resolved: dict[str, str]) -> None:
    """Hosts on a network, one of them resolved to loopback (e.g. Debian's 127.0.1.1 hostname line): the
    others would dial themselves. (All on loopback is one machine standing in for several: fine.)"""
    loopback = {name: a for name, a in resolved.items() if a.startswith("127.") or a == "::1"}
    if loopback and len(loopback) < len(resolved):
        name, address = next(iter(loopback.items()))
        raise ConfigError(f"host {name!r} resolves to loopback {address} in a plan whose other hosts are on the "
                          "network", field="hosts", fix="give each host's cluster IP address")


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


@dataclass(frozen=True)
class _PlanContext:
    """What every server process of one plan shares."""

    settings: PlanSettings
    rules: LaunchRules
    disaggregated: bool
    single_worker: bool
    address: dict[str, str]  # host as placed -> address the other hosts dial


def topology_flags(topo: Topology) -> list[str]:
    """A topology's engine flags: each knob as its Knob prints it, in Topology's field order (`_engine_flags` adds
    the version-, role- and deployment-dependent ones, the CUDA-graph capture size among them)."""
    return [flag for name, knob in KNOBS.items() if not knob.by_plan
            for flag in knob.vllm_flags(getattr(topo, name), knob_default(name))]


def _engine_flags(ctx: _PlanContext, topo: Topology, kv: str | None) -> list[str]:
    """The flags every process of one instance shares (model, engine limits, PD settings)."""
    s, rules = ctx.settings, ctx.rules
    flags = topology_flags(topo)
    if s.device == "cuda" and topo.cudagraph_capture_tokens:
        flags += [rules.cudagraph_flag, str(topo.cudagraph_capture_tokens)]
    if s.max_model_len:
        flags += ["--max-model-len", str(s.max_model_len)]
    if kv:
        flags += ["--kv-transfer-config", kv]
        block = s.pd_block_size or (rules.pd_block_size_cuda if s.device == "cuda" else None)
        if block:  # vLLM's automatic block size depends on TP for hybrid models: pin it on both sides
            flags += ["--block-size", str(block)]
        if s.model_is_hybrid:
            flags += list(rules.hybrid_pd_flags)
    if s.prefix_caching:
        flags += ["--enable-prefix-caching"]
    return [*flags, *s.extra_flags]


def _process_env(ctx: _PlanContext, host: HostAssignment, ports: _Ports, kv: bool, vllm_port: int) -> dict[str, str]:
    s = ctx.settings
    env = dict(s.env)
    env.update(_device_env(s, host, len(host.gpu_ids), ctx.single_worker))
    env["VLLM_PORT"] = str(vllm_port)
    if kv:
        env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = ctx.address[host.address]
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(ports.nixl)
        if s.model_is_hybrid:
            env.update(ctx.rules.hybrid_pd_env)
        if s.device == "cuda" and s.multi_node_nvlink:
            env.update(ctx.rules.ucx_multi_node_nvlink_env)
    return env


def _server_processes(ctx: _PlanContext, placement: InstancePlacement, instance: int, first_process: int
                      ) -> list[ProcessSpec]:
    """One `vllm serve` per host of the instance: the first serves HTTP, the others run --headless."""
    s = ctx.settings
    topo = placement.topology
    ports = _ports(s, instance, topo)
    hosts = placement.hosts
    head = ctx.address[hosts[0].address]
    role_name = placement.role.value
    # A phase trial (prefill-only or decode-only sweep) runs without a connector: nothing to transfer to.
    kv = _kv_transfer_config(placement.role, s.device) if ctx.disaggregated else None
    common = [*s.vllm_argv, "serve", s.model_path, "--served-model-name", s.served_model_name,
              *_engine_flags(ctx, topo, kv)]
    multi_host = len(hosts) > 1
    spans_tp = multi_host and topo.tp > len(hosts[0].gpu_ids)
    out: list[ProcessSpec] = []
    start_rank = 0
    for node_rank, host in enumerate(hosts):
        argv = list(common)
        primary = node_rank == 0
        if spans_tp:  # TP over whole hosts, with or without DP (vLLM infers each node's DP rank)
            argv += ["--nnodes", str(len(hosts)), "--node-rank", str(node_rank), "--master-addr", head,
                     "--master-port", str(ports.master)]
            if topo.dp > 1:
                argv += ["--data-parallel-address", head, "--data-parallel-rpc-port", str(ports.dp_rpc)]
        elif multi_host:
            local = len(host.gpu_ids) // topo.tp
            argv += ["--data-parallel-size-local", str(local), "--data-parallel-address", head,
                     "--data-parallel-rpc-port", str(ports.dp_rpc)]
            if not primary:
                argv += ["--data-parallel-start-rank", str(start_rank)]
            start_rank += local
        if primary:
            argv += ["--host", s.bind_host, "--port", str(ports.api)]
        else:
            argv.append("--headless")
        env = _process_env(ctx, host, ports, kv is not None,
                           s.vllm_port_base + s.vllm_port_stride * (first_process + node_rank))
        name = f"{role_name}{placement.index_in_group}" + (f"-node{node_rank}" if multi_host else "")
        out.append(ProcessSpec(
            name=name, host=host.address, argv=tuple(argv), env=env, role=role_name, instance=instance,
            port=ports.api if primary else None,
            health_url=f"http://{_reach(s, host.address)}:{ports.api}/health" if primary else None))
    return out


def _reach(settings: PlanSettings, address: str) -> str:
    """The address clients use for a server on `address`: a server bound to loopback (the CPU path: one
    machine) is only reachable there, whatever address the host has on the cluster (e.g. Ray's node IP)."""
    loopback = settings.bind_host in ("localhost", "::1") or settings.bind_host.startswith("127.")
    return settings.bind_host if loopback else address


def _router(settings: PlanSettings, servers: list[ProcessSpec], disaggregated: bool, host: str) -> ProcessSpec:
    # vllm-router binds a Prometheus exporter beside its port, at 127.0.0.1:29000 unless told (vllm-router 0.1.17
    # router_args.py `--prometheus-port`, default=29000): a second router on the host, or a server the port block put
    # at 29000, then makes it exit with "Address already in use". The port after the router's is in the trial's block.
    argv = [*settings.router_argv, "--host", settings.bind_host, "--port", str(settings.router_port),
            "--prometheus-port", str(settings.router_port + 1)]
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
    argv += ["--policy", settings.router_policy.value, *settings.router_extra_flags]
    return ProcessSpec(name="router", host=host, argv=tuple(argv), env=dict(settings.env), role="router",
                       port=settings.router_port,
                       health_url=f"http://{_reach(settings, host)}:{settings.router_port}/health")


def check_engine_flags(deployment: Deployment, rules: LaunchRules) -> None:
    """Refuse an engine setting the targeted vLLM has no flag for, naming the version that adds it."""
    for group in deployment.groups:
        if group.topology.stream_interval != 1 and not rules.stream_interval_flag:
            since = entry("stream_interval_flag").since
            raise ConfigError(f"vLLM {rules.version} has no --stream-interval (stream_interval "
                              f"{group.topology.stream_interval})", field="stream_interval",
                              fix=f"use stream_interval 1, or target vLLM >= {since}")
        backend = group.topology.all2all_backend
        if backend.startswith("flashinfer_nvlink") and not rules.flashinfer_nvlink_all2all:
            since = entry("flashinfer_nvlink_all2all").since
            raise ConfigError(f"vLLM {rules.version} has no --all2all-backend {backend}", field="all2all_backend",
                              fix=f"use allgather_reducescatter or a DeepEP backend, or target vLLM >= {since}")


def check_wide_ep(placements: tuple[InstancePlacement, ...], settings: PlanSettings) -> None:
    """An EP all-to-all between hosts needs a kernel that speaks RDMA (DeepEP, or vLLM's NCCL gather):
    FlashInfer's NVLink all-to-alls reach another host only over multi-node NVLink (GB200/GB300 NVL72)."""
    for placement in placements:
        backend = placement.topology.all2all_backend
        if len(placement.hosts) > 1 and backend.startswith("flashinfer_nvlink") and not settings.multi_node_nvlink:
            raise ConfigError(f"{placement.topology.name} spans {len(placement.hosts)} hosts without multi-node "
                              f"NVLink, and --all2all-backend {backend} moves tokens over NVLink only",
                              field="all2all_backend",
                              fix="across hosts use deepep_high_throughput (prefill) or deepep_low_latency "
                                  "(decode, and with --enable-dbo), or keep the EP group inside one host")


def build_plan(deployment: Deployment, hosts: tuple[HostAssignment, ...] | list[HostAssignment],
               settings: PlanSettings, *, resolve: Resolver = resolve_address, model: ModelSpec | None = None
               ) -> LaunchPlan:
    """Every process of the deployment on the given hosts; a front (vllm-router) when there is more than one
    API server or prefill/decode are split. `resolve` turns each host into the address the other hosts dial
    (`keep_names` for printed plans over placeholder hosts). `model` (the served model's spec) lets the PD
    pairing check read its KV heads, hybrid family and block sizes (tuner.backends.vllm._pairing)."""
    rules = settings.rules()
    check_pd_pairing(deployment, rules, settings.pairing(model))
    check_engine_flags(deployment, rules)
    placements = place_instances(deployment, hosts)
    check_wide_ep(placements, settings)
    names = list(dict.fromkeys(h.address for p in placements for h in p.hosts))
    address = {name: resolve(name) for name in names}
    _check_resolved(address)
    ctx = _PlanContext(settings=settings, rules=rules, disaggregated=deployment.is_disaggregated,
                       single_worker=len(placements) == 1 and placements[0].topology.num_gpus == 1,
                       address=address)
    servers: list[ProcessSpec] = []
    for instance, placement in enumerate(placements):
        servers += _server_processes(ctx, placement, instance, first_process=len(servers))
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


def model_or_none(model_path: str) -> ModelSpec | None:
    """The model's spec, None when its config cannot be read (a hub id on a machine without the weights: the
    trial's own start-up then says what is wrong)."""
    try:
        from tuner.models import load_model

        return load_model(model_path)
    except Exception:  # any unreadable config: plan as for a plain transformer
        return None



def plan_settings(*, model_path: str, gpu: str | None, device: Device = "cuda", model: ModelSpec | None = None,
                  hybrid: bool | None = None, **rest: object) -> PlanSettings:
    """The one builder of PlanSettings: what the GPU decides (its architecture, multi-node NVLink) and what the
    model decides (hybrid PD settings; `hybrid` overrides it) derived here, the rest passed through. A trial, a
    printed plan, a recipe and the PD composition all build theirs here, so they cannot drift apart."""
    return PlanSettings(
        model_path=model_path, device=device,
        model_is_hybrid=(model is not None and model.is_hybrid) if hybrid is None else hybrid,
        multi_node_nvlink=has_multi_node_nvlink(device, gpu) if gpu else False,
        gpu_architecture=gpu_architecture(gpu) if gpu and device == "cuda" else None,
        **rest)  # type: ignore[arg-type]


def point_plan_settings(point: OperatingPoint, *, model: ModelSpec | None = None, **rest: object) -> PlanSettings:
    """The settings of an operating point's plan: its model, name, context, vLLM version, prefix caching and
    router policy (`rest`: the executables, ports, hosts' settings)."""
    extra = tuple(rest.pop("extra_flags", ()))  # type: ignore[arg-type]
    if point.prefix_caching is False:
        extra += ("--no-enable-prefix-caching",)
    return plan_settings(model_path=point.model_path, gpu=point.gpu, model=model,
                         served_model_name=point.served_model_name, max_model_len=point.max_model_len,
                         vllm_version=point.vllm_version, prefix_caching=point.prefix_caching is True,
                         router_policy=point.router.policy, extra_flags=extra, **rest)

