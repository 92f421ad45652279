"""A deployment: one or more vLLM instances per role (aggregated, or prefill/decode disaggregated)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tuner.topology import Role, Topology


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
            # NIXL's handshake compares the speculative config of both sides (vLLM PR #49230): a PD prefill always
            # runs its decode side's MTP depth, whoever built the deployment (plan, composition, export).
            same = prefill.model_copy(update={"topology": prefill.topology.model_copy(
                update={"mtp": decode.topology.mtp})})
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

    @property
    def is_disaggregated(self) -> bool:
        return self.group(Role.PREFILL) is not None and self.group(Role.DECODE) is not None

    @property
    def num_gpus(self) -> int:
        return sum(g.num_gpus for g in self.groups)

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
