"""Every use of Optuna's private API, in one place (so an Optuna upgrade is checked here, not across the tree).

Optuna's public ask/tell API cannot (a) change a trial that another, dead process left RUNNING, (b) re-read a
trial just told without reloading the whole study, (c) hand a sampler a filtered view of the trials, (d) read
only the trials added since a previous read (what keeps a live front incremental), or (e) count trials by state
and outcome without reading them all. These helpers do, through `Study._storage`, `Trial._trial_id`,
`Study._get_trials`, `RDBStorage._get_trials` and two aggregate queries on its tables (checked against
Optuna 5.0).
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


def trial_id(trial: FrozenTrial) -> int:
    """The storage's id of a trial (ids grow as trials are added, across the studies of a storage)."""
    return trial._trial_id


def trials_since(storage: optuna.storages.BaseStorage, study_id: int, watermark: int,
                 reread: set[int]) -> list[FrozenTrial]:
    """Trials with an id above `watermark`, plus the ids in `reread` (still running at the last read).

    Optuna's RDB storage answers this with one query (its own cache uses the same private call); other storages
    fall back to reading every trial.
    """
    if isinstance(storage, optuna.storages.RDBStorage):
        return storage._get_trials(study_id, None, set(reread), watermark)
    return [t for t in storage.get_all_trials(study_id, deepcopy=False)
            if t._trial_id > watermark or t._trial_id in reread]


def count_trials(storage: optuna.storages.RDBStorage) -> tuple[list[tuple[Any, int]], list[tuple[str, int]]]:
    """(trials by state, trials by "status" user attribute) of every study: two GROUP BYs on Optuna's tables
    (reading every trial through Optuna takes seconds at 10,000). A trial keeps its load levels in one user
    attribute, so one row is one trial; a study stored before that kept each other level as an Optuna trial of
    kind "extra": those are not trials and are left out."""
    from sqlalchemy import text

    levels = ("SELECT trial_id FROM trial_user_attributes WHERE key = 'kind' AND value_json = '\"extra\"'")
    with storage.engine.connect() as conn:
        by_state = conn.execute(text(f"SELECT state, COUNT(*) FROM trials WHERE trial_id NOT IN ({levels}) "
                                     "GROUP BY state")).all()
        by_outcome = conn.execute(text("SELECT value_json, COUNT(*) FROM trial_user_attributes "
                                       f"WHERE key = 'status' AND trial_id NOT IN ({levels}) "
                                       "GROUP BY value_json")).all()
    return [(s, int(n)) for s, n in by_state], [(str(v), int(n)) for v, n in by_outcome]
