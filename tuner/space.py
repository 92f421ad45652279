"""Search spaces: a YAML file per campaign, validated with errors that name the line and the field.

A space holds the cluster, the workload, the constraints and, per phase (prefill, decode), the choices of every
knob. It expands to the full list of valid configurations (for pre-screening and the exhaustive baseline).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from tuner.errors import ConfigError, TopologyError
from tuner.metrics import ServingMetrics
from tuner.models import ModelSpec
from tuner.topology import (
    DEFAULT_ALL2ALL_BACKEND,
    All2AllBackend,
    KVCacheDtype,
    Role,
    Topology,
    cudagraph_grid_floor,
)
from tuner.workload import Arrival, Lengths, PrefixSharing, Workload, workload_error

Phase = Literal["prefill", "decode", "aggregated"]
PHASES: tuple[Phase, ...] = ("prefill", "decode")  # the PD phases, composed into xPyD deployments
ALL_PHASES: tuple[Phase, ...] = ("prefill", "decode", "aggregated")
_PHASE_ROLES = {"prefill": Role.PREFILL, "decode": Role.DECODE, "aggregated": Role.BOTH}


def phase_role(phase: str) -> Role:
    """The instance role a phase's trials run: aggregated = prefill and decode on one instance (role both)."""
    if phase not in _PHASE_ROLES:
        raise ConfigError(f"unknown phase {phase!r}", field="phase", fix="use prefill, decode or aggregated")
    return _PHASE_ROLES[phase]


# What one space may ask for. A space is typed by people (a few hundred lines): these bounds are far above any real
# one and keep a hostile or mistaken one (a YAML alias bomb, a 1e-300 step, 10**6 values per knob) from taking the
# process down. parse_space enforces them before anything walks the document.
MAX_SPACE_CHARS = 1_000_000
MAX_YAML_NODES = 20_000  # after alias expansion: the billion-laughs document expands to ~10**9
MAX_YAML_ALIASES = 100
MAX_YAML_DEPTH = 32
MAX_CHOICES_PER_KNOB = 1_000
MAX_CONFIGS_PER_PHASE = 1_000_000  # the product of a phase's knob choices (expand() walks all of them)
MAX_KNOB_VALUE = 10_000_000  # tokens, sequences, GPUs: far above any real value


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class FloatRange(_Strict):
    low: float
    high: float
    step: float = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> FloatRange:
        if self.high < self.low:
            raise ValueError("high must be >= low")
        if (self.high - self.low) / self.step >= MAX_CHOICES_PER_KNOB:
            raise ValueError(f"the range holds more than {MAX_CHOICES_PER_KNOB} values; raise step")
        return self

    def values(self) -> list[float]:
        n = round((self.high - self.low) / self.step)
        return [round(self.low + i * self.step, 6) for i in range(n + 1)]


class PhaseWorkload(_Strict):
    """A phase may measure with its own lengths (the campaign's prefill sweep used 8192/2)."""

    isl: int | None = Field(None, ge=1, le=MAX_KNOB_VALUE)
    osl: int | None = Field(None, ge=1, le=MAX_KNOB_VALUE)


class PhaseSpace(_Strict):
    tp: list[int] = Field([1], min_length=1)
    dp: list[int] = Field([1], min_length=1)
    ep: list[bool] = Field([False], min_length=1)
    mtp: list[int] = Field([0], min_length=1)
    gpu_memory_utilization: list[float] | FloatRange = [0.92]
    max_num_seqs: list[int] = Field([256], min_length=1)
    max_num_batched_tokens: list[int] = Field([8192], min_length=1)
    concurrency: list[int] = Field(min_length=1, max_length=64)
    kv_cache_dtype: list[KVCacheDtype] = Field(["auto"], min_length=1)
    num_redundant_experts: list[int] = Field([0], min_length=1)
    # Largest CUDA-graph capture size in tokens; "auto" covers the decode batch x (1 + MTP). Smaller values
    # trade speed (bigger steps run eager) for the graphs' memory: a knob only when given more than "auto".
    max_cudagraph_capture_size: list[int | Literal["auto"]] = Field(["auto"], min_length=1, max_length=64)
    # Tokens vLLM streams per message (--stream-interval): fewer host messages per step, coarser streaming.
    stream_interval: list[int] = Field([1], min_length=1)
    # vLLM's --all2all-backend for layouts with EP over DP ranks (the others have none): one value is a setting
    # of every such layout, more are a knob.
    all2all_backend: list[All2AllBackend] = Field([DEFAULT_ALL2ALL_BACKEND], min_length=1)
    # Dual-batch overlap (--enable-dbo) for layouts with EP over DP ranks (the others have none): two micro-batches
    # hide the all-to-all behind compute, on a DeepEP backend.
    dbo: list[bool] = Field([False], min_length=1)
    workload: PhaseWorkload = PhaseWorkload()

    @field_validator("tp", "dp", "ep", "mtp", "gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens",
                     "kv_cache_dtype", "num_redundant_experts", "max_cudagraph_capture_size", "stream_interval",
                     "all2all_backend", mode="before")
    @classmethod
    def _bounded(cls, values: object) -> object:
        if isinstance(values, list) and len(values) > MAX_CHOICES_PER_KNOB:
            raise ValueError(f"at most {MAX_CHOICES_PER_KNOB} choices per knob")
        return values

    @model_validator(mode="after")
    def _expandable(self) -> PhaseSpace:
        sizes = (self.tp, self.dp, self.ep, self.mtp, self.utilizations(), self.max_num_seqs,
                 self.max_num_batched_tokens, self.kv_cache_dtype, self.num_redundant_experts,
                 self.max_cudagraph_capture_size, self.stream_interval, self.all2all_backend, self.dbo)
        if math.prod(len(v) for v in sizes) > MAX_CONFIGS_PER_PHASE:
            raise ValueError(f"the knobs' choices multiply to more than {MAX_CONFIGS_PER_PHASE:,} configurations; "
                             "narrow some lists")
        return self

    @field_validator("tp", "dp", "max_num_seqs", "max_num_batched_tokens", "concurrency", "stream_interval")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        if any(not 1 <= v <= MAX_KNOB_VALUE for v in values):
            raise ValueError(f"every value must be in 1..{MAX_KNOB_VALUE:,}")
        return sorted(set(values))

    @field_validator("num_redundant_experts")
    @classmethod
    def _redundant(cls, values: list[int]) -> list[int]:
        if any(not 0 <= v <= MAX_KNOB_VALUE for v in values):
            raise ValueError(f"num_redundant_experts values must be in 0..{MAX_KNOB_VALUE:,} (0 = EPLB off)")
        return sorted(set(values))

    @field_validator("max_cudagraph_capture_size")
    @classmethod
    def _capture(cls, values: list[int | str]) -> list[int | str]:
        if any(v != "auto" and int(v) < 1 for v in values):
            raise ValueError("capture sizes must be >= 1 tokens, or auto")
        # vLLM truncates a cap to its capture grid (1, 2, 4, x8 below 256, x16 from 256): search what it keeps,
        # so 300 and 288 are one config, not two (vllm/config/vllm.py _set_cudagraph_sizes)
        values = ["auto" if v == "auto" else cudagraph_grid_floor(int(v)) for v in values]
        return sorted(set(values), key=lambda v: (v != "auto", v if v != "auto" else 0))

    @field_validator("mtp")
    @classmethod
    def _mtp(cls, values: list[int]) -> list[int]:
        if any(v < 0 or v > 8 for v in values):
            raise ValueError("MTP depth must be 0..8")
        return sorted(set(values))

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _fraction(cls, value: list[float] | FloatRange) -> list[float] | FloatRange:
        values = value.values() if isinstance(value, FloatRange) else value
        if not values or any(not 0 < v <= 1 for v in values):
            raise ValueError("gpu_memory_utilization values must be in (0, 1]")
        return value

    def utilizations(self) -> list[float]:
        g = self.gpu_memory_utilization
        return g.values() if isinstance(g, FloatRange) else sorted(set(g))


class ClusterSpec(_Strict):
    gpu: str
    num_gpus: int = Field(ge=1, le=MAX_KNOB_VALUE)
    gpus_per_host: int | None = Field(None, ge=1, le=MAX_KNOB_VALUE, description="default: the GPU catalog's")
    # The vLLM the hosts run (e.g. 0.26.1rc1): launch plans follow its version table. None: detected on the
    # hosts (`topotune doctor` reports it).
    vllm_version: str | None = Field(None, max_length=64, pattern=r"^v?\d+\.\d+(\.\d+)?\S*$")


class WorkloadSpec(_Strict):
    """The traffic: `isl`/`osl` (fixed lengths), or `input_tokens`/`output_tokens` distributions, or a mooncake
    `trace` (a path relative to the space file); optional synthetic shared `prefix`. Load: each phase's
    `concurrency` levels (closed loop), or, with `arrival: poisson` (or `trace`: the trace's own timestamps),
    open-loop `request_rates` (requests/s per instance), which then replace the concurrency levels: a rate an
    instance cannot sustain is a saturated level, infeasible, with no latency."""

    isl: int | None = Field(None, ge=1, le=MAX_KNOB_VALUE)
    osl: int | None = Field(None, ge=1, le=MAX_KNOB_VALUE)
    input_tokens: Lengths | None = None
    output_tokens: Lengths | None = None
    trace: str | None = Field(None, max_length=4096)
    prefix: PrefixSharing | None = None
    requests_per_level: int = Field(0, ge=0, le=MAX_KNOB_VALUE)
    arrival: Arrival = "closed"
    request_rates: list[float] | None = Field(None, min_length=1, max_length=64)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: object) -> object:
        if isinstance(data, dict):
            data = dict(data)
            for name in ("input_tokens", "output_tokens"):
                if isinstance(data.get(name), int) and not isinstance(data.get(name), bool):
                    data[name] = {"distribution": "fixed", "tokens": data[name]}
        return data

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadSpec:
        for short, full in (("isl", "input_tokens"), ("osl", "output_tokens")):
            if getattr(self, short) is not None and getattr(self, full) is not None:
                raise ValueError(f"give {short} or {full}, not both")
        if self.trace is None:
            if self.isl is None and self.input_tokens is None:
                raise ValueError("give isl (tokens), input_tokens (a distribution) or trace (a file)")
            if self.osl is None and self.output_tokens is None:
                raise ValueError("give osl (tokens), output_tokens (a distribution) or trace (a file)")
        elif any(v is not None for v in (self.isl, self.osl, self.input_tokens, self.output_tokens, self.prefix)):
            raise ValueError("a trace gives the lengths and prefixes: drop isl/osl/input_tokens/output_tokens/prefix")
        if (self.arrival == "closed") != (self.request_rates is None):
            raise ValueError("open-loop arrival (poisson or trace) and request_rates go together: give both, "
                             "or neither for closed-loop concurrency")
        return self

    def load(self) -> dict[str, object]:
        """The open-loop load a phase's workload carries (nothing for a closed loop)."""
        if self.request_rates is None:
            return {}
        return {"arrival": self.arrival, "request_rates": tuple(self.request_rates)}

    def describe(self) -> str:
        """In words, without reading a trace (the service's pages show it)."""
        if self.trace is not None:
            return f"trace {self.trace}"
        return self.resolve(Path.cwd()).describe(load=False)

    def resolve(self, base_dir: Path, concurrency: tuple[int, ...] = (1,)) -> Workload:
        try:
            if self.trace is not None:
                path = Path(self.trace).expanduser()
                return Workload.from_trace(path if path.is_absolute() else base_dir / path, concurrency=concurrency,
                                           requests_per_level=self.requests_per_level, **self.load())
            return Workload(input_tokens=self.input_tokens or self.isl, output_tokens=self.output_tokens or self.osl,
                            prefix=self.prefix, concurrency=concurrency, requests_per_level=self.requests_per_level,
                            **self.load())  # type: ignore[arg-type]
        except ValidationError as exc:
            raise workload_error(exc) from None


Percentile = Literal["p50", "p90", "p99"]


class Constraints(_Strict):
    """The SLA a deployment must meet (latencies at `percentile`), a per-user floor and the accuracy bar."""

    max_ttft_ms: float | None = Field(None, gt=0)
    max_itl_ms: float | None = Field(None, gt=0)
    percentile: Percentile = "p90"
    min_tok_s_per_user: float | None = Field(None, gt=0)
    min_accuracy: float | None = Field(None, ge=0, le=1)

    def judge(self, m: ServingMetrics) -> ServingMetrics:
        """The point with its share of requests within the SLA: what a study's goodput objective counts."""
        if self.max_ttft_ms is None and self.max_itl_ms is None:
            return m
        return m.within_sla(max_ttft_ms=self.max_ttft_ms, max_itl_ms=self.max_itl_ms)


class SearchSpace(_Strict):
    name: str
    description: str = ""
    cluster: ClusterSpec
    workload: WorkloadSpec
    constraints: Constraints = Constraints()
    phases: dict[Phase, PhaseSpace] = Field(min_length=1)
    _base_dir: Path = PrivateAttr(default_factory=Path.cwd)  # where a relative trace path starts
    _traffic: Workload | None = PrivateAttr(default=None)

    def with_base_dir(self, base_dir: Path) -> SearchSpace:
        self._base_dir = base_dir
        self._traffic = None
        return self

    @property
    def traffic(self) -> Workload:
        """The space's workload, resolved once (a trace is read and summarised here)."""
        if self._traffic is None:
            self._traffic = self.workload.resolve(self._base_dir)
        return self._traffic

    @property
    def isl(self) -> int:
        """The typical prompt (a fixed workload's isl): what study names and recipes read."""
        return self.traffic.isl

    @property
    def osl(self) -> int:
        return self.traffic.osl

    def phase_workload(self, phase: Phase) -> Workload:
        space = self.phases[phase]
        return self.traffic.with_lengths(space.workload.isl, space.workload.osl).model_copy(
            update={"concurrency": tuple(space.concurrency)})

    def param_choices(self, phase: Phase) -> dict[str, list]:
        """Every knob's choices; the order fixes the Optuna parameter order."""
        s = self.phases[phase]
        choices = {"tp": s.tp, "dp": s.dp, "ep": s.ep, "mtp": s.mtp if phase != "prefill" else [0],
                   "gpu_memory_utilization": s.utilizations(), "max_num_seqs": s.max_num_seqs,
                   "max_num_batched_tokens": s.max_num_batched_tokens}
        # Knobs added later appear only when searched, so studies stored before them keep their parameters.
        if s.kv_cache_dtype != ["auto"]:
            choices["kv_cache_dtype"] = list(dict.fromkeys(s.kv_cache_dtype))
        if s.num_redundant_experts != [0]:
            choices["num_redundant_experts"] = s.num_redundant_experts
        if s.max_cudagraph_capture_size != ["auto"]:
            choices["max_cudagraph_capture_size"] = s.max_cudagraph_capture_size
        if s.stream_interval != [1]:
            choices["stream_interval"] = s.stream_interval
        if len(set(s.all2all_backend)) > 1:  # one backend is a setting (`topology` applies it), not a parameter
            choices["all2all_backend"] = list(dict.fromkeys(s.all2all_backend))
        if s.dbo != [False]:
            choices["dbo"] = list(dict.fromkeys(s.dbo))
        return choices

    def params_of(self, phase: Phase, topo: Topology) -> dict[str, Any]:
        """The inverse of `topology`: a config's trial params, one per searched knob (a varied knob at its
        default too), so enqueued, repaired and sampled trials carry the same parameter set."""
        every: dict[str, Any] = {
            "tp": topo.tp, "dp": topo.dp, "ep": topo.ep, "mtp": topo.mtp,
            "gpu_memory_utilization": topo.gpu_memory_utilization, "max_num_seqs": topo.max_num_seqs,
            "max_num_batched_tokens": topo.max_num_batched_tokens, "kv_cache_dtype": topo.kv_cache_dtype,
            "num_redundant_experts": topo.num_redundant_experts,
            "max_cudagraph_capture_size": topo.max_cudagraph_capture_size or "auto",
            "stream_interval": topo.stream_interval, "all2all_backend": topo.all2all_backend, "dbo": topo.dbo}
        return {name: every[name] for name in self.param_choices(phase)}

    def topology(self, phase: Phase, params: dict) -> Topology:
        capture = params.get("max_cudagraph_capture_size", "auto")
        return Topology.create(tp=params["tp"], dp=params["dp"], ep=params["ep"] and params["tp"] * params["dp"] > 1,
                               mtp=params.get("mtp", 0), gpu_memory_utilization=params["gpu_memory_utilization"],
                               max_num_seqs=params["max_num_seqs"],
                               max_num_batched_tokens=params["max_num_batched_tokens"], role=phase_role(phase),
                               max_cudagraph_capture_size=None if capture == "auto" else int(capture),
                               kv_cache_dtype=params.get("kv_cache_dtype", "auto"),
                               stream_interval=int(params.get("stream_interval", 1)),
                               all2all_backend=params.get("all2all_backend", self.phases[phase].all2all_backend[0]),
                               num_redundant_experts=params.get("num_redundant_experts", 0)
                               if params["ep"] and params["tp"] * params["dp"] > 1 else 0,
                               dbo=bool(params.get("dbo", False)) and params["ep"] and params["dp"] > 1)

    def expand(self, phase: Phase, model: ModelSpec) -> list[Topology]:
        """All valid configurations of a phase; raises if constraints leave none, saying which."""
        choices = self.param_choices(phase)
        out, seen, rejected = [], set(), Counter()
        for combo in itertools.product(*choices.values()):
            params = dict(zip(choices, combo, strict=True))
            if params["ep"] and params["tp"] * params["dp"] == 1:
                continue  # EP on one GPU is the same layout as EP off
            topo = self.topology(phase, params)
            try:
                topo.check(model, cluster_gpus=self.cluster.num_gpus)
            except TopologyError as exc:
                rejected[exc.message.split(" (")[0]] += 1
                continue
            if topo not in seen:
                seen.add(topo)
                out.append(topo)
        if not out:
            reasons = "; ".join(f"{n} x {why}" for why, n in rejected.most_common(3))
            raise ConfigError(f"phase {phase} has no valid configuration for {model.name} ({reasons})",
                              field=f"phases.{phase}", fix="widen tp/dp/ep or raise cluster.num_gpus")
        return out


# -- loading with line numbers ---------------------------------------------------------------------------
def _bounded_compose(text: str, source: str) -> yaml.Node | None:
    """yaml.compose, refused before anything walks the document when aliases would blow it up.

    The composed graph shares one node per anchor, so it is small; what explodes is every walk of it (the line
    index, the constructor, validation). Counting the expanded size with a memo per node is linear in the text.
    """
    if len(text) > MAX_SPACE_CHARS:
        raise ConfigError(f"the space is {len(text):,} characters; at most {MAX_SPACE_CHARS:,}", field=source,
                          fix="a search space is a short file: see search_spaces/gb300-nvl72-8k1k.yaml")
    aliases = depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):  # events: no recursion, so no deep-nesting trap
        if isinstance(event, yaml.AliasEvent):
            aliases += 1
        elif isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise ConfigError(f"the space nests deeper than {MAX_YAML_DEPTH} levels", field=source,
                                  fix="a search space is a flat mapping: see search_spaces/gb300-nvl72-8k1k.yaml")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    if aliases > MAX_YAML_ALIASES:
        raise ConfigError(f"the space uses {aliases} YAML aliases; at most {MAX_YAML_ALIASES}", field=source,
                          fix="write the values out instead of repeating anchors")
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    if node is None:
        return None
    sizes: dict[int, int] = {}
    limit = ConfigError(f"the space expands to more than {MAX_YAML_NODES:,} YAML nodes or nests deeper than "
                        f"{MAX_YAML_DEPTH} levels (aliases repeating aliases?)", field=source,
                        fix="write the values out instead of nesting anchors")

    def expanded(n: yaml.Node, depth: int, path: frozenset[int]) -> int:
        if depth > MAX_YAML_DEPTH or id(n) in path:  # too deep, or an alias to an ancestor (infinite)
            raise limit
        if id(n) in sizes:
            return sizes[id(n)]
        inner = path | {id(n)}
        if isinstance(n, yaml.MappingNode):
            total = 1 + sum(expanded(k, depth + 1, inner) + expanded(v, depth + 1, inner) for k, v in n.value)
        elif isinstance(n, yaml.SequenceNode):
            total = 1 + sum(expanded(v, depth + 1, inner) for v in n.value)
        else:
            total = 1
        if total > MAX_YAML_NODES:
            raise limit
        sizes[id(n)] = total
        return total

    expanded(node, 0, frozenset())
    return node


def _line_index(node: yaml.Node, path: tuple = ()) -> dict[tuple, int]:
    index = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            child = (*path, key.value)
            index[child] = key.start_mark.line + 1
            index.update({k: v for k, v in _line_index(value, child).items() if k != child})
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            index.update(_line_index(item, (*path, i)))
    return index


def _describe(err: dict, allowed: dict[tuple, list[str]]) -> str:
    if err["type"] == "extra_forbidden":
        parent = tuple(str(p) for p in err["loc"][:-1] if not str(p).startswith(("list[", "FloatRange")))
        names = allowed.get(parent[-1:] if parent else (), [])
        return f"unknown parameter{'; allowed: ' + ', '.join(names) if names else ''}"
    if err["type"] == "missing":
        return "required field is missing"
    return err["msg"].removeprefix("Value error, ")


_ALLOWED = {(): list(SearchSpace.model_fields), ("cluster",): list(ClusterSpec.model_fields),
            ("workload",): list(WorkloadSpec.model_fields), ("constraints",): list(Constraints.model_fields),
            ("prefill",): list(PhaseSpace.model_fields), ("decode",): list(PhaseSpace.model_fields),
            ("aggregated",): list(PhaseSpace.model_fields)}


def parse_space(text: str, source: str = "<space>") -> SearchSpace:
    try:
        node = _bounded_compose(text, source)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        raise ConfigError(f"not valid YAML ({getattr(exc, 'problem', exc)})", field=where,
                          fix="fix the YAML syntax at that line") from exc
    if not isinstance(data, dict) or node is None:
        raise ConfigError("a search space must be a YAML mapping", field=source,
                          fix="see search_spaces/gb300-nvl72-8k1k.yaml")
    lines = _line_index(node)
    try:
        return SearchSpace.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith(("list[", "FloatRange"))))
        line = next((lines[loc[:i]] for i in range(len(loc), -1, -1) if loc[:i] in lines), None)
        dotted = ".".join(str(p) for p in loc) or "(root)"
        raise ConfigError(_describe(err, _ALLOWED), field=f"{source}:{line}: {dotted}" if line else
                          f"{source}: {dotted}", fix="see search_spaces/gb300-nvl72-8k1k.yaml for the schema") from exc


def load_space(path: str | Path) -> SearchSpace:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", field="--space",
                          fix="give the path of a search-space YAML file (see search_spaces/)") from exc
    base = path.resolve().parent
    space = parse_space(text, str(path))
    trace = space.workload.trace
    if trace is not None and not Path(trace).expanduser().is_absolute():
        # resolved against the space file and stored absolute (#46): a campaign's `show`, `export` and `reverify`
        # read it back from any directory
        absolute = str((base / Path(trace).expanduser()).resolve())
        space = space.model_copy(update={"workload": space.workload.model_copy(update={"trace": absolute})})
    space = space.with_base_dir(base)
    space.traffic  # noqa: B018 - a bad trace is reported at load, naming its line, not mid-study
    return space
