"""Re-verify a study's front on what the cluster runs now (a new vLLM, changed weights): `topotune reverify`.

Order of a re-verification:
1. targets: the configs of the exported recipes first (each composed-front point's prefill and decode config at
   its level, or the phase fronts of a single-phase study), then the rest of each phase front by throughput, cut
   to `budget` configs;
2. each target runs `repeats` times (TrialRequest.repeat 1..K: fresh runs) and its throughput per GPU at the stored
   point's concurrency is compared with the stored run(s) by the noise test (tuner.study._noise_test): unchanged,
   faster, slower, or no longer starts (every run failed);
3. the median run is stored in the phase study as one "reverify" trial (every level it measured as its
   load_levels, told the compared one), tagged with the version it ran on: from then on it is the config's
   current measurement (tuner.study._versions), the older points are that config's history;
4. the search re-opens where the front moved: around every changed config, its neighbours (one knob one step
   away, fitting in memory) that were measured on an older version are re-measured with the budget left, and
   those never measured are enqueued in the phase study (TrialAttrs.reopened_from), so the next `topotune tune`
   of the study (with a larger --trials) launches them first on the new version;
5. the report is stored on the study (REPORTS_KEY) for `topotune reverify --show`, the API and the page.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna

from tuner.backends import TrialRequest, TrialResult, TrialStatus
from tuner.deployment import Deployment
from tuner.errors import ConfigError, TopotuneError
from tuner.executors import Executor, TrialHandle
from tuner.hardware import get_gpu
from tuner.launch import process_alive
from tuner.memory import MemoryInputs, compute_memory
from tuner.metrics import ServingMetrics
from tuner.models import load_model
from tuner.space import SearchSpace
from tuner.study._campaign import CampaignResult, load_campaign, open_campaign_studies
from tuner.study._liveness import DRIVER_ID
from tuner.study._noise_test import Comparison, NoiseTest, Verdict
from tuner.study._objectives import phase_values
from tuner.study._records import (
    FAILED_VALUES,
    PointRef,
    StoredPoint,
    add_trial,
    failure_constraints,
    judged_points,
    measured_attrs,
)
from tuner.study._trial_record import UNKNOWN_VERSION, CampaignMeta, TrialAttrs, TrialKind, TrialRecord, read_trials
from tuner.study._versions import VersionTag, config_key
from tuner.topology import ep_on_one_gpu

REPORTS_KEY = "topotune_reverify"  # study attribute of the first phase study: every report, oldest first
MAX_ENQUEUED_PER_CONFIG = 4  # unmeasured neighbours enqueued around one changed config
PHASE_OF_ROLE = {"prefill": "prefill", "decode": "decode", "both": "aggregated"}


@dataclass(frozen=True)
class ReverifyOptions:
    budget: int = 8  # configs measured (each `repeats` times), recipe configs first, then front, then neighbours
    repeats: int = 3
    test: NoiseTest = field(default_factory=NoiseTest)
    reopen: bool = True  # re-measure and enqueue the neighbours of changed configs
    trial_timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise ConfigError(f"must be >= 1, got {self.budget}", field="--budget",
                              fix="give the number of configs to re-measure (recipe configs come first)")
        if not 1 <= self.repeats <= 50:
            raise ConfigError(f"must be in 1..50, got {self.repeats}", field="--repeats",
                              fix="3 repeated runs per config is the usual choice")


@dataclass(frozen=True)
class _Target:
    phase: str
    point: StoredPoint  # the stored measurement it is compared with (its concurrency level)
    why: str  # "recipe", "front" or "neighbour of trial N"


@dataclass(frozen=True)
class ReverifyRow:
    """One re-measured config: what it was, what it is now, and the verdict."""

    phase: str
    trial: int  # the Optuna trial holding the stored point compared with (StoredPoint.stored_as)
    config: str  # topology label
    params: dict[str, Any]
    concurrency: int
    why: str
    from_version: str  # VersionTag.label of the stored measurement
    verdict: str  # a Verdict
    comparison: dict[str, Any] | None  # Comparison.as_json(); None when it no longer starts
    new_trial: int | None = None  # the stored re-measurement
    detail: str = ""
    meets_sla_before: bool = True
    meets_sla_after: bool | None = None
    # The front's own figure (goodput tok/s/GPU, phase_values) of the stored point and of the median new run: what
    # a "before/after" shows, so it reads the number the front printed (the test compares total tok/s/GPU runs).
    front_before: float | None = None
    front_after: float | None = None
    of_trial: int | None = None  # the trial (tried configuration) the stored point is a load level of
    level: str | None = None  # the stored point's load label ("c16", "6 rps"); rows stored before: c{concurrency}

    @property
    def ref(self) -> PointRef:
        """The point compared (a row stored before `of_trial` was kept names the point's own stored number)."""
        return PointRef(self.of_trial if self.of_trial is not None else self.trial,
                        self.level or f"c{self.concurrency}")

    @property
    def label(self) -> str:
        """"#8 c16": the trial and load compared."""
        return str(self.ref)

    def compared(self, point: StoredPoint) -> bool:
        """Whether `point` is the stored point this row compared with (in a study stored with extra levels too:
        `trial` is the number of the Optuna trial holding the point, in every row)."""
        return point.stored_as == self.trial and point.level == self.ref.level

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReverifyRow:
        """A row as stored in a report or on a re-verification trial (whose extra keys are left out)."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    @property
    def ratio(self) -> float | None:
        return self.comparison["ratio"] if self.comparison else None


@dataclass
class ReverifyReport:
    campaign: str
    to_version: str  # VersionTag.label of what the runs ran on
    vllm_version: str
    model_revision: str
    budget: int
    repeats: int
    noise_floor: float
    alpha: float
    min_effect: float
    started_at: float
    finished_at: float = 0.0
    rows: list[ReverifyRow] = field(default_factory=list)
    enqueued: list[dict[str, Any]] = field(default_factory=list)  # {phase, params, reopened_from}
    id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    status: str = "complete"  # or "failed": it stopped (an error, or its process died) before it finished
    error: str | None = None  # why a failed one stopped; its rows are the configs stored before that

    def counts(self) -> dict[str, int]:
        out = {str(v): 0 for v in Verdict}
        for r in self.rows:
            out[r.verdict] += 1
        return out

    @property
    def changed(self) -> list[ReverifyRow]:
        return [r for r in self.rows if r.verdict != Verdict.UNCHANGED]

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "counts": self.counts()}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ReverifyReport:
        values = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        values["rows"] = [ReverifyRow.from_json(r) for r in data.get("rows", [])]
        return cls(**values)


def stored_reports(storage_url: str, name: str) -> list[ReverifyReport]:
    """Every re-verification of a study, oldest first (none for a study never re-verified)."""
    study = next(iter(open_campaign_studies(storage_url, name).values()))
    return [ReverifyReport.from_json(r) for r in study.user_attrs.get(REPORTS_KEY, [])]


# -- a re-verification in flight: its claim on the study, its heartbeat, and a dead one found -----------------
RUNNING_KEY = "topotune_reverify_running"  # study attribute of the first phase study while one runs
HEARTBEAT_S = 5.0
STALE_AFTER_S = 120.0  # a claim from another host with no heartbeat for this long is a dead process's


@dataclass(frozen=True)
class ReverifyState:
    """Whether a re-verification of a study runs now (in any process), and why the newest one failed if it did."""

    running: bool
    error: str | None
    recovered: ReverifyReport | None = None  # an interrupted one this read found and stored as failed


def _process_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (a pid reused by a later process, e.g. a restarted container's, differs)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_bytes().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _claim_alive(claim: dict[str, Any], now: float) -> bool:
    host, _, pid = str(claim.get("driver", "")).rpartition(":")
    if host == socket.gethostname() and pid.isdigit():
        return process_alive(int(pid)) and _process_start(int(pid)) == claim.get("process_start")
    return now - float(claim.get("heartbeat_at", 0.0)) <= STALE_AFTER_S


def _first_study(studies: dict[str, optuna.Study]) -> optuna.Study:
    return studies[next(iter(studies))]


def _recover(first: optuna.Study) -> tuple[dict[str, Any] | None, ReverifyReport | None]:
    """(the live claim or None, the interrupted re-verification this found and stored as failed or None)."""
    claim = first.user_attrs.get(RUNNING_KEY)
    if not claim:
        return None, None
    now = time.time()
    if _claim_alive(claim, now):
        return claim, None
    reports = first.user_attrs.get(REPORTS_KEY, [])
    report = None
    if not any(r.get("id") == claim.get("id") for r in reports):  # its own end wrote the report: only clear
        beat = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(claim.get("heartbeat_at", now))))
        blank = {"campaign": first.study_name.rsplit("/", 1)[0], "to_version": "", "vllm_version": UNKNOWN_VERSION,
                 "model_revision": UNKNOWN_VERSION, "budget": 0, "repeats": 0, "noise_floor": 0.0, "alpha": 0.0,
                 "min_effect": 0.0, "started_at": float(claim.get("started_at", now))}
        so_far = claim.get("report") if isinstance(claim.get("report"), dict) else {}
        report = ReverifyReport.from_json({**blank, **so_far, "id": claim.get("id"), "finished_at": now,
                                           "status": "failed", "error": (
            f"interrupted: the re-verifying process {claim.get('driver')} ended without finishing (killed or "
            f"crashed; last heartbeat {beat}); the configs it finished are stored, the one in progress is not "
            "(its earlier measurement stands): re-verify again")})
        first.set_user_attr(REPORTS_KEY, [*reports, report.as_json()])
    first.set_user_attr(RUNNING_KEY, None)
    return None, report


def reverify_state(storage_url: str, name: str) -> ReverifyState:
    """Is a re-verification of `name` running, and did the newest fail? A claim left by a dead process (kill -9,
    a crash, a lost host) is stored as a failed report here, so it is reported and the study can be re-verified."""
    first = _first_study(open_campaign_studies(storage_url, name))
    claim, recovered = _recover(first)
    reports = first.user_attrs.get(REPORTS_KEY, [])
    newest = reports[-1] if reports else {}
    return ReverifyState(running=claim is not None,
                         error=newest.get("error") if newest.get("status") == "failed" else None,
                         recovered=recovered)


class _Heartbeat:
    """The running claim on the first phase study, refreshed every HEARTBEAT_S from a thread while the
    re-verification runs (its verdicts so far ride along, so a dead one's report keeps them)."""

    def __init__(self, study: optuna.Study, report: ReverifyReport) -> None:
        self.study, self.report = study, report
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="topotune-reverify-heartbeat", daemon=True)

    def claim(self) -> dict[str, Any]:
        return {"id": self.report.id, "driver": DRIVER_ID, "process_start": _process_start(os.getpid()),
                "started_at": self.report.started_at, "heartbeat_at": time.time(), "report": self.report.as_json()}

    def start(self) -> None:
        self.study.set_user_attr(RUNNING_KEY, self.claim())
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self.study.set_user_attr(RUNNING_KEY, self.claim())
            except Exception:  # a busy database misses one beat; the next one (or the end) writes again
                continue

    def stop(self) -> None:
        """Stops the beats and waits for one in progress (the caller then clears the claim)."""
        self._stop.set()
        self._thread.join()


# -- choosing what to re-measure ------------------------------------------------------------------------------
def _same_config(phase: str, a: Deployment, topo: object) -> bool:
    stored = a.groups[0].topology
    # a composed point's prefill instance carries the decode side's MTP depth (tuner.study.compose_curves)
    return stored == (topo.model_copy(update={"mtp": stored.mtp}) if phase == "prefill" else topo)  # type: ignore[attr-defined]


def recipe_targets(result: CampaignResult) -> list[_Target]:
    """The measured points behind the exported recipes, in export order (point 0 first)."""
    out: list[_Target] = []
    if result.composed_front:
        for cp in result.composed_front:
            for phase, topo, m in (("prefill", cp.prefill_topology, cp.prefill),
                                   ("decode", cp.decode_topology, cp.decode)):
                pr = result.phases.get(phase)
                match = [p for p in (pr.points if pr else []) if p.feasible and p.metrics.concurrency == m.concurrency
                         and _same_config(phase, p.deployment, topo)]
                if match:
                    out.append(_Target(phase, max(match, key=lambda p: p.values[0]), "recipe"))
        return out
    for phase, pr in result.phases.items():
        out += [_Target(phase, p, "recipe") for p in sorted(pr.front, key=lambda p: -p.values[0])]
    return out


def recipe_versions(result: CampaignResult) -> list[str]:
    """What each exportable deployment's measurements ran on (VersionTag.label), in export order: an exported
    recipe names the version it was verified on."""
    if result.exports_composed:
        out = []
        for cp in result.composed_front:
            labels = []
            for phase, topo, m in (("prefill", cp.prefill_topology, cp.prefill), ("decode", cp.decode_topology,
                                                                                  cp.decode)):
                pr = result.phases.get(phase)
                match = [p for p in (pr.points if pr else []) if p.metrics.concurrency == m.concurrency
                         and _same_config(phase, p.deployment, topo)]
                labels.append(f"{phase} {VersionTag.of(match[0]).label}" if match else f"{phase} (not found)")
            plain = {label.split(" ", 1)[1] for label in labels}
            out.append(plain.pop() if len(plain) == 1 else ", ".join(labels))
        return out
    return [VersionTag.of(p).label for pr in result.phases.values() for p in pr.front]


def front_targets(result: CampaignResult) -> list[_Target]:
    """Recipe configs first, then every phase front's other configs by throughput; one target per config."""
    out: list[_Target] = []
    seen: set[tuple[str, tuple]] = set()
    others = [_Target(ph, p, "front") for ph, pr in result.phases.items()
              for p in sorted(pr.front, key=lambda p: -p.values[0])]
    for t in [*recipe_targets(result), *others]:
        key = (t.phase, config_key(t.point.params))
        if key not in seen:
            seen.add(key)
            out.append(t)
    return out


# -- measuring ----------------------------------------------------------------------------------------------
def _run_all(executor: Executor, requests: list[TrialRequest]) -> dict[str, TrialResult]:
    """Every request through the executor, as many at once as it allows; results by trial id."""
    queue, running, out = list(requests), [], {}
    while queue or running:
        while queue and executor.can_start(queue[0]):
            running.append(executor.submit(queue.pop(0)))
        if not running:  # nothing fits even on an idle executor: report it as the run's failure
            request = queue.pop(0)
            out[request.trial_id] = TrialResult.failed(
                TrialStatus.CRASHED, f"needs {request.deployment.num_gpus} GPUs, more than the executor can give")
            continue
        done: list[TrialHandle] = executor.wait(running, timeout_s=1.0)
        for handle in done:
            running.remove(handle)
            assert handle.result is not None
            out[handle.request.trial_id] = handle.result
    return out


def _at_level(points: tuple[ServingMetrics, ...], concurrency: int) -> ServingMetrics | None:
    if not points:
        return None
    return min(points, key=lambda m: (abs(m.concurrency - concurrency), m.concurrency))


def _old_runs(study: optuna.Study, point: StoredPoint) -> list[float]:
    """The stored throughput runs of a point: its own, or the samples its re-verification kept (at the level it
    compared, the one its trial was told; its other levels ran once)."""
    record = TrialRecord.read(study.get_trials(deepcopy=False)[point.stored_as])
    samples = (record.attrs.reverify or {}).get("samples_tok_s")
    if samples and record.attrs.load_level in (None, point.level):
        return [float(v) for v in samples]
    return [point.metrics.total_tok_s_per_gpu]


@dataclass
class Reverifier:
    """One re-verification of the campaign `name` in `storage_url`, measured through `executor`."""

    storage_url: str
    name: str
    executor: Executor
    options: ReverifyOptions = field(default_factory=ReverifyOptions)
    artifacts_dir: Path = Path("artifacts")
    on_row: Callable[[ReverifyRow], None] = lambda _row: None

    def __post_init__(self) -> None:
        self.result, self.space, self.meta = load_campaign(self.storage_url, self.name)
        self.studies = open_campaign_studies(self.storage_url, self.name)
        self.model = load_model(self.meta.model_path)
        self.gpu = get_gpu(self.meta.gpu)

    def run(self) -> ReverifyReport:
        """Claim the study, measure, store; the report is stored whatever happens (failed, with the error, if
        anything raises). A process that dies here leaves its claim, which the next reverify_state or run finds
        dead and stores as a failed report."""
        opts = self.options
        report = ReverifyReport(campaign=self.result.name, to_version="", vllm_version=UNKNOWN_VERSION,
                                model_revision=UNKNOWN_VERSION, budget=opts.budget, repeats=opts.repeats,
                                noise_floor=opts.test.noise_floor, alpha=opts.test.alpha,
                                min_effect=opts.test.min_effect, started_at=time.time())
        targets = front_targets(self.result)[:opts.budget]
        if not targets:
            raise ConfigError(f"{self.name} has no front to re-verify", field="STUDY",
                              fix="run the study first (`topotune tune`), then re-verify its front")
        first = _first_study(self.studies)
        claim, _ = _recover(first)
        if claim is not None:
            raise ConfigError(f"a re-verification of {self.name} is already running ({claim.get('driver')})",
                              field="STUDY", fix="wait for it to finish (its report lands on the study)")
        heartbeat = _Heartbeat(first, report)
        heartbeat.start()
        try:
            report.rows += self._measure(targets, report)
            if opts.reopen:
                again, enqueue = self._neighbours([r for r in report.rows if r.verdict != Verdict.UNCHANGED],
                                                  {(t.phase, config_key(t.point.params)) for t in targets})
                report.rows += self._measure(again[:opts.budget - len(targets)], report)
                report.enqueued = self._enqueue(enqueue)
        except BaseException as exc:
            report.status = "failed"
            report.error = (exc.user_message() if isinstance(exc, TopotuneError)
                            else f"{type(exc).__name__}: {exc}")[:2000]
            raise
        finally:
            heartbeat.stop()  # before the claim is cleared: no beat may write it back
            report.finished_at = time.time()
            first.set_user_attr(REPORTS_KEY, [*first.user_attrs.get(REPORTS_KEY, []), report.as_json()])
            first.set_user_attr(RUNNING_KEY, None)
        return report

    # -- one wave of measurements -------------------------------------------------------------------------
    def _request(self, target: _Target, repeat: int) -> TrialRequest:
        study = f"{self.result.name}/{target.phase}"
        run = f"reverify-{target.point.trial}-{repeat}-{uuid.uuid4().hex[:6]}"
        return TrialRequest(
            trial_id=f"{study}#{run}", model_path=self.meta.model_path, gpu=self.gpu.name,
            deployment=target.point.deployment, workload=self.space.phase_workload(target.phase),  # type: ignore[arg-type]
            artifacts_dir=str(self.artifacts_dir / study.replace("/", "_") / run),
            timeout_s=self.options.trial_timeout_s, min_accuracy=self.space.constraints.min_accuracy,
            seed=self.meta.seed * 1_000_003 + target.point.stored_as, repeat=repeat,
            vllm_version=self.space.cluster.vllm_version)

    def _measure(self, targets: list[_Target], report: ReverifyReport) -> list[ReverifyRow]:
        if not targets:
            return []
        plan = [(t, [self._request(t, k) for k in range(1, self.options.repeats + 1)]) for t in targets]
        results = _run_all(self.executor, [r for _, reqs in plan for r in reqs])
        rows = []
        for target, reqs in plan:
            runs = [(req, results[req.trial_id]) for req in reqs]
            tagged = next((res for _, res in runs if res.vllm_version), None)
            if tagged is not None and report.vllm_version == UNKNOWN_VERSION:
                report.vllm_version = tagged.vllm_version or UNKNOWN_VERSION
                report.model_revision = tagged.model_revision or UNKNOWN_VERSION
                report.to_version = VersionTag(report.vllm_version, report.model_revision).label
            row = self._judge(target, runs)
            rows.append(row)
            self.on_row(row)
        return rows

    def _judge(self, target: _Target, runs: list[tuple[TrialRequest, TrialResult]]) -> ReverifyRow:
        p = target.point
        study = self.studies[target.phase]
        base = {"phase": target.phase, "trial": p.stored_as, "config": p.deployment.groups[0].topology.label(),
                "params": p.params, "concurrency": p.metrics.concurrency, "why": target.why,
                "from_version": VersionTag.of(p).label, "meets_sla_before": p.feasible, "front_before": p.values[0],
                "of_trial": p.trial, "level": p.level}
        ok = [(req, res, m) for req, res in runs if res.status.ok
              and (m := _at_level(res.points, p.metrics.concurrency)) is not None and m.total_tok_s_per_gpu > 0]
        if not ok:
            reason = runs[0][1].reason or runs[0][1].status.value
            row = ReverifyRow(**base, verdict=str(Verdict.NO_LONGER_STARTS), comparison=None,
                              detail=f"{len(runs)} of {len(runs)} runs failed: {reason}"[:500])
            return self._store_failure(study, target, runs[0][1], row)
        old = [v for v in _old_runs(study, p) if v > 0] or [ok[0][2].total_tok_s_per_gpu]  # nothing to compare
        samples = [m.total_tok_s_per_gpu for _, _, m in ok]
        comparison: Comparison = self.options.test.compare(old, samples)
        failed = len(runs) - len(ok)
        median = sorted(ok, key=lambda x: x[2].total_tok_s_per_gpu)[(len(ok) - 1) // 2]
        row = ReverifyRow(**base, verdict=str(comparison.verdict), comparison=comparison.as_json(),
                          detail=f"{failed} of {len(runs)} runs failed" if failed else "",
                          front_after=phase_values(target.phase, median[2])[0])
        return self._store_runs(study, target, median[1], row, samples)

    # -- storing -----------------------------------------------------------------------------------------
    def _distributions(self, study: optuna.Study, trial_number: int) -> dict[str, Any]:
        return dict(study.get_trials(deepcopy=False)[trial_number].distributions)

    def _add(self, study: optuna.Study, params: dict[str, Any], dists: dict[str, Any], values: list[float],
             attrs: TrialAttrs, detail: dict[str, float], marker: str) -> int:
        add_trial(study, params, dists, values, attrs, detail, reverify_run=marker)
        return max(t.number for t in study.get_trials(deepcopy=False) if t.user_attrs.get("reverify_run") == marker)

    def _store_failure(self, study: optuna.Study, target: _Target, result: TrialResult, row: ReverifyRow
                       ) -> ReverifyRow:
        detail = failure_constraints("failed")
        attrs = TrialAttrs(kind=TrialKind.REVERIFY, outcome=result.status, reason=row.detail, constraint_detail=detail,
                           topology=row.config, vllm_version=result.vllm_version, model_revision=result.model_revision,
                           reverify=_row_json(row))
        number = self._add(study, target.point.params, self._distributions(study, target.point.stored_as),
                           list(FAILED_VALUES), attrs, detail, uuid.uuid4().hex)
        return _replace(row, new_trial=number, meets_sla_after=False)

    def _store_runs(self, study: optuna.Study, target: _Target, result: TrialResult, row: ReverifyRow,
                    samples: list[float]) -> ReverifyRow:
        """The median run as one "reverify" trial: every level it measured, told the compared one (one insert:
        a process killed before it leaves the config's earlier measurement current)."""
        points = judged_points(result, self.space.constraints)
        compared = _at_level(tuple(m for m, _ in points), row.concurrency)
        main = next(i for i, (m, _) in enumerate(points) if m is compared)
        m, cons = points[main]
        row = _replace(row, meets_sla_after=all(v <= 0 for v in cons.values()))
        attrs = measured_attrs(target.phase, points, main, result, target.point.deployment, kind=TrialKind.REVERIFY,
                               topology=row.config, reverify={**_row_json(row), "samples_tok_s": samples})
        number = self._add(study, target.point.params, self._distributions(study, target.point.stored_as),
                           list(phase_values(target.phase, m)), attrs, cons, uuid.uuid4().hex)
        return _replace(row, new_trial=number)

    # -- re-opening the search ---------------------------------------------------------------------------
    def _neighbours(self, changed: list[ReverifyRow], done: set[tuple[str, tuple]]
                    ) -> tuple[list[_Target], list[tuple[str, dict[str, Any], int]]]:
        """(measured neighbours to re-measure, best first; unmeasured neighbours to enqueue with their origin)."""
        again: list[_Target] = []
        enqueue: list[tuple[str, dict[str, Any], int]] = []
        seen = set(done)
        for row in changed:
            phase = row.phase
            current = {config_key(p.params): p for p in self.result.phases[phase].points}
            fresh = 0
            for params in self._adjacent(phase, row.params):
                key = config_key(params)
                if (phase, key) in seen:
                    continue
                seen.add((phase, key))
                measured = [p for p in self.result.phases[phase].points if config_key(p.params) == key]
                if measured:
                    best = max(measured, key=lambda p: (p.feasible, p.values[0]))
                    again.append(_Target(phase, best, f"neighbour of trial {row.trial}"))
                elif fresh < MAX_ENQUEUED_PER_CONFIG and key not in current:
                    enqueue.append((phase, params, row.new_trial if row.new_trial is not None else row.trial))
                    fresh += 1
        again.sort(key=lambda t: -t.point.values[0])
        return again, enqueue

    def _adjacent(self, phase: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Configs one knob one step away in its list of choices that are valid and fit in memory."""
        choices = {k: v for k, v in self.space.param_choices(phase).items() if k in params}  # type: ignore[arg-type]
        out = []
        for name, options in choices.items():
            if params[name] not in options:
                continue
            i = options.index(params[name])
            for j in (i - 1, i + 1):
                if not 0 <= j < len(options):
                    continue
                candidate = {**params, name: options[j]}
                if ep_on_one_gpu(candidate):
                    continue
                try:
                    topo = self.space.topology(phase, candidate)  # type: ignore[arg-type]
                    topo.check(self.model, cluster_gpus=self.space.cluster.num_gpus)
                except ConfigError:
                    continue
                workload = self.space.phase_workload(phase)  # type: ignore[arg-type]
                if compute_memory(self.model, self.gpu, topo, MemoryInputs.for_workload(workload)).fits:
                    out.append(candidate)
        return out

    def _enqueue(self, enqueue: list[tuple[str, dict[str, Any], int]]) -> list[dict[str, Any]]:
        out = []
        for phase, params, origin in enqueue:
            self.studies[phase].enqueue_trial(params, user_attrs=TrialAttrs(reopened_from=origin).user_attrs())
            out.append({"phase": phase, "params": params, "reopened_from": origin})
        return out


def _row_json(row: ReverifyRow) -> dict[str, Any]:
    return json.loads(json.dumps(asdict(row), default=str))


def _replace(row: ReverifyRow, **changes: Any) -> ReverifyRow:
    return ReverifyRow(**{**asdict(row), **changes})


def reverify_study(storage_url: str, name: str, executor: Executor, options: ReverifyOptions | None = None,
             artifacts_dir: Path = Path("artifacts"),
             on_row: Callable[[ReverifyRow], None] = lambda _row: None) -> ReverifyReport:
    """Re-measure the front of campaign `name` through `executor` and store the verdicts (see the module doc)."""
    return Reverifier(storage_url, name, executor, options or ReverifyOptions(), artifacts_dir, on_row).run()


def study_space(storage_url: str, name: str) -> tuple[SearchSpace, CampaignMeta]:
    """The space and metadata a re-verification needs to build its executor (the CLI and the service)."""
    _, space, meta = load_campaign(storage_url, name)
    return space, meta


def current_versions(storage_url: str, name: str) -> dict[str, VersionTag]:
    """Per phase, what the study's newest measurement ran on (the watcher compares them with the cluster's)."""
    from tuner.study._versions import current_tag

    tags = {phase: current_tag(read_trials(s)) for phase, s in open_campaign_studies(storage_url, name).items()}
    return {phase: tag for phase, tag in tags.items() if tag is not None}
