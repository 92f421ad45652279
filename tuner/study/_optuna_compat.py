"""Every use of Optuna's private API, in one place (so an Optuna upgrade is checked here, not across the tree).

Optuna's public ask/tell API cannot (a) change a trial that another, dead process left RUNNING, (b) re-read a
trial just told without reloading the whole study, or (c) hand a sampler a filtered view of the trials. These
helpers do, through `Study._storage`, `Trial._trial_id` and `Study._get_trials` (checked against Optuna 5.0).
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState


def stored_trial(study: optuna.Study, trial: optuna.Trial) -> FrozenTrial:
    """The stored state of a trial just told (one row read, not the whole study)."""
    return study._storage.get_trial(trial._trial_id)


def set_stored_user_attrs(study: optuna.Study, trial: FrozenTrial, attrs: dict[str, Any]) -> None:
    """Write user attributes on a trial this process did not ask (e.g. one a dead driver left RUNNING)."""
    for key, value in attrs.items():
        study._storage.set_trial_user_attr(trial._trial_id, key, value)


def fail_stored_trial(study: optuna.Study, trial: FrozenTrial) -> None:
    """Mark a trial this process did not ask as FAIL."""
    study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)


def trials_for_sampler(study: optuna.Study, *, deepcopy: bool, states: Container[TrialState] | None,
                       use_cache: bool) -> list[FrozenTrial]:
    """What `Study._get_trials` returns: samplers call this private method, so a filtered view must offer it."""
    return study._get_trials(deepcopy=deepcopy, states=states, use_cache=use_cache)
