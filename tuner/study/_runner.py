"""The ask/tell driver of one phase study: screen, launch, measure, tell, resume.

Call order per phase: open (or resume) the Optuna study -> reclaim RUNNING trials of a dead driver -> warm start
(the simulator's predicted front, enqueued once) -> loop: ask while the executor has room, screen each config
with the memory model (an impossible config is told infeasible and never launched), submit, heartbeat the
running trials, tell each finished trial with its representative point and add its other concurrency levels as
completed trials of the same params.
"""

from __future__ import annotations

import json
import os
import socket
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import TrialState

from tuner.backends import TrialRequest, TrialResult, TrialStatus
from tuner.deployment import Deployment
from tuner.errors import TopologyError, TopotuneError
from tuner.executors import Executor, TrialHandle
from tuner.frontier import hypervolume_2d, pareto_front
from tuner.hardware import GpuSpec
from tuner.launch import process_alive
from tuner.memory import MemoryInputs, compute_memory
from tuner.models import ModelSpec
from tuner.space import Phase, SearchSpace
from tuner.study._guided import GuidedSampler
from tuner.study._objectives import PHASE_METRICS, phase_values
from tuner.study._optuna_compat import fail_stored_trial, stored_trial
from tuner.study._records import (
    FAILED_VALUES,
    failure_constraints,
    is_feasible,
    point_attrs,
    point_constraints,
    sampler_constraints,
)
from tuner.study._samplers import RepresentativeSampler, make_sampler, resolve_sampler
from tuner.study._stop import STOP_POLL_S, StopSignal
from tuner.study._transfer import StudyTransfer, default_prior
from tuner.study._trial_record import (
    CampaignMeta,
    EventKind,
    Outcome,
    StudyFlag,
    TrialAttrs,
    TrialKind,
    TrialOutcome,
    TrialRecord,
    read_trials,
    set_study_flag,
    study_flag,
)
from tuner.topology import Topology

optuna.logging.set_verbosity(optuna.logging.WARNING)

DRIVER_ID = f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class TuneOptions:
    trials: int = 40  # launched (backend) trials per phase; screened-out configs do not count
    sampler: str = "auto"  # guided: the simulator's prediction corrected by a learnt residual (_guided.py)
    seed: int = 0
    warm_start: bool = True
    warm_start_trials: int | None = None  # default: a quarter of the budget
    trial_timeout_s: float = 3600.0
    heartbeat_s: float = 5.0
    stale_after_s: float = 120.0  # a RUNNING trial whose heartbeat is older belongs to a dead driver
    max_screened_per_trial: int = 25  # give up when the sampler keeps proposing configs that cannot run


@dataclass
class TrialEvent:
    """What the progress view and the API hear about."""

    phase: str
    number: int
    kind: EventKind
    label: str
    detail: str = ""
    values: tuple[float, float] | None = None


ProgressCallback = Callable[[TrialEvent], None]


@dataclass
class _Pending:
    """A trial asked and screened, waiting for free GPUs."""

    trial: optuna.Trial
    request: TrialRequest


@dataclass
class _Loop:
    """What one run of the ask/tell loop tracks between its steps."""

    launched: int  # sampled trials told (measured or failed): what the budget counts
    measured: dict[tuple, optuna.trial.FrozenTrial]  # config key -> its sampled trial, for dedupe
    in_flight: set[tuple] = field(default_factory=set)  # config keys pending or running
    running: dict[TrialHandle, optuna.Trial] = field(default_factory=dict)
    pending: _Pending | None = None
    screened: int = 0  # proposals rejected before launch (bounded by max_screened_per_trial)
    last_beat: float = 0.0

    def taken(self) -> set[tuple]:
        return set(self.measured) | self.in_flight

    def has_work(self, budget: int) -> bool:
        committed = self.launched + len(self.running) + (self.pending is not None)
        return committed < budget or bool(self.running) or self.pending is not None


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
    _fitting: list[Topology] | None = field(default=None, init=False, repr=False)
    _launchable: frozenset[tuple] | None = field(default=None, init=False, repr=False)
    _started_at: float = field(default_factory=time.time, init=False, repr=False)  # orphans predate it

    @property
    def sampler_name(self) -> str:
        return resolve_sampler(self.options.sampler, self.options.trials)

    # -- set up ---------------------------------------------------------------------------------------
    def distributions(self) -> dict[str, BaseDistribution]:
        return {k: CategoricalDistribution(v) for k, v in self.space.param_choices(self.phase).items()}

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
        return study

    def reclaim_stale(self, study: optuna.Study) -> int:
        """Fail RUNNING trials whose driver is gone and enqueue their params again.

        Why not Optuna's RDB heartbeat (`heartbeat_interval`, `fail_stale_trials`, `RetryFailedTrialCallback`):
        (1) its heartbeat thread is started by `Study.optimize` only; `Study.ask` warns that it is not supported;
        (2) it detects a dead process by time alone, while a driver killed on this host is known dead at once
        from its pid (a restarted `topotune tune` resumes immediately instead of after a grace period);
        (3) its retry copies every user attribute of the dead trial (outcome, driver, heartbeat) into the retry;
        (4) it is a setting of the storage, which the service shares across campaigns with other timeouts.
        """
        reclaimed = 0
        now = time.time()
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            record = TrialRecord.read(t)
            driver = record.attrs.driver or ""
            host, _, pid = driver.rpartition(":")
            dead_here = host == socket.gethostname() and pid.isdigit() and not process_alive(int(pid))
            # A driver claims its trial in the write right after `study.ask`; one killed between the two leaves an
            # unclaimed trial (often with only some params set). Asked before this driver started, it is an orphan.
            orphan = not driver and (record.started_at or 0.0) < self._started_at
            if not (dead_here or orphan or now - record.last_beat() > self.options.stale_after_s) \
                    or driver == DRIVER_ID:
                continue
            TrialAttrs(reason=f"driver {driver or '(unclaimed)'} stopped mid-trial", outcome=TrialOutcome.RECLAIMED
                       ).write_stored(study, t)
            fail_stored_trial(study, t)
            if record.kind is TrialKind.SAMPLED or (record.kind is None and not orphan):
                # launched, or asked and not yet screened (an orphan's params may be partial: not re-enqueued)
                study.enqueue_trial(record.params, user_attrs=TrialAttrs(retry_of=t.number).user_attrs())
            reclaimed += 1
            self.on_event(TrialEvent(self.phase, t.number, EventKind.RECLAIMED, _label(t.params), f"from {driver}"))
        return reclaimed

    # -- the loop -------------------------------------------------------------------------------------
    def launched_count(self, study: optuna.Study) -> int:
        return sum(1 for r in read_trials(study, (TrialState.COMPLETE,)) if r.is_launch)

    def run(self) -> optuna.Study:
        """Open (or resume) the study, then loop: fill the executor, collect finished trials, heartbeat."""
        study = self.open_study()
        self.reclaim_stale(study)
        self._warm_start_once(study)
        loop = self._start_loop(study)
        try:
            while loop.has_work(self.options.trials) and not self._cancel_requested(study):
                self._fill(study, loop)
                if not loop.running:
                    break  # nothing in flight and nothing more can start: the budget or the sampler is spent
                self._collect(study, loop)
                self._heartbeat(loop)
        finally:
            # cancelled, or an exception / Ctrl-C in the driver: leave nothing RUNNING
            self._cancel_all(study, loop.running, loop.pending.trial if loop.pending else None)
        return study

    # -- the steps of the loop ------------------------------------------------------------------------
    def _warm_start_once(self, study: optuna.Study) -> None:
        """Enqueue the simulator's predicted front, once per study (not again on resume)."""
        if (self.options.warm_start and self.warm_start_params
                and not study_flag(study, StudyFlag.WARM_STARTED)):
            budget = self.options.warm_start_trials or max(1, self.options.trials // 4)
            if self.sampler_name == "guided":  # it starts from the predicted front itself: enqueue PD pairs only
                budget = min(budget, len(self.pair_with_tps))
            for params in self.warm_start_params()[:budget]:
                study.enqueue_trial(params, user_attrs=TrialAttrs(warm_start="simulator").user_attrs())
            set_study_flag(study, StudyFlag.WARM_STARTED)

    def _start_loop(self, study: optuna.Study) -> _Loop:
        launches = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                    if TrialRecord.read(t).is_launch]
        return _Loop(launched=len(launches), measured={_params_key(t.params): t for t in launches})

    def _cancel_requested(self, study: optuna.Study) -> bool:
        return self.stop.is_set() or study_flag(study, StudyFlag.CANCEL_REQUESTED)

    def _fill(self, study: optuna.Study, loop: _Loop) -> None:
        """Start trials while the budget and the executor allow: next candidate, then submit."""
        while loop.launched + len(loop.running) < self.options.trials:
            if loop.pending is None:
                if loop.running and self.executor.at_capacity():
                    return  # ask once a slot is free: the proposal then sees the result that freed it
                if loop.screened >= self.options.max_screened_per_trial * self.options.trials:
                    return  # the sampler keeps proposing configs that cannot run
                if self._launchable_keys() and self._launchable_keys() <= loop.taken():
                    return  # every config that can run is measured or running: a budget beyond the space is spent
                # (with none launchable the proposals are screened, so the study records why each cannot run)
                loop.pending = self._next_candidate(study, loop)
                if loop.pending is None:
                    continue
            if not self._submit(study, loop):
                return  # waits for GPUs held by running trials

    def _next_candidate(self, study: optuna.Study, loop: _Loop) -> _Pending | None:
        """Ask, screen (validity, memory), dedupe against measured and running configs; a rejected proposal is
        told as it is and repaired (the nearest unmeasured config that fits is enqueued). None when rejected."""
        trial = study.ask(self.distributions())
        # claimed at once: a driver killed between ask and launch leaves a trial reclaim can attribute
        TrialAttrs(driver=DRIVER_ID, heartbeat_at=time.time()).write(trial)
        topo, rejection = self.screen(trial.params)
        key = _params_key(trial.params)
        if rejection is not None or key in loop.measured or key in loop.in_flight:
            if rejection is not None:
                self._tell_failure(study, trial, TrialKind.SCREENED, *rejection)
            else:
                self._tell_duplicate(study, trial, loop.measured.get(key))
            self._repair(study, trial.params, loop.taken(), trial.number)
            loop.screened += 1
            return None
        assert topo is not None
        loop.in_flight.add(key)
        TrialAttrs(kind=TrialKind.SAMPLED, topology=topo.label()).write(trial)
        return _Pending(trial, self._request(trial, topo))

    def _submit(self, study: optuna.Study, loop: _Loop) -> bool:
        """Submit the pending trial; False when it must wait for GPUs that running trials hold."""
        assert loop.pending is not None
        trial, request = loop.pending.trial, loop.pending.request
        try:
            self.executor.check_placeable(request)
        except TopotuneError as exc:  # a shape this cluster can never hold: screened, then repaired
            self._tell_failure(study, trial, TrialKind.SCREENED, "valid", 1.0, exc.user_message(),
                               outcome=TrialOutcome.UNPLACEABLE)
            loop.in_flight.discard(_params_key(trial.params))
            self._repair(study, trial.params, loop.taken(), trial.number)
            loop.pending = None
            return True
        if not self.executor.can_start(request):
            if loop.running:
                return False
            self._tell_failure(study, trial, TrialKind.SAMPLED, "failed", 1.0,
                               f"needs {request.deployment.num_gpus} GPUs, more than the executor can ever give",
                               outcome=TrialOutcome.UNPLACEABLE)
            loop.pending = None
            loop.launched += 1
            return True
        TrialAttrs(artifacts_dir=request.artifacts_dir).write(trial)
        loop.running[self.executor.submit(request)] = trial
        loop.pending = None
        self.on_event(TrialEvent(self.phase, trial.number, EventKind.LAUNCHED, _label(trial.params)))
        return True

    def _collect(self, study: optuna.Study, loop: _Loop) -> None:
        """Tell every trial that finished within one heartbeat interval."""
        for handle in self.executor.wait(list(loop.running),
                                         timeout_s=min(self.options.heartbeat_s, STOP_POLL_S)):
            trial = loop.running.pop(handle)
            assert handle.result is not None
            self.tell(study, trial, handle.request, handle.result)
            key = _params_key(trial.params)
            loop.in_flight.discard(key)
            loop.measured[key] = stored_trial(study, trial)
            loop.launched += 1

    def _heartbeat(self, loop: _Loop) -> None:
        if time.time() - loop.last_beat < self.options.heartbeat_s:
            return
        for trial in [*loop.running.values(), *([loop.pending.trial] if loop.pending else [])]:
            TrialAttrs(heartbeat_at=time.time()).write(trial)
        loop.last_beat = time.time()

    def _tell_duplicate(self, study: optuna.Study, trial: optuna.Trial,
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

    def _repair(self, study: optuna.Study, params: dict[str, Any], taken: set[tuple], origin: int) -> None:
        """Known constraints (validity, memory) are cheap to check, so an ask is never wasted: the proposal is
        told as it is (infeasible or duplicate, so the sampler learns the boundary) and the nearest config that
        can run and has not been measured is enqueued as the next trial."""
        fix = self._nearest_unmeasured(params, taken)
        if fix is not None:
            study.enqueue_trial(fix, user_attrs=TrialAttrs(repaired_from=origin).user_attrs())

    def _fitting_configs(self) -> list[Topology]:
        if self._fitting is None:
            w = self.space.phase_workload(self.phase)
            self._fitting = [t for t in self.space.expand(self.phase, self.model)
                             if compute_memory(self.model, self.gpu, t, MemoryInputs(isl=w.isl, osl=w.osl)).fits]
        return self._fitting

    def _launchable_keys(self) -> frozenset[tuple]:
        """Keys of the configs screening would launch: the fitting ones (memory already checked) that are valid."""
        if self._launchable is None:
            params = [self.space.params_of(self.phase, t) for t in self._fitting_configs()]
            self._launchable = frozenset(_params_key(p) for p in params if self._validity(p)[0] is not None)
        return self._launchable

    def _nearest_unmeasured(self, params: dict[str, Any], taken: set[tuple]) -> dict[str, Any] | None:
        """L1 distance over each knob's position in its list of choices (normalised to [0, 1])."""
        choices = self.space.param_choices(self.phase)

        def position(name: str, value: Any) -> float:
            options = choices[name]
            if len(options) < 2:
                return 0.0
            if value in options:
                index = options.index(value)
            else:  # a value outside the list (e.g. EP forced off on one GPU): the closest choice
                index = min(range(len(options)), key=lambda i: abs(float(options[i]) - float(value)))
            return index / (len(options) - 1)

        candidates = [self.space.params_of(self.phase, t) for t in self._fitting_configs()]
        candidates = [c for c in candidates if _params_key(c) not in taken]
        if not candidates:
            return None
        target = [position(k, params[k]) for k in choices]
        return min(candidates, key=lambda c: sum(abs(position(k, c[k]) - x) for k, x in zip(choices, target,
                                                                                              strict=True)))

    # -- screening -------------------------------------------------------------------------------------
    def screen(self, params: dict[str, Any]) -> tuple[Topology | None, tuple[str, float, str] | None]:
        """(topology, None) when launchable, else (None, (constraint key, amount, reason))."""
        topo, rejection = self._validity(params)
        if topo is None:
            return None, rejection
        workload = self.space.phase_workload(self.phase)
        memory = compute_memory(self.model, self.gpu, topo, MemoryInputs.for_workload(workload))
        if not memory.fits:
            return None, ("memory", max(memory.shortfall_gib, 0.01), memory.verdict())
        return topo, None

    def _validity(self, params: dict[str, Any]) -> tuple[Topology | None, tuple[str, float, str] | None]:
        """The screen's rules of vLLM and the cluster, memory aside: (topology, None) or (None, rejection)."""
        if params["ep"] and params["tp"] * params["dp"] == 1:
            return None, ("valid", 1.0, "EP on a single GPU")
        topo = self.space.topology(self.phase, params)
        try:
            topo.check(self.model, cluster_gpus=self.space.cluster.num_gpus)
        except TopologyError as exc:
            return None, ("valid", 1.0, exc.message)
        return topo, None

    def _request(self, trial: optuna.Trial, topo: Topology) -> TrialRequest:
        folder = self.artifacts_dir / self.study_name.replace("/", "_") / f"trial-{trial.number:04d}"
        return TrialRequest(
            trial_id=f"{self.study_name}#{trial.number}", model_path=self.model_path, gpu=self.gpu.name,
            deployment=Deployment.single(topo), workload=self.space.phase_workload(self.phase),
            artifacts_dir=str(folder), timeout_s=self.options.trial_timeout_s,
            min_accuracy=self.space.constraints.min_accuracy, seed=self.options.seed * 1_000_003 + trial.number,
            vllm_version=self.space.cluster.vllm_version)

    # -- telling ---------------------------------------------------------------------------------------
    def _tell_failure(self, study: optuna.Study, trial: optuna.Trial, kind: TrialKind, key: str, amount: float,
                      reason: str, outcome: Outcome | None = None) -> None:
        detail = failure_constraints(key, amount)
        for name, value in sampler_constraints(detail).items():
            trial.set_constraint(name, value)
        screened = kind is TrialKind.SCREENED
        TrialAttrs(constraint_detail=detail, kind=kind, reason=reason,
                   outcome=outcome or (TrialStatus.INFEASIBLE if screened else TrialOutcome.FAILED)).write(trial)
        study.tell(trial, list(FAILED_VALUES))
        self.on_event(TrialEvent(self.phase, trial.number, EventKind.SCREENED if screened else EventKind.FAILED,
                                 _label(trial.params), reason))

    def tell(self, study: optuna.Study, trial: optuna.Trial, request: TrialRequest, result: TrialResult) -> None:
        TrialAttrs(duration_s=result.duration_s, observed_memory=result.observed_memory or None,
                   predicted_memory=result.predicted_memory or None, accuracy=result.accuracy,
                   accuracy_gate=result.accuracy_gate.model_dump() if result.accuracy_gate else None).write(trial)
        if self.transfer is not None:
            self.transfer.record(self.study_name, trial.number, request, result)
        if not result.status.ok or not result.points:
            key = "accuracy" if result.status is TrialStatus.ACCURACY else "failed"
            self._tell_failure(study, trial, TrialKind.SAMPLED, key, 1.0, result.reason or result.status.value,
                               outcome=result.status)
            return
        c = self.space.constraints
        # the gate's verdict: feasible unless the interval's upper bound is below the bar (sampling noise)
        gate = result.accuracy_gate
        accuracy = gate.ci_high if gate is not None else result.accuracy
        judged = [c.judge(m) for m in result.points]
        points = [(m, point_constraints(m, c, accuracy)) for m in judged]
        best = self._representative(study, points)
        m, constraints = points[best]
        for name, value in sampler_constraints(constraints).items():
            trial.set_constraint(name, value)
        point_attrs(m, result, request.deployment, constraint_detail=constraints,
                    levels=[p.concurrency for p, _ in points]).write(trial)
        study.tell(trial, list(phase_values(self.phase, m)))
        dists = self.distributions()
        params = dict(trial.params)
        for i, (extra, extra_constraints) in enumerate(points):
            if i == best:
                continue
            attrs = point_attrs(extra, result, request.deployment, kind=TrialKind.EXTRA, parent_trial=trial.number,
                                topology=request.deployment.groups[0].topology.label(),
                                constraint_detail=extra_constraints)
            study.add_trial(optuna.trial.create_trial(
                params=params, distributions={k: dists[k] for k in params},
                values=list(phase_values(self.phase, extra)), user_attrs=attrs.user_attrs(),
                constraints=sampler_constraints(extra_constraints)))
        self.on_event(TrialEvent(self.phase, trial.number, EventKind.DONE, _label(params),
                                 f"{len(points)} levels", values=phase_values(self.phase, m)))

    def _representative(self, study: optuna.Study, points: list) -> int:
        """The level that adds the most hypervolume to the current feasible front: the sampler learns where a
        config helps most. Ties (nothing adds) fall back to the highest throughput."""
        current = [tuple(t.values) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                   if t.values and is_feasible(t.constraints) and t.values[0] > 0]
        candidates = [(i, phase_values(self.phase, m)) for i, (m, cons) in enumerate(points) if is_feasible(cons)]
        if not candidates:
            return max(range(len(points)), key=lambda i: phase_values(self.phase, points[i][0])[0])
        base = hypervolume_2d(current, (0.0, 0.0))
        gains = [(hypervolume_2d([*current, v], (0.0, 0.0)) - base, v[0], i) for i, v in candidates]
        return max(gains)[2]

    def _cancel_all(self, study: optuna.Study, running: dict[TrialHandle, optuna.Trial],
                    pending: optuna.Trial | None) -> None:
        cancelled = self.stop.cancelled or study_flag(study, StudyFlag.CANCEL_REQUESTED)
        for handle in list(running):
            self.executor.cancel(handle)
        for trial in [*running.values(), *([pending] if pending else [])]:
            TrialAttrs(outcome=TrialOutcome.CANCELLED,
                       reason="study cancelled" if cancelled else "driver stopped").write(trial)
            study.tell(trial, state=TrialState.FAIL)
            if not cancelled:  # an interrupted driver: the config runs again on resume
                study.enqueue_trial(dict(trial.params), user_attrs=TrialAttrs(retry_of=trial.number).user_attrs())
        running.clear()


def _label(params: dict[str, Any]) -> str:
    tp, dp = params.get("tp", 1), params.get("dp", 1)
    name = Topology(tp=tp, dp=dp, ep=bool(params.get("ep")) and tp * dp > 1).name
    mtp = f" MTP{params['mtp']}" if params.get("mtp") else ""
    return f"{name}{mtp} seqs={params.get('max_num_seqs')} util={params.get('gpu_memory_utilization')}"


def _params_key(params: dict[str, Any]) -> tuple:
    return tuple(sorted((k, v) for k, v in params.items() if k != "concurrency"))


def front_of(points: list, phase: str) -> list:
    """Pareto front (maximising both phase objectives) of StoredPoints."""
    return pareto_front(points, x=lambda p: p.values[0], y=lambda p: p.values[1])
