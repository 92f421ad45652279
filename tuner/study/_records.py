"""How a measured point or a failure is written into an Optuna trial (and read back)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.backends import TrialResult
from tuner.deployment import Deployment
from tuner.metrics import ServingMetrics
from tuner.space import Constraints
from tuner.study._objectives import phase_values
from tuner.study._trial_record import UNKNOWN_VERSION, TrialAttrs, TrialRecord, read_trials

# Why a point is infeasible, relative to its limit (<= 0 is feasible). Samplers see one constraint, the worst of
# these ("feasibility"): one constraint model to fit per ask instead of six. The detail is a user attr.
CONSTRAINT_KEYS: tuple[str, ...] = ("valid", "memory", "failed", "ttft", "itl", "accuracy")
SAMPLER_CONSTRAINT = "feasibility"
FAILED_VALUES: tuple[float, float] = (0.0, 0.0)


def point_constraints(m: ServingMetrics, c: Constraints, accuracy: float | None) -> dict[str, float]:
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
    return TrialAttrs(concurrency=m.concurrency, metrics=m.model_dump(), outcome=result.status,
                      deployment=json.loads(deployment.model_dump_json()), deployment_name=deployment.name,
                      vllm_version=result.vllm_version, model_revision=result.model_revision, **extra)


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
