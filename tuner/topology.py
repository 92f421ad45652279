"""One vLLM instance's parallel layout and engine limits: validated, named, rendered as vLLM flags."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tuner.errors import ConfigError, TopologyError

if TYPE_CHECKING:
    from tuner.models import ModelSpec

# vLLM V1 defaults for large GPUs (vllm/engine/arg_utils.py, usage context OpenAI API server).
DEFAULT_MAX_NUM_SEQS = 1024
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_GPU_MEMORY_UTILIZATION = 0.92  # the campaign's 8% safety margin

# vLLM's --kv-cache-dtype values whose bytes the memory model knows (vllm/config/cache.py CacheDType,
# page sizes in vllm/v1/kv_cache_interface.py). "fp8" is e4m3 on CUDA; fp8_ds_mla is DeepSeek's sparse-MLA record.
KVCacheDtype = Literal["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
                       "fp8_per_token_head", "int8_per_token_head", "nvfp4"]

# vLLM's --all2all-backend values the performance model can price (vllm/config/parallel.py All2AllBackend, read
# in 0.32.0). allgather_reducescatter, vLLM's default, gathers every token of the EP group on every rank and
# reduce-scatters the outputs; the others send each token only to the ranks holding its experts (DeepEP's two
# modes; FlashInfer's multi-node-NVLink all-to-alls, which vLLM PR #54268 proposes as the GB200/GB300 default).
All2AllBackend = Literal["allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency",
                         "flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided"]
DEFAULT_ALL2ALL_BACKEND = "allgather_reducescatter"
DEEPEP_BACKENDS = ("deepep_high_throughput", "deepep_low_latency")


def cudagraph_grid_floor(tokens: int) -> int:
    """The largest size on vLLM's CUDA-graph capture grid at or below `tokens` (what vLLM truncates a cap to)."""
    if tokens < 8:
        return max(s for s in (1, 2, 4) if s <= max(tokens, 1))
    return tokens - tokens % 8 if tokens < 256 else tokens - tokens % 16


def cudagraph_grid_ceil(tokens: int) -> int:
    """The smallest size on vLLM's CUDA-graph capture grid at or above `tokens` (a cap that captures it)."""
    if tokens <= 4:
        return min(s for s in (1, 2, 4) if s >= tokens)
    if tokens < 256:
        return -(-tokens // 8) * 8
    return -(-tokens // 16) * 16


def _speculative_flags(mtp: int) -> list[str]:
    return ["--speculative-config", json.dumps({"method": "mtp", "num_speculative_tokens": mtp})] if mtp else []


def _eplb_flags(redundant: int) -> list[str]:
    return ["--enable-eplb", "--eplb-config", json.dumps({"num_redundant_experts": redundant})] if redundant else []


def _on_gpus(fields: Mapping[str, object]) -> bool:
    return _num(fields, "tp") * _num(fields, "dp") > 1


def ep_on_one_gpu(fields: Mapping[str, object]) -> bool:
    """Fields (a Topology's, a trial's params) that ask for EP on one GPU: the same layout as EP off (there is no
    group to split the experts over), which is what a Topology built from them is."""
    ep = fields.get("ep")
    return isinstance(ep, int) and bool(ep) and not _on_gpus(fields)


def _with_ep(fields: Mapping[str, object]) -> bool:
    return bool(fields.get("ep")) and _on_gpus(fields)


def _with_ep_over_dp(fields: Mapping[str, object]) -> bool:
    return bool(fields.get("ep")) and _num(fields, "dp") > 1


def _num(fields: Mapping[str, object], name: str) -> int:
    value = fields.get(name, 1)
    return value if isinstance(value, int) else 1


@dataclass(frozen=True)
class Knob:
    """What one Topology field is to the rest of topotune, as vLLM's config dataclasses carry their CLI
    (vllm/engine/arg_utils.py EngineArgs.add_cli_args over vllm/config/utils.py get_kwargs): the flag vLLM spells
    it with, how it prints, whether a space searches it and whether it decides that a launch starts.

    `param`: "always" a study parameter (the knobs every stored study has), "searched" one when a phase lists
    other choices than its default, "varied" only when it lists more than one (one value is then a setting of every
    config). `on_layout`: the layouts the knob exists on (elsewhere a space's config reads its default).
    """

    flag: str  # vLLM's flag (a dotted one is a key of a JSON flag, as vLLM's FlexibleArgumentParser reads it)
    layout: bool = False  # part of the layout's name (TP8, DEP8): the CLI takes it in --topology
    always: bool = False  # printed at vLLM's default too (a plan states every engine limit)
    render: Callable[[Any], list[str]] | None = None  # its `vllm serve` flags when not `flag value`
    by_plan: bool = False  # the plan prints it (its flag depends on the vLLM version, CUDA only: _engine_flags)
    searched: bool = True  # a space lists its choices (PhaseSpace) and a study samples them
    risk: bool = True  # decides whether a launch starts (the cluster store's known risks compare it)
    param: Literal["always", "searched", "varied"] = "searched"
    space_default: object = None  # a space's choice when a phase leaves it out (None: the field's default)
    on_layout: Callable[[Mapping[str, object]], bool] | None = None
    cli: str | None = None  # topotune's option when vLLM has no flag of its own (mtp)
    aliases: tuple[str, ...] = ()  # topotune's earlier spellings, still accepted

    def vllm_flags(self, value: object, default: object) -> list[str]:
        """`vllm serve` arguments for the value (none at vLLM's default unless `always`)."""
        if self.render is not None:
            return self.render(value)
        if isinstance(value, bool):
            return [self.flag] if value else []
        if value == default and not self.always:
            return []
        return [self.flag, f"{value:g}" if isinstance(value, float) else str(value)]


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"


_NAME_PATTERNS = (
    (re.compile(r"^TEP(\d+)$"), lambda m: (int(m[1]), 1, True)),
    (re.compile(r"^DEP(\d+)$"), lambda m: (1, int(m[1]), True)),
    (re.compile(r"^TP(\d+)(?:DP(\d+))?(\+EP)?$"), lambda m: (int(m[1]), int(m[2] or 1), bool(m[3]))),
    (re.compile(r"^DP(\d+)(\+EP)?$"), lambda m: (1, int(m[1]), bool(m[2]))),
)


class Topology(BaseModel):
    """Parallelism of one vLLM instance (one `vllm serve`, possibly spanning hosts).

    With expert parallelism the MoE layers are split over EP = TP x DP GPUs while attention keeps TP
    inside each DP rank (vllm/model_executor/layers/fused_moe/config.py).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Each serving knob is one field with its Knob (KNOBS collects them; docs/architecture.md lists what derives
    # from it). Their order is the order of a study's Optuna parameters and of the flags a plan prints: a new knob
    # goes last.
    tp: Annotated[int, Knob("--tensor-parallel-size", layout=True, always=True, param="always")] = Field(
        1, ge=1, le=512, description="Tensor-parallel size: GPUs one DP rank's layers are split over.")
    dp: Annotated[int, Knob("--data-parallel-size", layout=True, param="always")] = Field(
        1, ge=1, le=1024, description="Data-parallel size: engine ranks of the instance.")
    ep: Annotated[bool, Knob("--enable-expert-parallel", layout=True, param="always")] = Field(
        False, description="Expert parallelism: MoE layers split over TP x DP GPUs (one GPU: no EP).")
    pp: Literal[1] = Field(1, description="Pipeline-parallel size; only 1 for now.")
    mtp: Annotated[int, Knob("--speculative-config", cli="--mtp", render=_speculative_flags, param="always")] = (
        Field(0, ge=0, le=8, description="MTP speculative tokens (0 = off; vLLM's --speculative-config with "
                                         "method mtp)."))
    gpu_memory_utilization: Annotated[float, Knob("--gpu-memory-utilization", always=True, param="always")] = Field(
        DEFAULT_GPU_MEMORY_UTILIZATION, gt=0, le=1,
        description="Share of each GPU's memory vLLM may use (weights, activations, CUDA graphs, KV cache).")
    max_num_seqs: Annotated[int, Knob("--max-num-seqs", always=True, param="always", space_default=256)] = Field(
        DEFAULT_MAX_NUM_SEQS, ge=1, description="Running requests per DP rank (the decode batch).")
    max_num_batched_tokens: Annotated[int, Knob("--max-num-batched-tokens", always=True, param="always")] = Field(
        DEFAULT_MAX_NUM_BATCHED_TOKENS, ge=1, description="Tokens per engine step (the prefill chunk).")
    role: Role = Role.BOTH
    kv_cache_dtype: Annotated[KVCacheDtype, Knob("--kv-cache-dtype")] = Field(
        "auto", description="KV-cache element type.")
    num_redundant_experts: Annotated[int, Knob(
        "--eplb-config.num_redundant_experts", aliases=("--num-redundant-experts",), render=_eplb_flags,
        on_layout=_with_ep)] = Field(0, ge=0, le=4096, description=(
            "EPLB redundant experts (vLLM's --enable-eplb with eplb-config num_redundant_experts); 0 = EPLB off. "
            "Needs +EP and experts + N divisible by EP."))
    max_cudagraph_capture_size: Annotated[int | None, Knob("--max-cudagraph-capture-size", by_plan=True)] = Field(
        None, ge=1, description="Largest CUDA-graph batch in tokens (unset: the decode batch x (1 + MTP)).")
    stream_interval: Annotated[int, Knob("--stream-interval", risk=False)] = Field(
        1, ge=1, le=4096, description=(
            "Tokens the API server buffers per request before it streams them (vLLM >= 0.12): fewer output "
            "messages per step, coarser streaming."))
    all2all_backend: Annotated[All2AllBackend, Knob("--all2all-backend", param="varied",
                                                    on_layout=_with_ep_over_dp)] = Field(
        DEFAULT_ALL2ALL_BACKEND, description=(
            "How MoE tokens reach their experts with EP over DP ranks: vLLM's default allgather_reducescatter sends "
            "every token to every EP rank, the others only to the ranks its experts are on. Without EP over DP "
            "ranks vLLM uses none, and the field reads its default."))
    dbo: Annotated[bool, Knob("--enable-dbo", on_layout=_with_ep_over_dp)] = Field(
        False, description="Dual-batch overlap of the EP all-to-all with compute; needs expert parallelism over "
                           "DP ranks (a DeepEP all-to-all).")

    @model_validator(mode="before")
    @classmethod
    def _in_use(cls, data: object) -> object:
        """EP on one GPU is EP off, and the all-to-all backend only exists with EP over DP ranks (else it is the
        default), so equal layouts compare equal; DBO without a named backend runs DeepEP's low-latency kernels
        (vLLM asserts a DeepEP backend for microbatching)."""
        if not isinstance(data, dict):
            return data
        if ep_on_one_gpu(data):
            data = {**data, "ep": False}
        uses = data.get("ep") is True and _with_ep_over_dp(data)
        backend = data.get("all2all_backend", DEFAULT_ALL2ALL_BACKEND)
        if not uses and backend in get_args(All2AllBackend) and backend != DEFAULT_ALL2ALL_BACKEND:
            # (an unknown value is left for field validation to refuse, wherever it is given)
            data = {**data, "all2all_backend": DEFAULT_ALL2ALL_BACKEND}
        elif uses and data.get("dbo") and backend == DEFAULT_ALL2ALL_BACKEND:
            data = {**data, "all2all_backend": "deepep_low_latency"}
        return data

    @classmethod
    def create(cls, **fields: object) -> Topology:
        """Build with a one-line error naming the bad field (instead of pydantic's multi-line report)."""
        try:
            return cls(**fields)  # type: ignore[arg-type]
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = ".".join(str(p) for p in err["loc"]) or "topology"
            raise ConfigError(f"{err['msg']} (got {err.get('input')!r})", field=loc.replace("_", "-"),
                              fix=_FIELD_FIXES.get(loc, "see `topotune memory --help`")) from exc

    @classmethod
    def parse(cls, name: str, **fields: object) -> Topology:
        """Parse a conventional name: TP8, TEP8, DEP8, TP4DP4+EP, TP2DP4+EP, DP2."""
        key = name.strip().upper().replace(" ", "")
        for pattern, unpack in _NAME_PATTERNS:
            match = pattern.match(key)
            if match:
                tp, dp, ep = unpack(match)
                return cls.create(tp=tp, dp=dp, ep=ep, **fields)
        raise ConfigError(f"cannot parse topology {name!r}", field="topology",
                          fix="write it like TP8, TEP8, DEP8, TP4DP2, TP4DP4+EP")

    @classmethod
    def on_layout(cls, **fields: object) -> Topology:
        """A sweep's config: every knob its layout does not have reads its default (EP on one GPU, EPLB without
        EP, DBO or an all-to-all backend without EP over DP ranks), so a knob's choices apply where they exist."""
        kept = {name: value for name, value in fields.items()
                if name not in KNOBS or KNOBS[name].on_layout is None or KNOBS[name].on_layout(fields)}
        return cls.create(**kept)

    # -- derived ---------------------------------------------------------------------------------
    @property
    def num_gpus(self) -> int:
        return self.tp * self.dp * self.pp

    @property
    def ep_size(self) -> int:
        """GPUs the experts are split over (EP group, or the MoE-TP group when EP is off)."""
        return self.tp * self.dp

    @property
    def all2all_routed(self) -> bool:
        """Tokens go only to the EP ranks holding their experts (False: gathered on every rank, vLLM's default)."""
        return self.all2all_backend != DEFAULT_ALL2ALL_BACKEND

    @property
    def kv_cache_is_fp8(self) -> bool:
        return self.kv_cache_dtype.startswith("fp8")

    @property
    def name(self) -> str:
        if self.dp == 1:
            return f"TEP{self.tp}" if self.ep else f"TP{self.tp}"
        if self.tp == 1:
            return f"DEP{self.dp}" if self.ep else f"DP{self.dp}"
        return f"TP{self.tp}DP{self.dp}" + ("+EP" if self.ep else "")

    def __str__(self) -> str:
        return self.name

    @property
    def cudagraph_capture_tokens(self) -> int | None:
        """The largest CUDA-graph capture size a plan sets (tokens per forward step), None for vLLM's default.

        vLLM captures only sizes on its grid (1, 2, 4, multiples of 8 below 256, of 16 from 256; plus
        max_num_batched_tokens when it fits) and truncates --max-cudagraph-capture-size to the largest grid size
        at or below it (vllm/config/vllm.py _set_cudagraph_sizes, "Truncating max_cudagraph_capture_size"): 100
        sequences with MTP 2 step 300 tokens, and a cap of 300 would capture only up to 288, so those batches
        would run eager. A decoding instance therefore asks for max_num_seqs x (1 + MTP) rounded UP to the grid
        (304); an explicit value is modelled as what vLLM keeps (300 -> 288). Never above max_num_batched_tokens
        (no step is larger; vLLM captures it exactly). Prefill steps are chunked prefill: None, vLLM's default
        applies (min(2 x max_num_seqs x (1 + MTP), 1024) on SM10x: B200/GB200/B300/GB300, 512 elsewhere;
        `current_platform.is_device_capability_family(100)`). The memory model's CUDA-graph reserve reads this.
        """
        size = self.max_cudagraph_capture_size
        if size is None and self.role is not Role.PREFILL:
            size = cudagraph_grid_ceil(self.max_num_seqs * (1 + self.mtp))
        if size is None:
            return None
        return self.max_num_batched_tokens if size >= self.max_num_batched_tokens else cudagraph_grid_floor(size)

    def label(self) -> str:
        """Name plus the engine settings that differ between trials."""
        extra = (f" MTP{self.mtp}" if self.mtp else "") + (" DBO" if self.dbo else "")
        if self.num_redundant_experts:
            extra += f" EPLB+{self.num_redundant_experts}"
        if self.kv_cache_dtype != "auto":
            extra += f" kv={self.kv_cache_dtype}"
        if self.stream_interval != 1:
            extra += f" stream={self.stream_interval}"
        if self.all2all_backend != DEFAULT_ALL2ALL_BACKEND:
            extra += f" a2a={self.all2all_backend}"
        return f"{self.name}{extra} seqs={self.max_num_seqs} util={self.gpu_memory_utilization:g}"

    # -- validation against a model and a cluster --------------------------------------------------
    def check(self, model: ModelSpec, *, cluster_gpus: int | None = None) -> None:
        """Raise TopologyError when vLLM would refuse this layout for this model or cluster."""
        if cluster_gpus is not None and self.num_gpus > cluster_gpus:
            raise TopologyError(f"{self.name} needs {self.num_gpus} GPUs but the cluster has {cluster_gpus}",
                                field="topology", fix=f"use at most {cluster_gpus} GPUs (TP x DP)")
        heads = model.attention.num_heads if model.attention else model.mla.num_heads if model.mla else 0
        if heads % self.tp:
            raise TopologyError(f"TP{self.tp} does not divide the {heads} attention heads", field="topology",
                                fix=f"use a TP that divides {heads}")
        if model.attention:
            kv = model.attention.num_kv_heads
            if (self.tp >= kv and self.tp % kv) or (self.tp < kv and kv % self.tp):
                raise TopologyError(f"TP{self.tp} and the {kv} KV heads must divide one another",
                                    field="topology", fix=f"use a TP that divides or is a multiple of {kv}")
        la = model.linear_attention
        if la and (la.num_key_heads % self.tp or la.num_value_heads % self.tp):
            raise TopologyError(
                f"TP{self.tp} does not divide the linear-attention heads ({la.num_key_heads} key, "
                f"{la.num_value_heads} value)", field="topology", fix="use a smaller power-of-two TP")
        if self.num_redundant_experts and not (self.ep and model.moe):
            raise TopologyError("redundant experts (EPLB) need expert parallelism on an MoE model",
                                field="num-redundant-experts", fix="use 0, or +EP on an MoE model")
        if model.moe:
            experts = model.moe.num_experts
            physical = experts + self.num_redundant_experts
            # vllm/distributed/eplb/rebalance_algo.py rebalance_experts: assert num_replicas % num_gpus == 0.
            # Without EPLB any EP size works: determine_expert_map gives the first E % EP ranks one more expert.
            if self.ep and self.num_redundant_experts and physical % self.ep_size:
                raise TopologyError(
                    f"{experts} experts + {self.num_redundant_experts} redundant do not divide over EP{self.ep_size} "
                    "(EPLB places the same number of physical experts on every rank)",
                    field="num-redundant-experts",
                    fix=f"choose num_redundant_experts so that {experts} + it is a multiple of {self.ep_size}")
            if self.ep and experts < self.ep_size:
                raise TopologyError(f"{experts} experts cannot cover EP{self.ep_size}", field="topology",
                                    fix=f"use TP x DP of at most {experts}")
            if not self.ep and model.moe.expert_intermediate_size % self.ep_size:
                raise TopologyError(
                    f"expert intermediate size {model.moe.expert_intermediate_size} does not split over "
                    f"TP x DP = {self.ep_size}", field="topology", fix="enable expert parallelism (+EP)")
        elif self.ep:
            raise TopologyError("expert parallelism on a dense model", field="topology", fix="drop +EP")
        if self.dbo and not (self.ep and self.dp > 1):
            raise TopologyError("dual-batch overlap needs expert parallelism over DP ranks (all-to-all kernels)",
                                field="dbo", fix="use DP > 1 with +EP, or turn DBO off")
        if self.dbo and self.all2all_backend not in DEEPEP_BACKENDS:
            raise TopologyError(f"dual-batch overlap runs on DeepEP's all-to-all, not {self.all2all_backend}",
                                field="all2all-backend", fix="use deepep_low_latency or deepep_high_throughput")
        if self.mtp and not model.num_mtp_layers:
            raise TopologyError(f"{model.name} has no MTP layers", field="mtp",
                                fix="use --mtp 0 (or a draft model, not supported yet)")



def _knobs() -> dict[str, Knob]:
    out = {}
    for name, info in Topology.model_fields.items():
        knob = next((m for m in info.metadata if isinstance(m, Knob)), None)
        if knob is not None:
            out[name] = knob
    return out


#: Every serving knob in Topology's field order (the order of a study's parameters and of a plan's flags).
KNOBS: dict[str, Knob] = _knobs()


def knob_default(name: str) -> object:
    """The field's default: vLLM's value, or none of its flags."""
    return Topology.model_fields[name].default


def knob_help(name: str) -> str:
    return Topology.model_fields[name].description or name.replace("_", " ")

_FIELD_FIXES = {
    "gpu_memory_utilization": "give a fraction in (0, 1], e.g. 0.92",
    "tp": "give a positive TP size such as 1, 2, 4, 8",
    "dp": "give a positive DP size",
    "mtp": "give 0 (off) to 8 speculative tokens",
    "max_num_seqs": "give a positive number of sequences",
    "max_num_batched_tokens": "give a positive token count",
    "role": "use prefill, decode or both",
    "max_cudagraph_capture_size": "give a positive token count, or leave it unset (decode batch x (1 + MTP))",
    "kv_cache_dtype": "use auto, bfloat16, fp8 (fp8_e4m3, fp8_e5m2), fp8_per_token_head, int8_per_token_head or nvfp4",
    "num_redundant_experts": "give 0 (EPLB off) or a positive number of redundant experts",
    "stream_interval": "give a positive number of tokens (1 streams every token, vLLM's default)",
    "all2all_backend": "use allgather_reducescatter (vLLM's default), deepep_high_throughput, deepep_low_latency, "
                       "flashinfer_nvlink_one_sided or flashinfer_nvlink_two_sided",
}


def accepted_topologies(model: ModelSpec, num_gpus: int, *, mtp_depths: Sequence[int] = (0,),
                        powers_of_two: bool = True, max_gpus_per_instance: int | None = None,
                        knobs_where_they_apply: bool = True, **engine: object) -> list[Topology]:
    """Every (TP, DP, EP, MTP) vLLM accepts for the model within the GPU count: what the memory sweep and the
    performance sweep both start from. Each engine knob applies where its layout has it (Topology.on_layout: a
    sweep's choice), or with knobs_where_they_apply=False rules out the layouts without it (a user's
    `memory --sweep --enable-dbo` lists the layouts DBO runs on)."""
    build = Topology.on_layout if knobs_where_they_apply else Topology.create
    out = []
    for tp, dp, ep in enumerate_topologies(num_gpus, max_gpus_per_instance=max_gpus_per_instance,
                                           powers_of_two=powers_of_two):
        for mtp in mtp_depths:
            topo = build(tp=tp, dp=dp, ep=ep, mtp=mtp, **engine)
            try:
                topo.check(model, cluster_gpus=num_gpus)
            except TopologyError:
                continue
            out.append(topo)
    return out


def enumerate_topologies(num_gpus: int, *, max_gpus_per_instance: int | None = None,
                         powers_of_two: bool = True) -> list[tuple[int, int, bool]]:
    """All (tp, dp, ep) with tp x dp <= num_gpus; callers filter with Topology.check."""
    limit = min(num_gpus, max_gpus_per_instance or num_gpus)
    sizes = [1 << i for i in range(limit.bit_length())] if powers_of_two else list(range(1, limit + 1))
    out = []
    for tp in sizes:
        for dp in sizes:
            if tp * dp <= limit:
                out.append((tp, dp, False))
                if tp * dp > 1:
                    out.append((tp, dp, True))
    return out
