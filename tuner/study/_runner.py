"""The ask/tell driver of one phase study: the loop that asks, screens, submits, collects and heartbeats.

Call order per phase: open (or resume) the Optuna study -> reclaim RUNNING trials of a dead driver
(`_liveness.py`) -> warm start (the simulator's predicted front, enqueued once; `_warm_start.py`) -> loop while
the budget allows (`_budget.py`): ask while the executor has room, screen each config with the memory model and
the cluster's known risks (an impossible or known-crashing config is told infeasible, never launched, and
repaired; `_screen.py`), submit, heartbeat the
running trials, tell each finished trial (`_recorder.py`: its representative point, and its other concurrency
levels as completed trials of the same params). Progress goes to `on_event` (`_events.py`).
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.trial import TrialState

from tuner.backends import TrialRequest, TrialResult
from tuner.deployment import Deployment
from tuner.errors import ConfigError, TopotuneError
from tuner.executors import Executor
from tuner.hardware import GpuSpec
from tuner.models import ModelSpec
from tuner.space import Phase, SearchSpace, StudyConstraints
from tuner.study._budget import LoopState, Pending
from tuner.study._events import ProgressCallback, TrialEvent, trial_label
from tuner.study._guided import GuidedSampler
from tuner.study._liveness import beat, claim, reclaim_stale
from tuner.study._objectives import PHASE_METRICS
from tuner.study._options import TuneOptions
from tuner.study._optuna_compat import stored_trial
from tuner.study._recorder import Recorder, phase_distributions
from tuner.study._samplers import RepresentativeSampler, make_sampler, resolve_sampler
from tuner.study._screen import Rejection, Screen, params_key
from tuner.study._stop import STOP_POLL_S, StopSignal, cancel_requested
from tuner.study._transfer import StudyTransfer, default_prior
from tuner.study._trial_record import CampaignMeta, EventKind, TrialAttrs, TrialKind, TrialOutcome, read_trials
from tuner.study._warm_start import enqueue_warm_start
from tuner.topology import Topology

optuna.logging.set_verbosity(optuna.logging.WARNING)


def check_same_sla(meta: CampaignMeta, space: SearchSpace, study_name: str) -> None:
    """A resumed study keeps the constraints it started with: its stored trials were judged feasible by them, so
    other bounds (an SLA in seconds where milliseconds are meant) would mix two verdicts on one front."""
    stored = StudyConstraints.model_validate(meta.space.get("constraints", {}))
    for name in StudyConstraints.model_fields:
        was, now = getattr(stored, name), getattr(space.constraints, name)
        if was != now:
            field = f"sla.{name}" if name in ("max_ttft_ms", "max_itl_ms", "percentile") else f"constraints.{name}"
            raise ConfigError(f"{study_name} was run with `{field}` = {was}; resuming it with {now} would judge its "
                              "stored trials and the new ones by different bounds", field=field,
                              fix=f"resume with the study's `{field}` ({was}), or run the new bounds as a new "
                                  "study (another `storage`)")


@dataclass
class PhaseRun:
    phase: Phase
    space: SearchSpace
    model: ModelSpec
    model_path: str
    gpu: GpuSpec
    storage: optuna.storages.BaseStorage
    study_name: str
    backend_name: str
    executor: Executor
    options: TuneOptions
    artifacts_dir: Path
    warm_start_params: Callable[[], list[dict[str, Any]]] | None = None
    pair_with_tps: frozenset[int] = frozenset()  # PD pairing: the warm start's first params (hybrid models)
    on_event: ProgressCallback = lambda _event: None
    stop: StopSignal = field(default_factory=StopSignal)
    transfer: StudyTransfer | None = None  # the cluster's learnt knowledge (prior) and its store (recording)
    _screen: Screen = field(init=False, repr=False)
    _recorder: Recorder = field(init=False, repr=False)
    _started_at: float = field(default_factory=time.time, init=False, repr=False)  # orphans predate it

    def __post_init__(self) -> None:
        self._screen = Screen(self.space, self.phase, self.model, self.gpu,
                              risk=self.transfer.known_risk if self.transfer is not None else None)
        self._recorder = Recorder(self.phase, self.space, lambda event: self.on_event(event))

    @property
    def sampler_name(self) -> str:
        return resolve_sampler(self.options.sampler, self.options.trials)

    # -- set up ---------------------------------------------------------------------------------------
    def distributions(self) -> dict[str, BaseDistribution]:
        return phase_distributions(self.space, self.phase)

    def open_study(self) -> optuna.Study:
        sampler = make_sampler(self.sampler_name, self.options.seed,
                               prior=lambda: default_prior(self.space, self.phase, self.model, self.gpu, self.transfer))
        study = optuna.create_study(
            study_name=self.study_name, storage=self.storage, directions=["maximize", "maximize"],
            # the guided sampler reads every concurrency level itself; the others see one point per config
            sampler=sampler if isinstance(sampler, GuidedSampler) else RepresentativeSampler(sampler),
            load_if_exists=True)
        if not CampaignMeta.is_written(study.user_attrs):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(list(PHASE_METRICS[self.phase]))
            CampaignMeta.new(
                phase=self.phase, model=self.model.name, model_path=self.model_path, gpu=self.gpu.name,
                space=json.loads(self.space.model_dump_json()), backend=self.backend_name,
                sampler=self.sampler_name, seed=self.options.seed, trials=self.options.trials,
            ).write(study)
        else:
            check_same_sla(CampaignMeta.read(study.user_attrs), self.space, self.study_name)
        return study

    def reclaim_stale(self, study: optuna.Study) -> int:
        """Fail RUNNING trials whose driver is gone and enqueue their params again (`_liveness.py` says why
        not Optuna's own heartbeat)."""
        return reclaim_stale(study, phase=self.phase, started_at=self._started_at,
                             stale_after_s=self.options.stale_after_s, on_event=self.on_event)

    # -- the loop -------------------------------------------------------------------------------------
    def launched_count(self, study: optuna.Study) -> int:
        return sum(1 for r in read_trials(study, (TrialState.COMPLETE,)) if r.is_launch)

    def run(self) -> optuna.Study:
        """Open (or resume) the study, then loop: fill the executor, collect finished trials, heartbeat."""
        study = self.open_study()
        self.reclaim_stale(study)
        enqueue_warm_start(study, self.options, self.sampler_name, self.warm_start_params, self.pair_with_tps)
        loop = LoopState.resume(study)
        try:
            while loop.has_work(self.options.trials) and not self._cancel_requested(study):
                self._fill(study, loop)
                if not loop.running:
                    break  # nothing in flight and nothing more can start: the budget or the sampler is spent
                self._collect(study, loop)
                self._heartbeat(loop)
        finally:
            # cancelled, or an exception / Ctrl-C in the driver: leave nothing RUNNING
            self._cancel_all(study, loop)
        return study

    # -- the steps of the loop ------------------------------------------------------------------------
    def _cancel_requested(self, study: optuna.Study) -> bool:
        return self.stop.is_set() or cancel_requested(study)

    def _fill(self, study: optuna.Study, loop: LoopState) -> None:
        """Start trials while the budget and the executor allow: next candidate, then submit."""
        while loop.has_room(self.options.trials):
            if loop.pending is None:
                if loop.stops_asking(self.options, self.executor, self._screen.launchable_keys):
                    return
                loop.pending = self._next_candidate(study, loop)
                if loop.pending is None:
                    continue
            if not self._submit(study, loop):
                return  # waits for GPUs held by running trials

    def _next_candidate(self, study: optuna.Study, loop: LoopState) -> Pending | None:
        """Ask, screen (validity, memory), dedupe against measured and running configs; a rejected proposal is
        told as it is and repaired (the nearest unmeasured config that fits is enqueued). None when rejected."""
        trial = study.ask(self.distributions())
        claim(trial)
        topo, rejection = self.screen(trial.params)
        key = params_key(trial.params)
        if rejection is not None or key in loop.measured or key in loop.in_flight:
            if rejection is not None:
                self._recorder.tell_failure(study, trial, TrialKind.SCREENED, *rejection)
            else:
                self._recorder.tell_duplicate(study, trial, loop.measured.get(key))
            self._repair(study, trial.params, loop.taken(), trial.number)
            loop.screened += 1
            return None
        assert topo is not None
        loop.in_flight.add(key)
        TrialAttrs(kind=TrialKind.SAMPLED, topology=topo.label()).write(trial)
        return Pending(trial, self._request(trial, topo))

    def _submit(self, study: optuna.Study, loop: LoopState) -> bool:
        """Submit the pending trial; False when it must wait for GPUs that running trials hold."""
        assert loop.pending is not None
        trial, request = loop.pending.trial, loop.pending.request
        try:
            self.executor.check_placeable(request)
        except TopotuneError as exc:  # a shape this cluster can never hold: screened, then repaired
            self._recorder.tell_failure(study, trial, TrialKind.SCREENED, "valid", 1.0, exc.user_message(),
                                        outcome=TrialOutcome.UNPLACEABLE)
            loop.in_flight.discard(params_key(trial.params))
            self._repair(study, trial.params, loop.taken(), trial.number)
            loop.pending = None
            return True
        if not self.executor.can_start(request):
            if loop.running:
                return False
            self._recorder.tell_failure(
                study, trial, TrialKind.SAMPLED, "failed", 1.0,
                f"needs {request.deployment.num_gpus} GPUs, more than the executor can ever give",
                outcome=TrialOutcome.UNPLACEABLE)
            loop.pending = None
            loop.launched += 1
            return True
        TrialAttrs(artifacts_dir=request.artifacts_dir).write(trial)
        loop.running[self.executor.submit(request)] = trial
        loop.pending = None
        self.on_event(TrialEvent(self.phase, trial.number, EventKind.LAUNCHED, trial_label(trial.params)))
        return True

    def _collect(self, study: optuna.Study, loop: LoopState) -> None:
        """Tell every trial that finished within one heartbeat interval."""
        for handle in self.executor.wait(list(loop.running),
                                         timeout_s=min(self.options.heartbeat_s, STOP_POLL_S)):
            trial = loop.running.pop(handle)
            assert handle.result is not None
            self.tell(study, trial, handle.request, handle.result)
            key = params_key(trial.params)
            loop.in_flight.discard(key)
            loop.measured[key] = stored_trial(study, trial)
            loop.launched += 1

    def _heartbeat(self, loop: LoopState) -> None:
        if time.time() - loop.last_beat < self.options.heartbeat_s:
            return
        beat([*loop.running.values(), *([loop.pending.trial] if loop.pending else [])])
        loop.last_beat = time.time()

    def _repair(self, study: optuna.Study, params: dict[str, Any], taken: set[tuple], origin: int) -> None:
        """Known constraints (validity, memory) are cheap to check, so an ask is never wasted: the proposal is
        told as it is (infeasible or duplicate, so the sampler learns the boundary) and the nearest config that
        can run and has not been measured is enqueued as the next trial."""
        fix = self._screen.nearest_unmeasured(params, taken)
        if fix is not None:
            study.enqueue_trial(fix, user_attrs=TrialAttrs(repaired_from=origin).user_attrs())

    def _cancel_all(self, study: optuna.Study, loop: LoopState) -> None:
        cancelled = self.stop.cancelled or cancel_requested(study)
        for handle in list(loop.running):
            self.executor.cancel(handle)
        stopped = [*loop.running.values(), *([loop.pending.trial] if loop.pending else [])]
        self._recorder.tell_stopped(study, stopped, cancelled=cancelled)
        loop.running.clear()

    # -- screening and telling (the rules live in _screen.py and _recorder.py) ------------------------
    def screen(self, params: dict[str, Any]) -> tuple[Topology | None, Rejection | None]:
        """(topology, None) when launchable, else (None, (constraint key, amount, reason))."""
        return self._screen.screen(params)

    def _request(self, trial: optuna.Trial, topo: Topology) -> TrialRequest:
        folder = self.artifacts_dir / self.study_name.replace("/", "_") / f"trial-{trial.number:04d}"
        return TrialRequest(
            trial_id=f"{self.study_name}#{trial.number}", model_path=self.model_path, gpu=self.gpu.name,
            deployment=Deployment.single(topo), workload=self.space.phase_workload(self.phase),
            artifacts_dir=str(folder), timeout_s=self.options.trial_timeout_s,
            min_accuracy=self.space.constraints.min_accuracy, seed=self.options.seed * 1_000_003 + trial.number,
            vllm_version=self.space.cluster.vllm_version, max_ttft_ms=self.space.constraints.max_ttft_ms,
            max_itl_ms=self.space.constraints.max_itl_ms)

    def tell(self, study: optuna.Study, trial: optuna.Trial, request: TrialRequest, result: TrialResult) -> None:
        if self.transfer is not None and self.transfer.record(self.study_name, trial.number, request, result):
            refresh = getattr(study.sampler, "refresh_prior", None)
            if refresh is not None:  # the guard changed the prior: the guided sampler rebuilds it
                refresh()
        self._recorder.tell_result(study, trial, request, result)
