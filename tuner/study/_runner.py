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

from tuner.backends import TrialRequest, TrialResult
from tuner.deployment import Deployment
from tuner.errors import TopologyError, TopotuneError
from tuner.executors import Executor, TrialHandle
from tuner.frontier import hypervolume_2d, pareto_front
from tuner.hardware import GpuSpec
from tuner.memory import MemoryInputs, compute_memory
from tuner.models import ModelSpec
from tuner.space import Phase, SearchSpace
from tuner.study._objectives import PHASE_METRICS, phase_values
from tuner.study._records import (
    FAILED_VALUES,
    failure_constraints,
    is_feasible,
    point_attrs,
    point_constraints,
    sampler_constraints,
)
from tuner.study._samplers import RepresentativeSampler, make_sampler, resolve_sampler
from tuner.study._stop import STOP_POLL_S, StopSignal, cancel_requested
from tuner.study._warm_start import topology_params
from tuner.topology import Topology

optuna.logging.set_verbosity(optuna.logging.WARNING)

DRIVER_ID = f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class TuneOptions:
    trials: int = 40  # launched (backend) trials per phase; screened-out configs do not count
    sampler: str = "auto"  # gp for budgets up to 60 trials per phase, tpe beyond (see _samplers.py)
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
    kind: str  # "screened" | "launched" | "done" | "failed" | "reclaimed"
    label: str
    detail: str = ""
    values: tuple[float, float] | None = None


ProgressCallback = Callable[[TrialEvent], None]


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
    on_event: ProgressCallback = lambda _event: None
    stop: StopSignal = field(default_factory=StopSignal)
    _fitting: list[Topology] | None = field(default=None, init=False, repr=False)

    @property
    def sampler_name(self) -> str:
        return resolve_sampler(self.options.sampler, self.options.trials)

    # -- set up ---------------------------------------------------------------------------------------
    def distributions(self) -> dict[str, BaseDistribution]:
        return {k: CategoricalDistribution(v) for k, v in self.space.param_choices(self.phase).items()}

    def open_study(self) -> optuna.Study:
        study = optuna.create_study(
            study_name=self.study_name, storage=self.storage, directions=["maximize", "maximize"],
            sampler=RepresentativeSampler(make_sampler(self.sampler_name, self.options.seed)),
            load_if_exists=True)
        if "topotune" not in study.user_attrs:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                study.set_metric_names(list(PHASE_METRICS[self.phase]))
            study.set_user_attr("topotune", {
                "phase": self.phase, "model": self.model.name, "model_path": self.model_path,
                "gpu": self.gpu.name, "space": json.loads(self.space.model_dump_json()),
                "backend": self.backend_name, "sampler": self.sampler_name, "seed": self.options.seed,
                "trials": self.options.trials, "created_at": time.time(),
            })
        return study

    def reclaim_stale(self, study: optuna.Study) -> int:
        """Fail RUNNING trials whose driver is gone and enqueue their params again (ask/tell has no heartbeat)."""
        reclaimed = 0
        now = time.time()
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            driver = t.user_attrs.get("driver", "")
            host, _, pid = driver.rpartition(":")
            dead_here = host == socket.gethostname() and pid.isdigit() and not _pid_alive(int(pid))
            beat = t.user_attrs.get("heartbeat_at") or (t.datetime_start.timestamp() if t.datetime_start else 0)
            if not (dead_here or now - beat > self.options.stale_after_s) or driver == DRIVER_ID:
                continue
            study._storage.set_trial_user_attr(t._trial_id, "reason", f"driver {driver} stopped mid-trial")
            study._storage.set_trial_user_attr(t._trial_id, "status", "reclaimed")
            study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            if t.user_attrs.get("kind") == "sampled":
                study.enqueue_trial(dict(t.params), user_attrs={"retry_of": t.number})
            reclaimed += 1
            self.on_event(TrialEvent(self.phase, t.number, "reclaimed", _label(t.params), f"from {driver}"))
        return reclaimed

    # -- the loop -------------------------------------------------------------------------------------
    def launched_count(self, study: optuna.Study) -> int:
        return sum(1 for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                   if t.user_attrs.get("kind") == "sampled")

    def run(self) -> optuna.Study:
        study = self.open_study()
        self.reclaim_stale(study)
        if self.options.warm_start and self.warm_start_params and not study.user_attrs.get("warm_started"):
            budget = self.options.warm_start_trials or max(1, self.options.trials // 4)
            for params in self.warm_start_params()[:budget]:
                study.enqueue_trial(params, user_attrs={"warm_start": "simulator"})
            study.set_user_attr("warm_started", True)
        dists = self.distributions()
        running: dict[TrialHandle, optuna.Trial] = {}
        pending: tuple[optuna.Trial, TrialRequest] | None = None  # asked, waiting for free GPUs
        launched = self.launched_count(study)
        measured = {_params_key(t.params): t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                    if t.user_attrs.get("kind") == "sampled"}
        in_flight: set[tuple] = set()
        screened = 0
        last_beat = 0.0
        try:
            while launched + len(running) + (pending is not None) < self.options.trials or running or pending:
                if self.stop.is_set() or cancel_requested(study):
                    break
                while launched + len(running) < self.options.trials:
                    if pending is None:
                        if screened >= self.options.max_screened_per_trial * self.options.trials:
                            break  # the sampler keeps proposing configs that cannot run
                        trial = study.ask(dists)
                        topo, rejection = self.screen(trial.params)
                        key = _params_key(trial.params)
                        if rejection is not None or key in measured or key in in_flight:
                            if rejection is not None:
                                self._tell_failure(study, trial, "screened", *rejection)
                            else:
                                self._tell_duplicate(study, trial, measured.get(key))
                            self._repair(study, trial.params, set(measured) | in_flight, trial.number)
                            screened += 1
                            continue
                        in_flight.add(key)
                        trial.set_user_attr("kind", "sampled")
                        trial.set_user_attr("driver", DRIVER_ID)
                        trial.set_user_attr("heartbeat_at", time.time())
                        trial.set_user_attr("topology", topo.label())
                        pending = (trial, self._request(trial, topo))
                    trial, request = pending
                    try:
                        self.executor.check_placeable(request)
                    except TopotuneError as exc:  # a shape this cluster can never hold: screened, then repaired
                        self._tell_failure(study, trial, "screened", "valid", 1.0, exc.user_message(),
                                           status="unplaceable")
                        in_flight.discard(_params_key(trial.params))
                        self._repair(study, trial.params, set(measured) | in_flight, trial.number)
                        pending = None
                        continue
                    if not self.executor.can_start(request):
                        if not running:
                            self._tell_failure(study, trial, "sampled", "failed", 1.0,
                                               f"needs {request.deployment.num_gpus} GPUs, more than the executor "
                                               "can ever give", status="unplaceable")
                            pending = None
                            launched += 1
                            continue
                        break
                    trial.set_user_attr("artifacts_dir", request.artifacts_dir)
                    running[self.executor.submit(request)] = trial
                    pending = None
                    self.on_event(TrialEvent(self.phase, trial.number, "launched", _label(trial.params)))
                if not running:
                    break
                for handle in self.executor.wait(list(running), timeout_s=min(self.options.heartbeat_s,
                                                                               STOP_POLL_S)):
                    trial = running.pop(handle)
                    assert handle.result is not None
                    self.tell(study, trial, handle.request, handle.result)
                    key = _params_key(trial.params)
                    in_flight.discard(key)
                    measured[key] = study._storage.get_trial(trial._trial_id)
                    launched += 1
                if time.time() - last_beat >= self.options.heartbeat_s:
                    for trial in [*running.values(), *([pending[0]] if pending else [])]:
                        trial.set_user_attr("heartbeat_at", time.time())
                    last_beat = time.time()
        finally:
            # cancelled, or an exception / Ctrl-C in the driver: leave nothing RUNNING
            self._cancel_all(study, running, pending[0] if pending else None)
        return study

    def _tell_duplicate(self, study: optuna.Study, trial: optuna.Trial,
                        original: optuna.trial.FrozenTrial | None) -> None:
        """A config already measured (or running) is never launched twice: the sampler gets the stored answer."""
        trial.set_user_attr("kind", "duplicate")
        trial.set_user_attr("status", "duplicate")
        trial.set_user_attr("reason", f"same config as trial {original.number}" if original else "config running")
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
            study.enqueue_trial(fix, user_attrs={"repaired_from": origin})

    def _fitting_configs(self) -> list[Topology]:
        if self._fitting is None:
            w = self.space.phase_workload(self.phase)
            self._fitting = [t for t in self.space.expand(self.phase, self.model)
                             if compute_memory(self.model, self.gpu, t, MemoryInputs(isl=w.isl, osl=w.osl)).fits]
        return self._fitting

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

        candidates = [topology_params(t) for t in self._fitting_configs()]
        candidates = [c for c in candidates if _params_key(c) not in taken]
        if not candidates:
            return None
        target = [position(k, params[k]) for k in choices]
        return min(candidates, key=lambda c: sum(abs(position(k, c[k]) - x) for k, x in zip(choices, target,
                                                                                              strict=True)))

    # -- screening -------------------------------------------------------------------------------------
    def screen(self, params: dict[str, Any]) -> tuple[Topology | None, tuple[str, float, str] | None]:
        """(topology, None) when launchable, else (None, (constraint key, amount, reason))."""
        if params["ep"] and params["tp"] * params["dp"] == 1:
            return None, ("valid", 1.0, "EP on a single GPU")
        topo = self.space.topology(self.phase, params)
        try:
            topo.check(self.model, cluster_gpus=self.space.cluster.num_gpus)
        except TopologyError as exc:
            return None, ("valid", 1.0, exc.message)
        workload = self.space.phase_workload(self.phase)
        memory = compute_memory(self.model, self.gpu, topo, MemoryInputs(isl=workload.isl, osl=workload.osl))
        if not memory.fits:
            return None, ("memory", max(memory.shortfall_gib, 0.01), memory.verdict())
        return topo, None

    def _request(self, trial: optuna.Trial, topo: Topology) -> TrialRequest:
        folder = self.artifacts_dir / self.study_name.replace("/", "_") / f"trial-{trial.number:04d}"
        return TrialRequest(
            trial_id=f"{self.study_name}#{trial.number}", model_path=self.model_path, gpu=self.gpu.name,
            deployment=Deployment.single(topo), workload=self.space.phase_workload(self.phase),
            artifacts_dir=str(folder), timeout_s=self.options.trial_timeout_s,
            min_accuracy=self.space.constraints.min_accuracy, seed=self.options.seed * 1_000_003 + trial.number)

    # -- telling ---------------------------------------------------------------------------------------
    def _tell_failure(self, study: optuna.Study, trial: optuna.Trial, kind: str, key: str, amount: float,
                      reason: str, status: str | None = None) -> None:
        detail = failure_constraints(key, amount)
        trial.set_user_attr("constraints", detail)
        for name, value in sampler_constraints(detail).items():
            trial.set_constraint(name, value)
        trial.set_user_attr("kind", kind)
        trial.set_user_attr("status", status or ("infeasible" if kind == "screened" else "failed"))
        trial.set_user_attr("reason", reason)
        study.tell(trial, list(FAILED_VALUES))
        self.on_event(TrialEvent(self.phase, trial.number, "screened" if kind == "screened" else "failed",
                                 _label(trial.params), reason))

    def tell(self, study: optuna.Study, trial: optuna.Trial, request: TrialRequest, result: TrialResult) -> None:
        trial.set_user_attr("duration_s", result.duration_s)
        if result.observed_memory:
            trial.set_user_attr("observed_memory", result.observed_memory)
        if result.predicted_memory:
            trial.set_user_attr("predicted_memory", result.predicted_memory)
        if result.accuracy is not None:
            trial.set_user_attr("accuracy", result.accuracy)
        if not result.status.ok or not result.points:
            key = "accuracy" if result.status.value == "accuracy" else "failed"
            trial.set_user_attr("kind", "sampled")
            self._tell_failure(study, trial, "sampled", key, 1.0, result.reason or result.status.value,
                               status=result.status.value)
            return
        c = self.space.constraints
        points = [(m, point_constraints(m, c, result.accuracy)) for m in result.points]
        best = self._representative(study, points)
        m, constraints = points[best]
        trial.set_user_attr("constraints", constraints)
        for name, value in sampler_constraints(constraints).items():
            trial.set_constraint(name, value)
        for name, value in point_attrs(m, result, request.deployment).items():
            trial.set_user_attr(name, value)
        trial.set_user_attr("levels", [p.concurrency for p, _ in points])
        study.tell(trial, list(phase_values(self.phase, m)))
        dists = self.distributions()
        params = dict(trial.params)
        for i, (extra, extra_constraints) in enumerate(points):
            if i == best:
                continue
            attrs = {**point_attrs(extra, result, request.deployment), "kind": "extra", "parent_trial": trial.number,
                     "topology": request.deployment.groups[0].topology.label(), "constraints": extra_constraints}
            study.add_trial(optuna.trial.create_trial(
                params=params, distributions={k: dists[k] for k in params},
                values=list(phase_values(self.phase, extra)), user_attrs=attrs,
                constraints=sampler_constraints(extra_constraints)))
        self.on_event(TrialEvent(self.phase, trial.number, "done", _label(params),
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
        cancelled = self.stop.cancelled or cancel_requested(study)
        for handle in list(running):
            self.executor.cancel(handle)
        for trial in [*running.values(), *([pending] if pending else [])]:
            trial.set_user_attr("status", "cancelled")
            trial.set_user_attr("reason", "study cancelled" if cancelled else "driver stopped")
            study.tell(trial, state=TrialState.FAIL)
            if not cancelled:  # an interrupted driver: the config runs again on resume
                study.enqueue_trial(dict(trial.params), user_attrs={"retry_of": trial.number})
        running.clear()


def _label(params: dict[str, Any]) -> str:
    tp, dp = params.get("tp", 1), params.get("dp", 1)
    name = Topology(tp=tp, dp=dp, ep=bool(params.get("ep")) and tp * dp > 1).name
    mtp = f" MTP{params['mtp']}" if params.get("mtp") else ""
    return f"{name}{mtp} seqs={params.get('max_num_seqs')} util={params.get('gpu_memory_utilization')}"


def _params_key(params: dict[str, Any]) -> tuple:
    return tuple(sorted((k, v) for k, v in params.items() if k != "concurrency"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def front_of(points: list, phase: str) -> list:
    """Pareto front (maximising both phase objectives) of StoredPoints."""
    return pareto_front(points, x=lambda p: p.values[0], y=lambda p: p.values[1])
