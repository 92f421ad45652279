"""Recording into Optuna: how each way a trial ends is told to the study (and so to the sampler).

A measured trial is told with its representative load level (the one that adds most hypervolume) and keeps
every level it measured as data of that one trial (LoadLevel: one run is one Optuna trial, numbered
consecutively); a failure or a screened-out proposal is told with zero values and the constraint that explains
it; a duplicate gets the stored answer of the config's first trial; a stopped driver's trials are failed, and
re-enqueued unless the study was cancelled.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import TrialState

from tuner.backends import TrialRequest, TrialResult, TrialStatus
from tuner.frontier import hypervolume_2d
from tuner.space import Phase, SearchSpace
from tuner.study._events import ProgressCallback, TrialEvent, trial_label
from tuner.study._objectives import phase_values
from tuner.study._records import (
    FAILED_VALUES,
    failure_constraints,
    is_feasible,
    judged_points,
    measured_attrs,
    sampler_constraints,
)
from tuner.study._trial_record import EventKind, Outcome, TrialAttrs, TrialKind, TrialOutcome, TrialRecord


def phase_distributions(space: SearchSpace, phase: Phase) -> dict[str, BaseDistribution]:
    """The phase's knobs as Optuna distributions: what a trial is asked with (and a re-verification added with)."""
    return {k: CategoricalDistribution(v) for k, v in space.param_choices(phase).items()}


@dataclass
class Recorder:
    phase: Phase
    space: SearchSpace
    on_event: ProgressCallback

    def tell_result(self, study: optuna.Study, trial: optuna.Trial, request: TrialRequest,
                    result: TrialResult) -> None:
        TrialAttrs(duration_s=result.duration_s, vllm_version=result.vllm_version,
                   model_revision=result.model_revision, observed_memory=result.observed_memory or None,
                   predicted_memory=result.predicted_memory or None, accuracy=result.accuracy,
                   accuracy_gate=result.accuracy_gate.model_dump() if result.accuracy_gate else None).write(trial)
        if not result.status.ok or not result.points:
            key = "accuracy" if result.status is TrialStatus.ACCURACY else "failed"
            self.tell_failure(study, trial, TrialKind.SAMPLED, key, 1.0, result.reason or result.status.value,
                              outcome=result.status)
            return
        points = judged_points(result, self.space.constraints)
        best = self.representative(study, points)
        m, constraints = points[best]
        for name, value in sampler_constraints(constraints).items():
            trial.set_constraint(name, value)
        measured_attrs(self.phase, points, best, result, request.deployment).write(trial)
        study.tell(trial, list(phase_values(self.phase, m)))
        params = dict(trial.params)
        self.on_event(TrialEvent(self.phase, trial.number, EventKind.DONE, trial_label(params),
                                 f"{len(points)} levels", values=phase_values(self.phase, m)))

    def representative(self, study: optuna.Study, points: list) -> int:
        """The level that adds the most hypervolume to the current feasible front (every stored level of every
        trial): the sampler learns where a config helps most. Ties (nothing adds) fall back to the highest
        throughput."""
        current = [level.values for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                   for level in TrialRecord.read(t).load_levels if level.feasible and level.values[0] > 0]
        candidates = [(i, phase_values(self.phase, m)) for i, (m, cons) in enumerate(points) if is_feasible(cons)]
        if not candidates:
            return max(range(len(points)), key=lambda i: phase_values(self.phase, points[i][0])[0])
        base = hypervolume_2d(current, (0.0, 0.0))
        gains = [(hypervolume_2d([*current, v], (0.0, 0.0)) - base, v[0], i) for i, v in candidates]
        return max(gains)[2]

    def tell_failure(self, study: optuna.Study, trial: optuna.Trial, kind: TrialKind, key: str, amount: float,
                     reason: str, outcome: Outcome | None = None) -> None:
        detail = failure_constraints(key, amount)
        for name, value in sampler_constraints(detail).items():
            trial.set_constraint(name, value)
        screened = kind is TrialKind.SCREENED
        TrialAttrs(constraint_detail=detail, kind=kind, reason=reason,
                   outcome=outcome or (TrialStatus.INFEASIBLE if screened else TrialOutcome.FAILED)).write(trial)
        study.tell(trial, list(FAILED_VALUES))
        self.on_event(TrialEvent(self.phase, trial.number, EventKind.SCREENED if screened else EventKind.FAILED,
                                 trial_label(trial.params), reason))

    def tell_duplicate(self, study: optuna.Study, trial: optuna.Trial,
                       original: optuna.trial.FrozenTrial | None) -> None:
        """A config already measured (or running) is never launched twice: the sampler gets the stored answer."""
        TrialAttrs(kind=TrialKind.DUPLICATE, outcome=TrialOutcome.DUPLICATE,
                   reason=f"same config as trial {original.number}" if original else "config running").write(trial)
        if original is not None and original.values:
            for name, value in original.constraints.items():
                trial.set_constraint(name, value)
            study.tell(trial, list(original.values))
        else:
            study.tell(trial, state=TrialState.FAIL)

    def tell_stopped(self, study: optuna.Study, trials: Iterable[optuna.Trial], *, cancelled: bool) -> None:
        """Trials in flight when the loop ended: failed; an interrupted driver's run again on resume."""
        for trial in trials:
            TrialAttrs(outcome=TrialOutcome.CANCELLED,
                       reason="study cancelled" if cancelled else "driver stopped").write(trial)
            study.tell(trial, state=TrialState.FAIL)
            if not cancelled:  # an interrupted driver: the config runs again on resume
                study.enqueue_trial(dict(trial.params), user_attrs=TrialAttrs(retry_of=trial.number).user_attrs())

