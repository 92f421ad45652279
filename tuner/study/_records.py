"""How a measured point or a failure is written into an Optuna trial (and read back)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState

from tuner.backends import TrialResult
from tuner.deployment import Deployment
from tuner.metrics import ServingMetrics
from tuner.space import StudyConstraints
from tuner.study._objectives import phase_values
from tuner.study._trial_record import (
    UNKNOWN_VERSION,
    LoadLevel,
    TrialAttrs,
    TrialRecord,
    level_label,
    read_trials,
)

# Why a point is infeasible, relative to its limit (<= 0 is feasible). Samplers see one constraint, the worst of
# these ("feasibility"): one constraint model to fit per ask instead of six. The detail is a user attr.
CONSTRAINT_KEYS: tuple[str, ...] = ("valid", "memory", "failed", "ttft", "itl", "accuracy")
SAMPLER_CONSTRAINT = "feasibility"
FAILED_VALUES: tuple[float, float] = (0.0, 0.0)


def point_constraints(m: ServingMetrics, c: StudyConstraints, accuracy: float | None) -> dict[str, float]:
    ttft = m.ttft_ms_at(c.percentile)
    itl = m.itl_ms_at(c.percentile)
    return {
        "valid": 0.0, "memory": 0.0, "failed": 0.0,
        "ttft": (ttft - c.max_ttft_ms) / c.max_ttft_ms if c.max_ttft_ms else 0.0,
        "itl": (itl - c.max_itl_ms) / c.max_itl_ms if c.max_itl_ms else 0.0,
        "accuracy": (c.min_accuracy - accuracy) if (c.min_accuracy is not None and accuracy is not None) else 0.0,
    }


def failure_constraints(key: str, amount: float = 1.0) -> dict[str, float]:
    out = dict.fromkeys(CONSTRAINT_KEYS, 0.0)
    out[key] = max(amount, 1e-6)
    return out


def sampler_constraints(detail: dict[str, float]) -> dict[str, float]:
    """One bounded value with a clear sign for the sampler's constraint model: -1 (or the tightest real slack)
    when feasible, a violation squashed into (0, 1) when not (a 1,000 GiB shortfall must not dwarf the rest)."""
    worst = max(detail.values())
    if worst > 0:
        return {SAMPLER_CONSTRAINT: worst / (1.0 + worst)}
    slack = [v for v in detail.values() if v < 0]
    return {SAMPLER_CONSTRAINT: max(slack) if slack else -1.0}


def is_feasible(constraints: dict[str, float]) -> bool:
    return all(v <= 0 for v in constraints.values())


def point_attrs(m: ServingMetrics, result: TrialResult, deployment: Deployment, **extra: Any) -> TrialAttrs:
    """The attributes of a trial's told point (what Optuna's dashboard shows as the trial's load and metrics)."""
    return TrialAttrs(concurrency=m.concurrency, load_level=level_label(m), metrics=m.model_dump(),
                      outcome=result.status,
                      deployment=json.loads(deployment.model_dump_json()), deployment_name=deployment.name,
                      vllm_version=result.vllm_version, model_revision=result.model_revision, **extra)


def measured_attrs(phase: str, points: list[tuple[ServingMetrics, dict[str, float]]], told: int,
                   result: TrialResult, deployment: Deployment, **extra: Any) -> TrialAttrs:
    """The attributes of a trial that measured `points` (judged_points) and is told `points[told]`: the told
    point's, and every level as data of this one trial (LoadLevel), so one run is one Optuna trial."""
    m, detail = points[told]
    levels = tuple(LoadLevel.of(p, phase_values(phase, p), cons) for p, cons in points)
    return point_attrs(m, result, deployment, constraint_detail=detail, load_levels=levels, told_level=told,
                       **extra)


def judged_points(result: TrialResult, c: StudyConstraints) -> list[tuple[ServingMetrics, dict[str, float]]]:
    """A measured run's levels with their share within the SLA and their constraint detail. The accuracy gate's
    verdict: feasible unless the interval's upper bound is below the bar (sampling noise)."""
    gate = result.accuracy_gate
    accuracy = gate.ci_high if gate is not None else result.accuracy
    return [(m, point_constraints(m, c, accuracy)) for m in (c.judge(m) for m in result.points)]


def add_trial(study: optuna.Study, params: dict[str, Any], distributions: Mapping[str, BaseDistribution],
              values: Sequence[float], attrs: TrialAttrs, detail: dict[str, float], **user_attrs: Any) -> None:
    """Record a run as a completed Optuna trial of a config's params (one insert, its load levels included):
    the one way a result enters a study besides telling the trial that asked for it."""
    study.add_trial(optuna.trial.create_trial(
        params=params, distributions={k: distributions[k] for k in params}, values=list(values),
        user_attrs={**attrs.user_attrs(), **user_attrs}, constraints=sampler_constraints(detail)))


@dataclass(frozen=True)
class PointRef:
    """How a measured point is addressed, everywhere (views, reports, re-verification): the trial it is a load
    level of and that load. Reads "#8 c16" (trial 8 at 16 clients) or "#8 6 rps" (open loop)."""

    trial: int
    level: str

    def __str__(self) -> str:
        return f"#{self.trial} {self.level}"


@dataclass(frozen=True)
class StoredPoint:
    """A measured point (one load level of a trial) as stored: what the fronts, reports and the API read."""

    study: str
    phase: str
    trial: int  # the trial (one tried configuration) this point is a load level of: what every view numbers
    stored_as: int  # the Optuna trial holding it: its trial, or in an old study an extra level's own trial
    params: dict[str, Any]
    deployment: Deployment
    metrics: ServingMetrics
    feasible: bool
    constraints: dict[str, float]
    vllm_version: str = UNKNOWN_VERSION  # what it was measured on ("unknown": stored before versions were kept)
    model_revision: str = UNKNOWN_VERSION

    @property
    def values(self) -> tuple[float, float]:
        return phase_values(self.phase, self.metrics)

    @property
    def level(self) -> str:
        """The load it was measured at: "c16" (16 clients) or "6 rps" (an open-loop rate)."""
        return level_label(self.metrics)

    @property
    def ref(self) -> PointRef:
        return PointRef(self.trial, self.level)

    @property
    def label(self) -> str:
        """"#8 c16": trial 8 at its 16-client level."""
        return str(self.ref)


def stored_points(study: optuna.Study, phase: str, records: list[TrialRecord] | None = None
                  ) -> list[StoredPoint]:
    """Every measured point of these records: the one place a trial is expanded into its load levels (each
    trial's `load_levels`; an old study's extra level is its own record, a point of its trial)."""
    out = []
    for r in records if records is not None else read_trials(study):
        if r.state != TrialState.COMPLETE or r.attrs.deployment is None:
            continue
        deployment = Deployment.model_validate(r.attrs.deployment)
        for level in r.load_levels:
            if any(math.isnan(v) for v in level.values):
                continue
            out.append(StoredPoint(study=study.study_name, phase=phase, trial=r.trial, stored_as=r.number,
                                   params=r.params, deployment=deployment, metrics=level.metrics,
                                   feasible=level.feasible, constraints=dict(level.constraints),
                                   vllm_version=r.vllm_version, model_revision=r.model_revision))
    return out
