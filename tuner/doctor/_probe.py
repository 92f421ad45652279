"""What one node has: GPUs, the model folder, the executables and their versions, NIXL/UCX, free ports, IMEX.

`probe_node` runs on the node itself (a Ray task pinned to it, or in this process for a local run) and only
gathers facts; judging them against the search space is tuner.doctor._checks' job. Every probe is bounded in
time and never raises: what went wrong is part of the facts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from pydantic import BaseModel, ConfigDict

IMEX_CHANNELS_DIR = Path("/dev/nvidia-caps-imex-channels")
RDMA_CLASS_DIR = Path("/sys/class/infiniband")  # one entry per RDMA device (InfiniBand or RoCE) the kernel sees
NVIDIA_PARAMS = Path("/proc/driver/nvidia/params")  # the driver's module parameters
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")
_VERSION_TEXT = re.compile(r"\d+\.\d+(?:\.\d+)?[\w.+-]*")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class ProbeRequest(_Frozen):
    """What to look at on every node (the driver fills it from the space and the backend settings)."""

    model_path: str  # "" when none was given (the model check is then a warning)
    tools: dict[str, tuple[str, ...]]  # name -> argv prefix ("vllm", "aiperf", "vllm-router")
    port_base: int | None = None  # the settings' fixed block, else any free block is looked for
    port_block: int = 200
    timeout_s: float = 900.0  # wall clock cap per tool run (its CPU use decides first: _run)
    deepep: bool = False  # import DeepEP in vLLM's Python (a space whose EP all-to-all crosses hosts on DeepEP)


class ToolFacts(_Frozen):
    name: str
    argv: tuple[str, ...]
    path: str = ""  # resolved executable ("" when not found)
    ran: bool = False  # `--version` (or `--help`) exited 0
    version: str = ""
    error: str = ""


class ModelFacts(_Frozen):
    path: str
    exists: bool = False
    config_ok: bool = False
    weight_files: int = 0
    weight_bytes: int = 0
    unreadable: tuple[str, ...] = ()
    error: str = ""


class NixlFacts(_Frozen):
    version: str = ""
    plugins: tuple[str, ...] = ()
    error: str = ""


class DeepEPFacts(_Frozen):
    """DeepEP and NVSHMEM in vLLM's Python (what --all2all-backend deepep_* imports)."""

    deep_ep: str = ""  # version ("" when not importable)
    nvshmem: str = ""  # the nvidia-nvshmem wheel's version ("" when absent)
    error: str = ""


class RdmaDevice(_Frozen):
    name: str  # e.g. mlx5_0
    link_layer: str = ""  # InfiniBand or Ethernet (RoCE), port 1
    state: str = ""  # e.g. "4: ACTIVE"


class PortFacts(_Frozen):
    base: int = 0
    size: int = 0
    busy: tuple[int, ...] = ()
    error: str = ""


class NodeFacts(_Frozen):
    """Everything the checks read about one node."""

    node: str  # host name
    address: str
    node_id: str = ""
    cpu_count: int = 0
    gpus: tuple[str, ...] = ()  # physical GPUs (nvidia-smi -L lines or /dev/nvidiaN)
    gpu_source: str = "none"
    imex_channels: tuple[str, ...] = ()
    model: ModelFacts
    tools: dict[str, ToolFacts]
    nixl: NixlFacts
    ports: PortFacts
    rdma_devices: tuple[RdmaDevice, ...] = ()
    stream_mem_ops: bool | None = None  # NVreg_EnableStreamMemOPs=1 (IBGDA, DeepEP's internode kernels); None: unread
    deepep: DeepEPFacts = DeepEPFacts(error="not probed")


# A tool's run is judged by its CPU use, not by the clock: on a loaded host `vllm --version` (an import of ~12 CPU
# seconds) took over 180 s of wall time, and a wall-clock limit called a working vLLM broken. A run is stopped
# when it has used TOOL_CPU_LIMIT_S of CPU (a loop), or used none for TOOL_STALL_S (it waits on something that
# does not come: a lock, a network); ProbeRequest.timeout_s caps it in any case.
TOOL_CPU_LIMIT_S = 180.0
TOOL_STALL_S = 180.0
_PROGRESS_CPU_S = 0.05  # CPU used since the last check that counts as progress


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc; 0 where unreadable: then only the clock limits it)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _run(argv: list[str], timeout_s: float, cpu_limit_s: float = TOOL_CPU_LIMIT_S,
         stall_s: float = TOOL_STALL_S) -> tuple[int, str]:
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                text=True)
    except OSError as exc:
        return -1, f"{type(exc).__name__}: {exc}"
    started = progressed = time.monotonic()
    cpu_seen = 0.0
    while True:
        try:
            out, err = proc.communicate(timeout=1.0)
            return proc.returncode, (out + "\n" + err).strip()
        except subprocess.TimeoutExpired:
            now, cpu_s = time.monotonic(), _cpu_seconds(proc.pid)
            if cpu_s - cpu_seen >= _PROGRESS_CPU_S:
                cpu_seen, progressed = cpu_s, now
            if cpu_s >= cpu_limit_s:
                why = "its CPU budget"
            elif now - progressed >= stall_s:
                why = f"no CPU use for {now - progressed:.0f} s"
            elif now - started >= timeout_s:
                why = "the time limit"
            else:
                continue
            proc.kill()
            proc.communicate()
            return -1, f"timed out after {now - started:.0f} s ({cpu_s:.0f} CPU s): {why}"


def _gpus() -> tuple[tuple[str, ...], str]:
    """Physical GPUs: nvidia-smi -L when present, else /dev/nvidiaN device files (Ray's GPU resource can be
    logical, so it is not asked)."""
    if shutil.which("nvidia-smi"):
        code, out = _run(["nvidia-smi", "-L"], 30)
        if code == 0:
            return tuple(line.strip() for line in out.splitlines() if line.startswith("GPU ")), "nvidia-smi"
    devices = sorted(p.name for p in Path("/dev").glob("nvidia[0-9]*"))
    return tuple(devices), "/dev" if devices else "none"


def _model(path: str) -> ModelFacts:
    """The folder exists, config.json parses, every weight file opens and its first bytes read."""
    if not path:
        return ModelFacts(path="", error="no model given")
    folder = Path(path)
    if not folder.is_dir():
        return ModelFacts(path=path, error=f"{path} is not a folder on this node" if not folder.exists()
                          else f"{path} is a file, not a model folder")
    try:
        json.loads((folder / "config.json").read_text())
        config_ok = True
        error = ""
    except (OSError, ValueError) as exc:
        config_ok, error = False, f"config.json: {type(exc).__name__}: {exc}"
    files = [p for p in folder.rglob("*") if p.suffix in _WEIGHT_SUFFIXES and p.is_file()]
    unreadable, size = [], 0
    for file in files:
        try:
            with file.open("rb") as fh:
                fh.read(8)
            size += file.stat().st_size
        except OSError as exc:
            unreadable.append(f"{file.name}: {exc.strerror or exc}")
    return ModelFacts(path=path, exists=True, config_ok=config_ok, weight_files=len(files), weight_bytes=size,
                      unreadable=tuple(unreadable[:5]), error=error)


def _resolve(executable: str) -> str:
    if os.sep in executable:
        return executable if os.access(executable, os.X_OK) else ""
    return shutil.which(executable) or ""


def _interpreter(path: str) -> str:
    """The Python behind an executable ("" when there is none), as the version table reads it."""
    from tuner.backends.vllm import python_of

    return python_of(path) or ""


def _distribution_version(python: str, names: tuple[str, ...], timeout_s: float) -> str:
    from tuner.backends.vllm import DISTRIBUTION_VERSION_CODE

    code, out = _run([python, "-c", DISTRIBUTION_VERSION_CODE, *names], timeout_s)
    return out.splitlines()[-1].strip() if code == 0 and out else ""


def _tool(name: str, argv: tuple[str, ...], timeout_s: float) -> ToolFacts:
    """Run the tool: `--version` for vllm and aiperf (it imports them: the real test), `--help` for
    vllm-router (it has no --version; its version comes from its Python's package metadata)."""
    path = _resolve(argv[0]) if argv else ""
    if not path:
        where = "not executable" if argv and os.sep in argv[0] and Path(argv[0]).exists() else "not found"
        return ToolFacts(name=name, argv=argv, error=f"{argv[0] if argv else name} {where}")
    flag = "--help" if name == "vllm-router" else "--version"
    code, out = _run([path, *argv[1:], flag], timeout_s)
    if code != 0:
        return ToolFacts(name=name, argv=argv, path=path, error=f"`{' '.join((*argv, flag))}` exited {code}: "
                                                                    f"{out.splitlines()[-1][:300] if out else ''}")
    version = ""
    if name == "vllm-router":
        python = _interpreter(path)
        version = _distribution_version(python, ("vllm-router",), timeout_s) if python else ""
    else:
        found = [line for line in out.splitlines() if _VERSION_TEXT.fullmatch(line.strip())]
        version = found[-1].strip() if found else (_VERSION_TEXT.findall(out) or [""])[-1]
    return ToolFacts(name=name, argv=argv, path=path, ran=True, version=version)


_NIXL_SNIPPET = """
import importlib.metadata as m
from nixl._api import nixl_agent, nixl_agent_config
agent = nixl_agent("topotune-doctor", nixl_agent_config(backends=[]))
print("NIXL", m.version("nixl"), " ".join(agent.get_plugin_list()))
"""


def _nixl(vllm: ToolFacts, timeout_s: float) -> NixlFacts:
    """NIXL importable in vLLM's Python, and its plugins (UCX is the one vLLM's NixlConnector uses)."""
    python = _interpreter(vllm.path) if vllm.path else ""
    if not python:
        return NixlFacts(error="vLLM's Python not found" if not vllm.path else
                         f"cannot tell which Python runs {vllm.path}")
    code, out = _run([python, "-c", _NIXL_SNIPPET], timeout_s)
    line = next((ln for ln in out.splitlines() if ln.startswith("NIXL ")), "")
    if code != 0 or not line:
        return NixlFacts(error=f"importing nixl in {python} failed: {out.splitlines()[-1][:300] if out else code}")
    _, version, *plugins = line.split()
    return NixlFacts(version=version, plugins=tuple(plugins))


_DEEPEP_SNIPPET = """
import importlib.metadata as m
def version(*names):
    for name in names:
        try:
            return m.version(name)
        except m.PackageNotFoundError:
            pass
    return "-"
import deep_ep
print("DEEPEP", version("deep_ep", "deep-ep"), version("nvidia-nvshmem-cu12", "nvidia-nvshmem-cu13", "nvshmem"))
"""


def _deepep(vllm: ToolFacts, timeout_s: float) -> DeepEPFacts:
    """deep_ep importable in vLLM's Python, and the NVSHMEM wheel it links against."""
    python = _interpreter(vllm.path) if vllm.path else ""
    if not python:
        return DeepEPFacts(error="vLLM's Python not found")
    code, out = _run([python, "-c", _DEEPEP_SNIPPET], timeout_s)
    line = next((ln for ln in out.splitlines() if ln.startswith("DEEPEP ")), "")
    if code != 0 or not line:
        return DeepEPFacts(error=f"importing deep_ep in {python} failed: "
                                 f"{out.splitlines()[-1][:300] if out else code}")
    _, deep_ep, nvshmem = line.split()
    return DeepEPFacts(deep_ep=deep_ep if deep_ep != "-" else "unknown", nvshmem="" if nvshmem == "-" else nvshmem)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def rdma_devices(root: Path = RDMA_CLASS_DIR) -> tuple[RdmaDevice, ...]:
    """The node's RDMA devices with port 1's link layer and state (sysfs; empty without any)."""
    if not root.is_dir():
        return ()
    return tuple(RdmaDevice(name=d.name, link_layer=_read(d / "ports" / "1" / "link_layer"),
                            state=_read(d / "ports" / "1" / "state")) for d in sorted(root.iterdir()))


def stream_mem_ops(params: Path = NVIDIA_PARAMS) -> bool | None:
    """The driver's EnableStreamMemOPs (IBGDA needs 1: vLLM's tools/ep_kernels/configure_system_drivers.sh)."""
    for line in _read(params).splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "EnableStreamMemOPs":
            return value.strip() == "1"
    return None


def _ports(base: int | None, size: int) -> PortFacts:
    """The fixed block's busy ports, or a free block (what a trial here would get: a random free one)."""
    if base is None:
        from tuner.launch import free_port_block

        try:
            return PortFacts(base=free_port_block(size, host="0.0.0.0"), size=size)
        except RuntimeError as exc:
            return PortFacts(size=size, error=str(exc))
    busy = []
    for port in range(base, base + size):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                busy.append(port)
    return PortFacts(base=base, size=size, busy=tuple(busy))


def probe_node(request: ProbeRequest, node_id: str = "") -> NodeFacts:
    """Gather this node's facts (tools run in parallel: `vllm --version` alone takes ~30 s on a busy CPU)."""
    with ThreadPoolExecutor(max_workers=max(1, len(request.tools))) as pool:
        futures = {name: pool.submit(_tool, name, argv, request.timeout_s) for name, argv in request.tools.items()}
        model = _model(request.model_path)
        gpus, source = _gpus()
        ports = _ports(request.port_base, request.port_block)
        tools = {name: f.result() for name, f in futures.items()}
    vllm = tools.get("vllm")
    nixl = _nixl(vllm, request.timeout_s) if vllm is not None and vllm.ran else NixlFacts(error="vLLM did not run")
    deepep = (_deepep(vllm, request.timeout_s) if request.deepep and vllm is not None and vllm.ran
              else DeepEPFacts(error="not probed" if not request.deepep else "vLLM did not run"))
    channels = tuple(sorted(p.name for p in IMEX_CHANNELS_DIR.glob("channel*"))) if IMEX_CHANNELS_DIR.is_dir() \
        else ()
    hostname = socket.gethostname()
    try:
        address = socket.gethostbyname(hostname)
    except OSError:
        address = "127.0.0.1"
    return NodeFacts(node=hostname, address=address, node_id=node_id, cpu_count=os.cpu_count() or 0, gpus=gpus,
                     gpu_source=source, imex_channels=channels, model=model, tools=tools, nixl=nixl, ports=ports,
                     rdma_devices=rdma_devices(), stream_mem_ops=stream_mem_ops(), deepep=deepep)
