"""Search spaces: a YAML file per campaign, validated with errors that name the line and the field.

A space holds the cluster, the workload, the constraints and, per phase (prefill, decode), the choices of every
knob. It expands to the full list of valid configurations (for pre-screening and the exhaustive baseline).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from pathlib import Path
from typing import Any, Literal, Union, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from tuner._yaml import bounded_load
from tuner.errors import ConfigError, TopologyError
from tuner.files import read_text
from tuner.metrics import Percentile, ServingMetrics
from tuner.models import ModelSpec
from tuner.topology import KNOBS, Role, Topology, cudagraph_grid_floor, ep_on_one_gpu, knob_default
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


# The searched knobs, their bounds (a space is typed by people: at most MAX_KNOB_VALUE) and the two whose choices
# are written otherwise than their values.
SEARCHED = tuple(name for name, knob in KNOBS.items() if knob.searched)
_CHOICE_TYPES: dict[str, Any] = {"gpu_memory_utilization": list[float] | FloatRange}


def _bounds(name: str) -> tuple[int, int]:
    meta = Topology.model_fields[name].metadata
    low = next((m.ge for m in meta if getattr(m, "ge", None) is not None), 0)
    high = next((m.le for m in meta if getattr(m, "le", None) is not None), MAX_KNOB_VALUE)
    return low, min(high, MAX_KNOB_VALUE)


_INT_KNOBS = tuple(n for n in SEARCHED if Topology.model_fields[n].annotation is int)
_BOUNDS = {name: _bounds(name) for name in _INT_KNOBS}


class _PhaseKnobs(_Strict):
    """A phase's choices of every searched knob; the fields come from Topology's knobs (PhaseSpace below)."""

    @field_validator(*SEARCHED, mode="before", check_fields=False)
    @classmethod
    def _bounded(cls, values: object) -> object:
        if isinstance(values, list) and len(values) > MAX_CHOICES_PER_KNOB:
            raise ValueError(f"at most {MAX_CHOICES_PER_KNOB} choices per knob")
        return values

    @field_validator(*_INT_KNOBS, check_fields=False)
    @classmethod
    def _in_bounds(cls, values: list[int], info: ValidationInfo) -> list[int]:
        low, high = _BOUNDS[info.field_name or ""]
        if any(not low <= v <= high for v in values):
            raise ValueError(f"{info.field_name} values must be in {low}..{high:,}")
        return sorted(set(values))

    @field_validator("max_cudagraph_capture_size", check_fields=False)
    @classmethod
    def _capture(cls, values: list[int | str]) -> list[int | str]:
        if any(v != "auto" and int(v) < 1 for v in values):
            raise ValueError("capture sizes must be >= 1 tokens, or auto")
        # vLLM truncates a cap to its capture grid (1, 2, 4, x8 below 256, x16 from 256): search what it keeps,
        # so 300 and 288 are one config, not two (vllm/config/vllm.py _set_cudagraph_sizes)
        values = ["auto" if v == "auto" else cudagraph_grid_floor(int(v)) for v in values]
        return sorted(set(values), key=lambda v: (v != "auto", v if v != "auto" else 0))

    @field_validator("gpu_memory_utilization", check_fields=False)
    @classmethod
    def _fraction(cls, value: list[float] | FloatRange) -> list[float] | FloatRange:
        values = value.values() if isinstance(value, FloatRange) else value
        if not values or any(not 0 < v <= 1 for v in values):
            raise ValueError("gpu_memory_utilization values must be in (0, 1]")
        return value

    @field_validator("concurrency", check_fields=False)
    @classmethod
    def _levels(cls, values: list[int]) -> list[int]:
        if any(not 1 <= v <= MAX_KNOB_VALUE for v in values):
            raise ValueError(f"every value must be in 1..{MAX_KNOB_VALUE:,}")
        return sorted(set(values))

    @model_validator(mode="after")
    def _expandable(self) -> _PhaseKnobs:
        if math.prod(len(self.choices(name)) for name in SEARCHED) > MAX_CONFIGS_PER_PHASE:
            raise ValueError(f"the knobs' choices multiply to more than {MAX_CONFIGS_PER_PHASE:,} configurations; "
                             "narrow some lists")
        return self

    def choices(self, name: str) -> list:
        """A knob's distinct choices, in the order given (numbers sorted); "auto" stands for an unset value."""
        if name == "gpu_memory_utilization":
            return self.utilizations()
        return list(dict.fromkeys(getattr(self, name)))

    def utilizations(self) -> list[float]:
        g = self.gpu_memory_utilization  # type: ignore[attr-defined]
        return g.values() if isinstance(g, FloatRange) else sorted(set(g))


def _space_default(name: str) -> object:
    """A phase's one choice when it does not list the knob: the Knob's space default, else Topology's (unset is
    written "auto")."""
    knob = KNOBS[name]
    default = knob.space_default if knob.space_default is not None else knob_default(name)
    return "auto" if default is None else default


def _choice_type(name: str) -> Any:
    """What a space may list for a knob: its values (a float knob also a range; an optional one also "auto")."""
    if name in _CHOICE_TYPES:
        return _CHOICE_TYPES[name]
    annotation = Topology.model_fields[name].annotation
    args = [a for a in get_args(annotation) if a is not type(None)]
    if len(args) < len(get_args(annotation)):  # optional: "auto" leaves it unset
        return list[Union[*args, Literal["auto"]]]
    return list[annotation]  # type: ignore[valid-type]


PhaseSpace = create_model(  # one list of choices per searched knob, named and typed as Topology's field
    "PhaseSpace", __base__=_PhaseKnobs, __module__=__name__, __doc__="A phase's choices of every knob, its load "
    "levels (`concurrency`) and its own workload lengths.",
    **{name: (_choice_type(name), Field([_space_default(name)], min_length=None if name in _CHOICE_TYPES else 1,
                                        max_length=64 if name == "max_cudagraph_capture_size" else None))
       for name in SEARCHED},
    concurrency=(list[int], Field(min_length=1, max_length=64)),
    workload=(PhaseWorkload, PhaseWorkload()),
)


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


class StudyConstraints(_Strict):
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
        if m.replayed_sla_attainment is not None:  # a simulated trial's replay counted each request
            return m.model_copy(update={"sla_attainment": m.replayed_sla_attainment})
        return m.within_sla(max_ttft_ms=self.max_ttft_ms, max_itl_ms=self.max_itl_ms)


class SearchSpace(_Strict):
    name: str
    description: str = ""
    cluster: ClusterSpec
    workload: WorkloadSpec
    constraints: StudyConstraints = StudyConstraints()
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
        """Every searched knob's choices, in Topology's knob order (the Optuna parameter order). Knobs added later
        appear only when searched, so studies stored before them keep their parameters (Knob.param)."""
        s = self.phases[phase]
        choices = {}
        for name, knob in KNOBS.items():
            values = [0] if name == "mtp" and phase == "prefill" else s.choices(name)
            if (knob.param == "always" or (knob.param == "searched" and values != [_space_default(name)])
                    or (knob.param == "varied" and len(values) > 1)):
                choices[name] = values
        return choices

    def params_of(self, phase: Phase, topo: Topology) -> dict[str, Any]:
        """The inverse of `topology`: a config's trial params, one per searched knob (a varied knob at its
        default too), so enqueued, repaired and sampled trials carry the same parameter set."""
        values = {name: getattr(topo, name) for name in self.param_choices(phase)}
        return {name: "auto" if value is None else value for name, value in values.items()}

    def topology(self, phase: Phase, params: dict) -> Topology:
        """A trial's config: its params, the phase's one choice of every knob it does not search."""
        s = self.phases[phase]
        fields = {name: params[name] if name in params else s.choices(name)[0] for name in KNOBS}
        return Topology.on_layout(role=phase_role(phase), **{  # "auto": an optional knob left unset
            name: None if value == "auto" and knob_default(name) is None else value for name, value in fields.items()})

    def expand(self, phase: Phase, model: ModelSpec) -> list[Topology]:
        """All valid configurations of a phase; raises if constraints leave none, saying which."""
        choices = self.param_choices(phase)
        out, seen, rejected = [], set(), Counter()
        for combo in itertools.product(*choices.values()):
            params = dict(zip(choices, combo, strict=True))
            if ep_on_one_gpu(params):
                continue  # the same config as EP off, which the product also holds
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
def _bounded_load(text: str, source: str) -> tuple[yaml.Node | None, object]:
    """The composed node (for line numbers) and the data, refused before anything walks the document when it is
    too long or aliases would blow it up (the guard lives in tuner._yaml: every user YAML goes through it)."""
    if len(text) > MAX_SPACE_CHARS:
        raise ConfigError(f"the space is {len(text):,} characters; at most {MAX_SPACE_CHARS:,}", field=source,
                          fix="a search space is a short file: see search_spaces/gb300-nvl72-8k1k.yaml")
    return bounded_load(text, source)


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
            ("workload",): list(WorkloadSpec.model_fields), ("constraints",): list(StudyConstraints.model_fields),
            ("prefill",): list(PhaseSpace.model_fields), ("decode",): list(PhaseSpace.model_fields),
            ("aggregated",): list(PhaseSpace.model_fields)}


def parse_space(text: str, source: str = "<space>") -> SearchSpace:
    node, data = _bounded_load(text, source)
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


def read_space_file(path: str | Path) -> SearchSpace:
    """The space a file holds, its trace not read yet (a service confines the trace's path first)."""
    path = Path(path)
    text = read_text(path, max_bytes=4 * MAX_SPACE_CHARS, field="--space", what="a search-space YAML file",
                     fix="a search space is a short file: see search_spaces/gb300-nvl72-8k1k.yaml")
    base = path.resolve().parent
    space = parse_space(text, str(path))
    trace = space.workload.trace
    if trace is not None and not Path(trace).expanduser().is_absolute():
        # resolved against the space file and stored absolute (#46): a campaign's `show`, `export` and `reverify`
        # read it back from any directory
        absolute = str((base / Path(trace).expanduser()).resolve())
        space = space.model_copy(update={"workload": space.workload.model_copy(update={"trace": absolute})})
    return space.with_base_dir(base)


def load_space(path: str | Path) -> SearchSpace:
    space = read_space_file(path)
    space.traffic  # noqa: B018 - a bad trace is reported at load, naming its line, not mid-study
    return space
