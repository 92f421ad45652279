"""The one schema of what topotune stores on an Optuna trial and study, with typed read and write.

Optuna keeps params, values, constraints and state; everything else a trial means to topotune (what kind of
trial it is, how it ended and why, where its logs are, every load level it measured) lives in its user
attributes. Every reader (the driver, the campaign, the listing, the sampler view, the API, `topotune logs`) goes
through `TrialRecord.read`, and every writer through `TrialAttrs.write`, so the keys are spelled once, here.

A trial's load levels are data of that one trial (`LoadLevel`, user attribute "load_levels"); studies stored
before that kept each other level as an Optuna trial of kind "extra", which still read as levels of their trial
(`TrialRecord.is_level`, docs/architecture.md "Trials and their load levels").
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, fields
from enum import StrEnum
from functools import cached_property
from typing import Any, ClassVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from tuner.backends import TrialStatus
from tuner.metrics import ServingMetrics, level_load
from tuner.study._optuna_compat import set_stored_user_attrs


class TrialKind(StrEnum):
    """What a trial is to the driver (user attribute "kind")."""

    SAMPLED = "sampled"  # a config the driver launched (or is launching) on the backend
    SCREENED = "screened"  # rejected before launch by validity or the memory model; told infeasible
    DUPLICATE = "duplicate"  # a config already measured or running: told the stored answer, never launched
    EXTRA = "extra"  # read only: a load level of another trial, as studies stored before "load_levels" kept them
    REVERIFY = "reverify"  # a front config measured again (`topotune reverify`): supersedes its older points


class TrialOutcome(StrEnum):
    """How the driver ended a trial the backend did not judge. A trial's outcome (user attribute "status") is
    a backend's `TrialStatus` (ok, oom, crashed, ...) or one of these."""

    FAILED = "failed"
    UNPLACEABLE = "unplaceable"  # a shape the executor can never hold
    DUPLICATE = "duplicate"
    RECLAIMED = "reclaimed"  # its driver died mid-trial; the config was enqueued again
    CANCELLED = "cancelled"  # the study was cancelled, or the driver stopped (then it is enqueued again)


Outcome = TrialStatus | TrialOutcome
RUNNING_STATUS = "running"  # what counts and listings call a trial with no outcome yet
UNKNOWN_VERSION = "unknown"  # the version (or model revision) of a trial stored before they were recorded


def parse_outcome(value: str | None) -> Outcome | None:
    if value is None:
        return None
    try:
        return TrialStatus(value)
    except ValueError:
        return TrialOutcome(value)


class EventKind(StrEnum):
    """What the progress view and the API hear about a trial (`TrialEvent.kind`)."""

    SCREENED = "screened"
    LAUNCHED = "launched"
    DONE = "done"
    FAILED = "failed"
    RECLAIMED = "reclaimed"


def level_label(m: ServingMetrics) -> str:
    """The load a point was measured at: "c16" (16 clients) or "6 rps" (an open-loop rate)."""
    return f"{m.offered_rps:g} rps" if m.offered_rps is not None else f"c{m.concurrency}"


@dataclass(frozen=True)
class LoadLevel:
    """One load level a trial measured (a concurrency or a request rate): its metrics, its phase objective
    values and its constraint detail. The one owner of how a level is stored: a trial keeps every level it
    measured as a list of these in its user attribute "load_levels"; the one it was told is `told_level`."""

    metrics_json: dict[str, Any]  # ServingMetrics as JSON (parsed on first use: the sampler reads only loads)
    values: tuple[float, ...]  # the phase objectives (tuner.study._objectives.phase_values)
    constraints: dict[str, float]  # every constraint key, <= 0 when met (the sampler sees only the worst)

    @cached_property
    def metrics(self) -> ServingMetrics:
        return ServingMetrics.model_validate(self.metrics_json)

    @property
    def load(self) -> float:
        """Its offered rate (open loop), else its clients: what orders a trial's levels."""
        return level_load(self.metrics_json.get("offered_rps"), self.metrics_json["concurrency"])

    @property
    def label(self) -> str:
        return level_label(self.metrics)

    @property
    def feasible(self) -> bool:
        return all(v <= 0 for v in self.constraints.values())

    @classmethod
    def of(cls, metrics: ServingMetrics, values: tuple[float, ...], constraints: dict[str, float]) -> LoadLevel:
        return cls(metrics_json=metrics.model_dump(), values=tuple(values), constraints=dict(constraints))

    def as_json(self) -> dict[str, Any]:
        return {"metrics": self.metrics_json, "values": list(self.values), "constraints": self.constraints}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LoadLevel:
        return cls(metrics_json=data["metrics"], values=tuple(float(v) for v in data["values"]),
                   constraints={k: float(v) for k, v in data["constraints"].items()})


@dataclass(frozen=True)
class TrialAttrs:
    """The user attributes topotune writes on a trial. Every field is optional: each is written when known
    (kind and driver at launch, the outcome when told, the point when measured)."""

    kind: TrialKind | None = None
    outcome: Outcome | None = None
    reason: str | None = None
    driver: str | None = None  # "host:pid" of the driver process that launched it
    heartbeat_at: float | None = None  # unix seconds; the driver refreshes it while the trial runs
    topology: str | None = None
    artifacts_dir: str | None = None
    duration_s: float | None = None
    accuracy: float | None = None
    accuracy_gate: dict[str, Any] | None = None  # the GSM8K gate's score, interval and sample size (AccuracyGate)
    observed_memory: dict[str, float] | None = None
    predicted_memory: dict[str, float] | None = None
    constraint_detail: dict[str, float] | None = None  # every constraint key; the sampler sees only the worst
    concurrency: int | None = None
    metrics: dict[str, Any] | None = None  # ServingMetrics as JSON
    deployment: dict[str, Any] | None = None  # Deployment as JSON
    deployment_name: str | None = None
    load_levels: tuple[LoadLevel, ...] | None = None  # every load level the trial measured, as measured
    told_level: int | None = None  # the index in load_levels of the level told to Optuna (the sampler's value)
    load_level: str | None = None  # "c16" or "6 rps": the load of the told level (`metrics`, `concurrency`)
    parent_trial: int | None = None  # read only: an old study's extra level's trial (TrialKind.EXTRA)
    retry_of: int | None = None  # the trial this one runs again (reclaimed or interrupted)
    repaired_from: int | None = None  # the screened or duplicate proposal this one replaces
    warm_start: str | None = None  # "simulator" for the enqueued predicted front
    # what the measurement ran on (absent on trials stored before versions were kept: read as "unknown")
    vllm_version: str | None = None
    model_revision: str | None = None
    reverify: dict[str, Any] | None = None  # a re-verification's verdict and samples (ReverifyRow as JSON)
    reopened_from: int | None = None  # an enqueued neighbour of a config whose speed changed on a new version

    _KEYS: ClassVar[dict[str, str]] = {"outcome": "status", "constraint_detail": "constraints"}

    def user_attrs(self) -> dict[str, Any]:
        """The fields that are set, under their stored keys (enums as plain strings)."""
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, StrEnum):
                value = str(value)
            elif f.name == "load_levels" and value is not None:
                value = [level.as_json() for level in value]
            if value is not None:
                out[self._KEYS.get(f.name, f.name)] = value
        return out

    def write(self, trial: optuna.Trial) -> None:
        for key, value in self.user_attrs().items():
            trial.set_user_attr(key, value)

    def write_stored(self, study: optuna.Study, trial: FrozenTrial) -> None:
        """Write on a trial this process did not ask (one a dead driver left RUNNING)."""
        set_stored_user_attrs(study, trial, self.user_attrs())

    @staticmethod
    def read_kind(user_attrs: dict[str, Any]) -> TrialKind | None:
        """The kind alone (the sampler view filters every trial on every ask: no full read)."""
        kind = user_attrs.get("kind")
        return TrialKind(kind) if kind is not None else None

    @classmethod
    def read(cls, user_attrs: dict[str, Any]) -> TrialAttrs:
        values = {f.name: user_attrs.get(cls._KEYS.get(f.name, f.name)) for f in fields(cls)}
        values["kind"] = cls.read_kind(user_attrs)
        values["outcome"] = parse_outcome(values["outcome"])
        if values["load_levels"] is not None:
            values["load_levels"] = tuple(LoadLevel.from_json(level) for level in values["load_levels"])
        return cls(**values)


@dataclass(frozen=True)
class TrialRecord:
    """One stored trial as topotune reads it: Optuna's own fields plus the typed attributes."""

    number: int
    state: TrialState
    params: dict[str, Any]
    values: tuple[float, ...] | None
    constraints: dict[str, float]  # what the sampler saw (one "feasibility" value)
    started_at: float | None  # unix seconds
    attrs: TrialAttrs

    @classmethod
    def read(cls, trial: FrozenTrial) -> TrialRecord:
        return cls(number=trial.number, state=trial.state, params=dict(trial.params),
                   values=tuple(trial.values) if trial.values else None,
                   constraints={k: float(v) for k, v in (trial.constraints or {}).items()},
                   started_at=trial.datetime_start.timestamp() if trial.datetime_start else None,
                   attrs=TrialAttrs.read(trial.user_attrs))

    @property
    def kind(self) -> TrialKind | None:
        return self.attrs.kind

    @property
    def is_level(self) -> bool:
        """A load level of another trial, as studies stored before "load_levels" kept them (an Optuna trial of
        kind "extra"): never a trial of its own in counts and listings."""
        return self.attrs.kind is TrialKind.EXTRA

    @property
    def load_levels(self) -> tuple[LoadLevel, ...]:
        """Every load level this stored trial holds: its "load_levels", or (a trial stored before them, or an old
        study's extra level) the one point of its told attributes; none when it measured nothing."""
        if self.attrs.load_levels is not None:
            return self.attrs.load_levels
        if self.attrs.metrics is None or self.values is None:
            return ()
        detail = self.attrs.constraint_detail
        return (LoadLevel(metrics_json=self.attrs.metrics, values=self.values,
                          constraints=dict(detail if detail is not None else self.constraints)),)

    @property
    def trial(self) -> int:
        """The trial this record belongs to: its own number, or for a load level its trial's."""
        return self.attrs.parent_trial if self.is_level and self.attrs.parent_trial is not None else self.number

    @property
    def vllm_version(self) -> str:
        """The vLLM the trial ran on; "unknown" for trials stored before versions were kept."""
        return self.attrs.vllm_version or UNKNOWN_VERSION

    @property
    def model_revision(self) -> str:
        return self.attrs.model_revision or UNKNOWN_VERSION

    @property
    def is_launch(self) -> bool:
        """A sampled trial: one launch of the backend (what budgets and `launched` counts count)."""
        return self.attrs.kind is TrialKind.SAMPLED

    @property
    def status(self) -> str:
        """The outcome, "running" while the trial runs, else Optuna's state (a trial told by another tool)."""
        if self.attrs.outcome is not None:
            return str(self.attrs.outcome)
        return RUNNING_STATUS if self.state == TrialState.RUNNING else self.state.name.lower()

    @property
    def feasible(self) -> bool:
        return self.state == TrialState.COMPLETE and all(v <= 0 for v in self.constraints.values())

    def last_beat(self) -> float:
        """When the driver last said this trial was alive (its start when it never beat)."""
        return self.attrs.heartbeat_at or self.started_at or 0.0


def read_trials(study: optuna.Study, states: tuple[TrialState, ...] | None = None) -> list[TrialRecord]:
    return drop_partial_reverifications([TrialRecord.read(t) for t in study.get_trials(deepcopy=False,
                                                                                        states=states)])


def drop_partial_reverifications(records: list[TrialRecord]) -> list[TrialRecord]:
    """Old studies: without a re-verification trial whose extra levels are not all stored (its process died
    between the writes) and those of its extras that are: it never happened, and the config's earlier
    measurement stands. Such a trial says how many levels it has (reverify.levels); one stored before that is
    whole, and one holding its "load_levels" was written in one insert."""
    expected = {r.number: int(r.attrs.reverify["levels"]) - 1 for r in records
                if r.kind is TrialKind.REVERIFY and r.attrs.reverify and "levels" in r.attrs.reverify
                and r.attrs.load_levels is None}
    if not expected:
        return records
    stored = Counter(r.attrs.parent_trial for r in records
                     if r.kind is TrialKind.EXTRA and r.attrs.parent_trial in expected)
    partial = {number for number, extras in expected.items() if stored[number] < extras}
    if not partial:
        return records
    return [r for r in records if r.number not in partial and r.attrs.parent_trial not in partial]


@dataclass(frozen=True)
class TrialFailure:
    """A trial that did not give a point, with why (what `topotune show` and the API list)."""

    trial_number: int
    status: str
    reason: str
    params: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"trial": self.trial_number, "status": self.status, "reason": self.reason, "params": self.params}


class StudyFlag(StrEnum):
    """Boolean study attributes."""

    WARM_STARTED = "warm_started"  # the simulator's front was enqueued once; never again on resume
    CANCEL_REQUESTED = "cancel_requested"  # set by the service: the driver stops and cancels in-flight trials


def study_flag(study: optuna.Study, flag: StudyFlag) -> bool:
    return bool(study.user_attrs.get(flag.value))


def set_study_flag(study: optuna.Study, flag: StudyFlag) -> None:
    study.set_user_attr(flag.value, True)


@dataclass(frozen=True)
class CampaignMeta:
    """What a phase study records about its campaign (study attribute "topotune"), written once at creation."""

    phase: str
    model: str
    model_path: str
    gpu: str
    space: dict[str, Any]  # the SearchSpace as JSON
    backend: str
    sampler: str
    seed: int
    trials: int
    created_at: float

    KEY: ClassVar[str] = "topotune"

    @classmethod
    def new(cls, **values: Any) -> CampaignMeta:
        return cls(created_at=time.time(), **values)

    def write(self, study: optuna.Study) -> None:
        study.set_user_attr(self.KEY, {f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def is_written(cls, user_attrs: dict[str, Any]) -> bool:
        return cls.KEY in user_attrs

    @classmethod
    def read(cls, user_attrs: dict[str, Any]) -> CampaignMeta:
        """Raises KeyError when the study was created but its metadata not yet written."""
        raw = user_attrs[cls.KEY]
        return cls(phase=raw.get("phase", ""), model=raw["model"], model_path=raw["model_path"], gpu=raw["gpu"],
                   space=raw["space"], backend=raw.get("backend", "?"), sampler=raw.get("sampler", "?"),
                   seed=int(raw.get("seed", 0)), trials=int(raw.get("trials", 0)),
                   created_at=float(raw.get("created_at", 0.0)))
