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
from tuner.study._trial_record import UNKNOWN_VERSION, TrialAttrs, TrialKind, TrialRecord, read_trials

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
    """The attributes of a trial holding one measured point (a sampled trial's representative or an extra)."""
    return TrialAttrs(concurrency=m.concurrency, load_level=level_label(m), metrics=m.model_dump(),
                      outcome=result.status,
                      deployment=json.loads(deployment.model_dump_json()), deployment_name=deployment.name,
                      vllm_version=result.vllm_version, model_revision=result.model_revision, **extra)


def judged_points(result: TrialResult, c: StudyConstraints) -> list[tuple[ServingMetrics, dict[str, float]]]:
    """A measured run's levels with their share within the SLA and their constraint detail. The accuracy gate's
    verdict: feasible unless the interval's upper bound is below the bar (sampling noise)."""
    gate = result.accuracy_gate
    accuracy = gate.ci_high if gate is not None else result.accuracy
    return [(m, point_constraints(m, c, accuracy)) for m in (c.judge(m) for m in result.points)]


def add_trial(study: optuna.Study, params: dict[str, Any], distributions: Mapping[str, BaseDistribution],
              values: Sequence[float], attrs: TrialAttrs, detail: dict[str, float], **user_attrs: Any) -> None:
    """Record a run (or one level of it) as a completed Optuna trial of a config's params: the one way a result
    enters a study besides telling the trial that asked for it."""
    study.add_trial(optuna.trial.create_trial(
        params=params, distributions={k: distributions[k] for k in params}, values=list(values),
        user_attrs={**attrs.user_attrs(), **user_attrs}, constraints=sampler_constraints(detail)))


def add_extra_levels(study: optuna.Study, phase: str, params: dict[str, Any],
                     distributions: Mapping[str, BaseDistribution], points: list[tuple[ServingMetrics, dict]],
                     told: int, parent: int, result: TrialResult, deployment: Deployment, topology: str) -> None:
    """The levels of a measured run beside the one told (`points[told]`, trial `parent`): each an extra trial of
    the same params, so the sampler and the fronts see every level."""
    for i, (extra, detail) in enumerate(points):
        if i != told:
            attrs = point_attrs(extra, result, deployment, kind=TrialKind.EXTRA, parent_trial=parent,
                                topology=topology, constraint_detail=detail)
            add_trial(study, params, distributions, phase_values(phase, extra), attrs, detail)


@dataclass(frozen=True)
class StoredPoint:
    """A measured point as stored in a trial: what the fronts, reports and the API read."""

    study: str
    phase: str
    trial_number: int
    params: dict[str, Any]
    deployment: Deployment
    metrics: ServingMetrics
    feasible: bool
    constraints: dict[str, float]
    vllm_version: str = UNKNOWN_VERSION  # what it was measured on ("unknown": stored before versions were kept)
    model_revision: str = UNKNOWN_VERSION
    measurement: int | None = None  # the trial whose run measured it (an extra level's parent), else its own

    @property
    def values(self) -> tuple[float, float]:
        return phase_values(self.phase, self.metrics)

    @property
    def trial(self) -> int:
        """The trial (one tried configuration) this point is a load level of: what every view numbers it by."""
        return self.measurement if self.measurement is not None else self.trial_number

    @property
    def level(self) -> str:
        """The load it was measured at: "c16" (16 clients) or "6.0 rps" (an open-loop rate)."""
        return level_label(self.metrics)

    @property
    def label(self) -> str:
        """"#8 c16": trial 8 at its 16-client level."""
        return f"#{self.trial} {self.level}"


def level_label(m: ServingMetrics) -> str:
    return f"{m.offered_rps:g} rps" if m.offered_rps is not None else f"c{m.concurrency}"


def stored_points(study: optuna.Study, phase: str, records: list[TrialRecord] | None = None
                  ) -> list[StoredPoint]:
    out = []
    for r in records if records is not None else read_trials(study):
        if r.state != TrialState.COMPLETE or r.attrs.metrics is None or r.attrs.deployment is None:
            continue
        if r.values is None or any(math.isnan(v) for v in r.values):
            continue
        detail = r.attrs.constraint_detail
        out.append(StoredPoint(study=study.study_name, phase=phase, trial_number=r.number, params=r.params,
                               deployment=Deployment.model_validate(r.attrs.deployment),
                               metrics=ServingMetrics.model_validate(r.attrs.metrics),
                               feasible=is_feasible(r.constraints),
                               constraints=dict(detail if detail is not None else r.constraints),
                               vllm_version=r.vllm_version, model_revision=r.model_revision,
                               measurement=r.attrs.parent_trial if r.attrs.parent_trial is not None else r.number))
    return out
