"""The budget and the stop rules of the ask/tell loop: what it tracks between steps, and when it stops asking.

The budget counts launched trials (measured or failed), never screened-out proposals. The loop stops asking when
the budget is committed, when the executor is full (it asks again once a slot frees, so the proposal sees the
result that freed it), when the sampler keeps proposing configs that cannot run, or when every launchable config
is measured or running. A caller's cancel or interrupt is `_stop.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import optuna
from optuna.trial import TrialState

from tuner.backends import TrialRequest
from tuner.executors import Executor, TrialHandle
from tuner.study._options import TuneOptions
from tuner.study._screen import params_key
from tuner.study._trial_record import TrialRecord


@dataclass
class Pending:
    """A trial asked and screened, waiting for free GPUs."""

    trial: optuna.Trial
    request: TrialRequest


@dataclass
class LoopState:
    """What one run of the ask/tell loop tracks between its steps."""

    launched: int  # sampled trials told (measured or failed): what the budget counts
    measured: dict[tuple, optuna.trial.FrozenTrial]  # config key -> its sampled trial, for dedupe
    in_flight: set[tuple] = field(default_factory=set)  # config keys pending or running
    running: dict[TrialHandle, optuna.Trial] = field(default_factory=dict)
    pending: Pending | None = None
    screened: int = 0  # proposals rejected before launch (bounded by max_screened_per_trial)
    last_beat: float = 0.0

    @classmethod
    def resume(cls, study: optuna.Study) -> LoopState:
        """The budget already spent by earlier drivers of the study, and their configs for dedupe."""
        launches = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                    if TrialRecord.read(t).is_launch]
        return cls(launched=len(launches), measured={params_key(t.params): t for t in launches})

    def taken(self) -> set[tuple]:
        return set(self.measured) | self.in_flight

    def has_room(self, budget: int) -> bool:
        """Another trial may start: launched and running trials leave some of the budget."""
        return self.launched + len(self.running) < budget

    def has_work(self, budget: int) -> bool:
        committed = self.launched + len(self.running) + (self.pending is not None)
        return committed < budget or bool(self.running) or self.pending is not None

    def stops_asking(self, options: TuneOptions, executor: Executor,
                     launchable_keys: Callable[[], frozenset[tuple]]) -> bool:
        """No new proposal now (the budget aside, see `has_room`)."""
        if self.running and executor.at_capacity():
            return True  # ask once a slot is free: the proposal then sees the result that freed it
        if self.screened >= options.max_screened_per_trial * options.trials:
            return True  # the sampler keeps proposing configs that cannot run
        # every config that can run is measured or running: a budget beyond the space is spent
        # (with none launchable the proposals are screened, so the study records why each cannot run)
        return bool(launchable_keys()) and launchable_keys() <= self.taken()
