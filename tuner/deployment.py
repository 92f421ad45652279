"""A deployment: one or more vLLM instances per role (aggregated, or prefill/decode disaggregated), how it is
written (`parse_deployment`: '3P:TP4DP2+EP,1D:TEP8', or as `frontier` prints it), and the placement rules every
layer shares: the order instances launch in, where a trial's devices are
(`HostAssignment`), and how one instance may be split over hosts (`check_host_split`).

These live here, below the executors and the backends, so an executor places instances by the same rules the
launch plan checks without importing a backend.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from functools import reduce

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.errors import ConfigError, TopologyError
from tuner.topology import Role, Topology


def at_decode_mtp(prefill: Topology, decode_mtp: int) -> Topology:
    """A PD prefill instance at its decode side's MTP depth: NIXL's handshake compares both sides' speculative
    config (vLLM PR #49230), so a prefill always runs the decode's depth, whoever builds the pair (a plan, a
    composition, an export); its prompt speed barely changes, so a point predicted or measured at one depth stands
    for every depth."""
    return prefill if prefill.mtp == decode_mtp else prefill.model_copy(update={"mtp": decode_mtp})


def at_decode_depths(prefill: Sequence[tuple], depths: Sequence[int]) -> list[tuple]:
    """Prefill points `(topology, *rest)` once per decode MTP depth (at_decode_mtp), to pair with every decode."""
    return [(at_decode_mtp(t, d), *rest) for t, *rest in prefill for d in depths]


# Instances launch prefill first, then aggregated, then decode: the order a trial's hosts are listed in, so an
# executor that lists each instance's hosts one after the other hands the launch plan exactly its placement.
LAUNCH_ORDER = {Role.PREFILL: 0, Role.BOTH: 1, Role.DECODE: 2}


class HostAssignment(BaseModel):
    """Where the executor placed one host's share of a deployment (its address, Ray node and device ids)."""

    model_config = ConfigDict(frozen=True)

    address: str = "127.0.0.1"
    node_id: str = ""
    gpu_ids: tuple[int, ...] = ()


def check_host_split(topo: Topology, shares: Sequence[int]) -> None:
    """Refuse a split of one instance over hosts that vLLM cannot run (shares: devices per host, head first).

    A TP group either fits in one host (each host then holds whole DP ranks: `--data-parallel-size-local`) or
    spans whole hosts: every host holds the same share and TP is a multiple of it, so vLLM's
    local world size (world // --nnodes) is every host's share (vllm/engine/arg_utils.py); with DP > 1 that
    is srt-slurm's "spans nodes" layout, dp x (tp / share) hosts. The executors re-place a split this refuses;
    the launch plan refuses it with the reason.
    """
    if len(shares) <= 1:
        return
    fix = "give each host whole TP groups (TP <= devices per host) or TP over whole, equal hosts"
    if topo.tp <= max(shares):
        if any(s % topo.tp for s in shares):
            raise TopologyError(f"{topo.name}: a TP{topo.tp} group would straddle hosts with {list(shares)} "
                                "devices; a TP group must fit in one host or span whole hosts",
                                field="hosts", fix=fix)
        return
    share = shares[0]
    if any(s != share for s in shares) or topo.tp % share:
        raise TopologyError(f"{topo.name}: TP{topo.tp} spans hosts unevenly ({list(shares)} devices); vLLM runs "
                            f"world // --nnodes workers on every host, so each host must hold the same share and "
                            "TP must be a multiple of it", field="hosts", fix=fix)
    if len(shares) != topo.dp * topo.tp // share:
        raise TopologyError(f"{topo.name}: {len(shares)} hosts of {share} devices do not hold DP{topo.dp} ranks "
                            f"of TP{topo.tp}", field="hosts", fix=fix)


class InstanceGroup(BaseModel):
    """`count` identical vLLM instances of one role."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role
    topology: Topology
    count: int = Field(1, ge=1)

    @property
    def num_gpus(self) -> int:
        return self.count * self.topology.num_gpus


class Deployment(BaseModel):
    """What a trial launches. Aggregated: one group of role `both`. PD: one prefill and one decode group.

    A phase trial (prefill-only or decode-only sweep) is a single group of that role.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    groups: tuple[InstanceGroup, ...] = Field(min_length=1, max_length=2)

    @model_validator(mode="after")
    def _roles(self) -> Deployment:
        roles = [g.role for g in self.groups]
        if len(set(roles)) != len(roles):
            raise ValueError("one instance group per role")
        if len(roles) == 2 and set(roles) != {Role.PREFILL, Role.DECODE}:
            raise ValueError("two groups must be one prefill and one decode")
        prefill, decode = self.group(Role.PREFILL), self.group(Role.DECODE)
        if prefill and decode and prefill.topology.mtp != decode.topology.mtp:
            same = prefill.model_copy(update={"topology": at_decode_mtp(prefill.topology, decode.topology.mtp)})
            object.__setattr__(self, "groups", tuple(same if g.role is Role.PREFILL else g for g in self.groups))
        return self

    @classmethod
    def single(cls, topology: Topology, count: int = 1) -> Deployment:
        return cls(groups=(InstanceGroup(role=topology.role, topology=topology, count=count),))

    @classmethod
    def disaggregated(cls, prefill: Topology, num_prefill: int, decode: Topology, num_decode: int) -> Deployment:
        return cls(groups=(
            InstanceGroup(role=Role.PREFILL, topology=prefill.model_copy(update={"role": Role.PREFILL}),
                          count=num_prefill),
            InstanceGroup(role=Role.DECODE, topology=decode.model_copy(update={"role": Role.DECODE}),
                          count=num_decode)))

    def group(self, role: Role) -> InstanceGroup | None:
        return next((g for g in self.groups if g.role is role), None)

    def with_decode_seqs(self, max_num_seqs: int) -> Deployment:
        """The decode (or aggregated) instances capped at `max_num_seqs` running requests per DP rank: the batch
        that holds an SLA (the prefill side keeps its own)."""
        return self.model_copy(update={"groups": tuple(
            g if g.role is Role.PREFILL else g.model_copy(update={"topology": g.topology.model_copy(
                update={"max_num_seqs": max_num_seqs})}) for g in self.groups)})

    @property
    def groups_in_launch_order(self) -> tuple[InstanceGroup, ...]:
        """The groups as instances launch and hosts are listed: prefill, aggregated, decode (LAUNCH_ORDER)."""
        return tuple(sorted(self.groups, key=lambda g: LAUNCH_ORDER[g.role]))

    @property
    def is_disaggregated(self) -> bool:
        return self.group(Role.PREFILL) is not None and self.group(Role.DECODE) is not None

    @property
    def num_gpus(self) -> int:
        return sum(g.num_gpus for g in self.groups)

    @property
    def unit(self) -> Deployment:
        """The smallest deployment of the same shape, every count over the counts' gcd (4P2D -> 2P1D): what a
        deployment scales by."""
        scale = reduce(math.gcd, (g.count for g in self.groups))
        return self.model_copy(update={"groups": tuple(
            g.model_copy(update={"count": g.count // scale}) for g in self.groups)})

    @property
    def name(self) -> str:
        """'3P(TP4DP2+EP) 1D(TEP8 MTP3)', or the topology alone for one instance."""
        if len(self.groups) == 1 and self.groups[0].count == 1:
            g = self.groups[0]
            return g.topology.name + (f" MTP{g.topology.mtp}" if g.topology.mtp else "")
        parts = []
        for g in self.groups:
            tag = {"prefill": "P", "decode": "D", "both": "x"}[g.role.value]
            mtp = f" MTP{g.topology.mtp}" if g.topology.mtp else ""
            parts.append(f"{g.count}{tag}({g.topology.name}{mtp})")
        return " ".join(parts)


# -- deployment strings -----------------------------------------------------------------------------------

_GROUP = re.compile(r"^(\d+)\s*([PD])\s*:\s*(.+)$", re.IGNORECASE)


_PRINTED_GROUP = re.compile(r"(\d+)\s*([PDx])\s*\(\s*([^()\s]+)(?:\s+MTP(\d+))?\s*\)", re.IGNORECASE)


def _from_printed(text: str) -> tuple[str, int | None]:
    """A deployment as `frontier` and `tune` print it ('4P(TP2DP4 MTP3) 1D(TP2DP8+EP MTP3)', '4x(TP4DP4 MTP3)')
    in the colon form, with the MTP depth it names (None: it names none)."""
    groups = _PRINTED_GROUP.findall(text)
    if not groups or _PRINTED_GROUP.sub("", text).strip(" ,"):
        return text, None
    depths = {int(d) for *_, d in groups if d}
    if len(depths) > 1:
        raise ConfigError(f"{text!r} names two MTP depths", field="deployment",
                          fix="prefill and decode run one speculative config: give one depth")
    parts = [f"{count}{'x' if kind.lower() == 'x' else kind.upper()}:{name}" for count, kind, name, _ in groups]
    return ",".join(parts), depths.pop() if depths else None


def parse_deployment(text: str, *, mtp: int = 0, **engine: object) -> Deployment:
    """'3P:TP4DP2+EP,1D:TEP8' (PD), '2x:TP4' or 'TP4' (aggregated), or the form `frontier` and `tune` print
    ('4P(TP2DP4 MTP3) 1D(TP2DP8+EP MTP3)', whose MTP depth wins over `mtp`). MTP is the decode/aggregated depth;
    a PD prefill runs the same speculative config (Deployment enforces it: NIXL's handshake compares them)."""
    text, printed_mtp = _from_printed(text)
    if printed_mtp is not None:
        if mtp and mtp != printed_mtp:
            raise ConfigError(f"MTP {mtp} differs from the deployment's MTP{printed_mtp}", field="mtp",
                              fix="drop `mtp`: the printed deployment names its depth")
        mtp = printed_mtp
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
        layout = Topology.parse(match[3])  # each knob on the side whose layout has it (DBO: the EP-over-DP one)
        topo = Topology.on_layout(tp=layout.tp, dp=layout.dp, ep=layout.ep, mtp=mtp if kind == "D" else 0, **engine)
        groups[kind] = (int(match[1]), topo)
    if set(groups) != {"P", "D"}:
        raise ConfigError("a disaggregated deployment needs one P and one D group", field="deployment",
                          fix="write e.g. 1P:TP4,1D:TP4")
    (np, ptopo), (nd, dtopo) = groups["P"], groups["D"]
    return Deployment.disaggregated(ptopo, np, dtopo, nd)
