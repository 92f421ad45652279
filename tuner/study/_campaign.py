"""A campaign: the phase studies of one (model, hardware, workload), then the PD front composed from them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from tuner.backends import TrialStatus
from tuner.deployment import Deployment, at_decode_depths
from tuner.errors import ConfigError, TopotuneError
from tuner.executors import Executor
from tuner.frontier import (
    ComposedPoint,
    Constraints,
    combined_front,
    compose_disaggregated,
    hypervolume_2d,
    pareto_front,
)
from tuner.hardware import GpuSpec, get_gpu
from tuner.metrics import ServingMetrics
from tuner.models import ModelSpec, load_model
from tuner.operating_point import at_running_requests
from tuner.space import ALL_PHASES, PHASES, SearchSpace
from tuner.study._events import ProgressCallback
from tuner.study._naming import campaign_name, split_name
from tuner.study._options import TuneOptions
from tuner.study._records import StoredPoint, stored_points
from tuner.study._runner import PhaseRun
from tuner.study._stop import StopSignal
from tuner.study._storage import open_storage
from tuner.study._transfer import StudyTransfer, open_transfer
from tuner.study._trial_record import (
    RUNNING_STATUS,
    CampaignMeta,
    TrialFailure,
    TrialRecord,
    read_trials,
)
from tuner.study._versions import split_current
from tuner.study._warm_start import predicted_front_params
from tuner.topology import Topology


@dataclass
class PhaseResult:
    phase: str
    study_name: str
    counts: dict[str, int]  # trials by status (ok, infeasible, oom, crashed, ...)
    launched: int
    points: list[StoredPoint]  # every measured point, feasible or not
    front: list[StoredPoint]  # feasible Pareto front of the phase
    failures: list[TrialFailure]
    hypervolume_history: list[float] = field(default_factory=list)
    # points of configs measured again since (`topotune reverify`): history per version, never on the front
    superseded: list[StoredPoint] = field(default_factory=list)


@dataclass
class CampaignResult:
    name: str
    model: str
    gpu: str
    isl: int
    osl: int
    phases: dict[str, PhaseResult]
    composed: list[ComposedPoint]  # every xPyD deployment composed from measured curves
    composed_front: list[ComposedPoint]
    # why there is no composed front: a refusal with its one fix, kept whole (export refuses on it, adding nothing)
    composition_refusal: TopotuneError | None = None

    @property
    def composition_error(self) -> str | None:
        """The refusal as one line, its fix once (what `show`, its JSON and the service's pages print)."""
        return self.composition_refusal.user_message() if self.composition_refusal is not None else None

    @property
    def exports_composed(self) -> bool:
        """Whether `export` indexes the composed front (a PD campaign, composed or not) rather than a single phase's
        front: what `exportable_deployments` and `recipe_versions` both follow, point by point."""
        return bool(self.composed_front) or {"prefill", "decode"} <= set(self.phases)

    def exportable_deployments(self) -> list[Deployment]:
        """What `export` indexes: the composed front, else the phase fronts (single-phase campaigns), each at its
        operating point: the decode (or aggregated) side's --max-num-seqs at the running requests the point
        measured, not the trial's ladder maximum (tuner.operating_point.at_running_requests). A PD campaign
        without a composed front has none: a lone prefill or decode instance is not a deployment."""
        if self.exports_composed:
            return [at_running_requests(p.deployment, p.decode.running_requests) for p in self.composed_front]
        return [at_running_requests(p.deployment, p.metrics.running_requests)
                for pr in self.phases.values() for p in pr.front]

    def front_table(self) -> list[FrontRow]:
        return [FrontRow(point=i, deployment=p.name, gpus=p.num_gpus, total_tok_s_per_gpu=p.total_tok_s_per_gpu,
                         output_tok_s_per_gpu=p.output_tok_s_per_gpu, tok_s_per_user=p.tok_s_per_user,
                         ttft_ms=p.ttft_ms, itl_ms=p.itl_ms)
                for i, p in enumerate(self.composed_front)]


@dataclass(frozen=True)
class FrontRow:
    """One row of the composed front as `topotune show`, its JSON and the HTML pages list it."""

    point: int
    deployment: str
    gpus: int
    total_tok_s_per_gpu: float
    output_tok_s_per_gpu: float
    tok_s_per_user: float
    ttft_ms: float  # at the space's SLA percentile
    itl_ms: float

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def front_of(points: list[StoredPoint], phase: str) -> list[StoredPoint]:
    """Pareto front (maximising both phase objectives) of StoredPoints."""
    return pareto_front(points, x=lambda p: p.values[0], y=lambda p: p.values[1])


def _phase_result(study: optuna.Study, phase: str) -> PhaseResult:
    records = read_trials(study)
    counts: Counter[str] = Counter()
    failures = []
    for r in records:
        if r.is_level:  # an old study's load level, stored as its own Optuna trial
            continue
        counts[r.status] += 1
        if r.status not in (TrialStatus.OK, RUNNING_STATUS) and r.attrs.reason:
            failures.append(TrialFailure(trial_number=r.number, status=r.status, reason=r.attrs.reason,
                                         params=r.params))
    points, superseded = split_current(stored_points(study, phase, records), records)
    launches = [r for r in records if r.is_launch and r.state == TrialState.COMPLETE]
    return PhaseResult(phase=phase, study_name=study.study_name, counts=dict(counts), launched=len(launches),
                       points=points, front=front_of([p for p in points if p.feasible], phase), failures=failures,
                       hypervolume_history=_hypervolume_history(launches, points), superseded=superseded)


def _hypervolume_history(launches: list[TrialRecord], points: list[StoredPoint]) -> list[float]:
    """The feasible hypervolume after each launched trial, every load level of it included."""
    by_launch: dict[int, list[tuple[float, float]]] = {}
    for p in points:
        if p.feasible:
            by_launch.setdefault(p.trial, []).append(p.values)
    history: list[float] = []
    seen: list[tuple[float, float]] = []
    for r in launches:
        seen.extend(by_launch.get(r.number, []))
        history.append(hypervolume_2d(seen, (0.0, 0.0)))
    return history


def compose_front(phases: dict[str, PhaseResult], space: SearchSpace, model: ModelSpec
                  ) -> tuple[list[ComposedPoint], list[ComposedPoint], TopotuneError | None]:
    return compose_curves({phase: _per_topology_fronts(pr.points) for phase, pr in phases.items()}, space, model)


def compose_curves(curves: dict[str, list[tuple[Topology, ServingMetrics]]], space: SearchSpace, model: ModelSpec
                   ) -> tuple[list[ComposedPoint], list[ComposedPoint], TopotuneError | None]:
    """(every composed deployment, the composed front, why there is none) from each phase's measured curves
    (each topology's own front is enough: its dominated levels can never be on the composed front)."""
    if "prefill" not in curves or "decode" not in curves:
        if not set(PHASES) <= set(space.phases):
            return [], [], TopotuneError("the space has no prefill + decode pair of phases: no PD composition")
        missing = next(p for p in PHASES if p not in curves)
        return [], [], TopotuneError(f"no {missing} trials yet: the PD front is composed once both phases have "
                                     "measurements")
    # a deterministic order (by topology, then level): the same points give the same front, however they arrived
    prefill, decode = (sorted(curves[p], key=lambda tm: (str(tm[0]), tm[1].concurrency)) for p in ("prefill", "decode"))
    # each prefill point pairs with every decode depth, at that depth (a hybrid model's block size follows it)
    prefill = at_decode_depths(prefill, sorted({t.mtp for t, _ in decode}))
    c = space.constraints
    try:
        composed = compose_disaggregated(prefill, decode, Constraints(
            max_gpus=space.cluster.num_gpus, max_ttft_ms=c.max_ttft_ms, max_itl_ms=c.max_itl_ms,
            percentile=c.percentile, min_tok_s_per_user=c.min_tok_s_per_user, pairing=pd_pairing(space, model)))
    except TopotuneError as exc:  # constraints removed everything, or curves that cannot pair
        return [], [], exc
    return composed, combined_front(composed), None


def pd_pairing(space: SearchSpace, model: ModelSpec) -> Callable[[Topology, Topology], str | None]:
    """The one PD pairing check (tuner.backends.vllm._pairing) for this space's targeted vLLM and GPU: the
    composition pairs only what a launch plan would accept, so no front point is one vLLM refuses or corrupts.

    The space's cluster.vllm_version decides (the version table in tuner.backends.vllm); without one, the
    newest version the table was checked against, and the launch plan refuses a pair the hosts' vLLM cannot run.
    """
    from tuner.backends.vllm import pairing_predicate, plan_settings

    arch = get_gpu(space.cluster.gpu).architecture
    settings = plan_settings(model_path=model.name, gpu=space.cluster.gpu, device="cpu" if arch == "cpu" else "cuda",
                             vllm_version=space.cluster.vllm_version)
    return pairing_predicate(settings.rules(), settings.pairing(model))


def pairing_limits_tp(space: SearchSpace, model: ModelSpec) -> bool:
    """Whether the pairing check refuses some pair of different TPs the space can propose, at one of the decode
    side's MTP depths (the composition pairs each prefill point at the decode point's depth, and a hybrid model's
    block size follows TP and depth): the reference model pairs TP1 with TP2, never either with TP8, so a check of
    every pair refusing ("equal TP only") said no. The warm start then seeds the second phase with the first
    phase's front TPs: an equal TP, at any depth, pairs whenever the model pairs at all
    (tuner.backends.vllm._pairing)."""
    pairing = pd_pairing(space, model)
    tps = sorted({tp for phase in space.phases.values() for tp in phase.tp})
    depths = sorted({d for name, phase in space.phases.items() if name != "prefill" for d in phase.choices("mtp")})
    pairs = [(a, b) for a in tps for b in tps if a != b and max(a, b) % min(a, b) == 0]
    return any(pairing(Topology(tp=a, mtp=d), Topology(tp=b, mtp=d)) for a, b in pairs for d in depths or [0])


def _per_topology_fronts(points: list[StoredPoint]) -> list[tuple[Topology, ServingMetrics]]:
    """A topology's dominated levels can never be on the composed front: compose only each one's own front
    (10,000 stored trials compose in well under a second instead of tens of seconds)."""
    by_topology: dict[Topology, list[StoredPoint]] = {}
    for p in points:
        if p.feasible:
            by_topology.setdefault(p.deployment.groups[0].topology, []).append(p)
    out = []
    for topo, pts in by_topology.items():
        for p in pareto_front(pts, x=lambda q: q.values[0], y=lambda q: q.values[1]):
            out.append((topo, p.metrics))
    return out


def open_campaign_studies(storage_url: str, name: str) -> dict[str, optuna.Study]:
    storage = open_storage(storage_url)
    base, only = split_name(name)
    names = {s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    out = {}
    for phase in ALL_PHASES:
        full = f"{base}/{phase}"
        if full in names and (only is None or only == phase):
            out[phase] = optuna.load_study(study_name=full, storage=storage)
    if not out:
        raise ConfigError(f"no study named {name!r} in {storage_url}", field="STUDY",
                          fix="list them with `topotune studies` (and pass the same --storage)")
    return out


def load_campaign(storage_url: str, name: str) -> tuple[CampaignResult, SearchSpace, CampaignMeta]:
    studies = open_campaign_studies(storage_url, name)
    meta = CampaignMeta.read(next(iter(studies.values())).user_attrs)
    space = SearchSpace.model_validate(meta.space)
    model = load_model(meta.model_path)
    phases = {phase: _phase_result(study, phase) for phase, study in studies.items()}
    composed, front, refusal = compose_front(phases, space, model)
    base, _ = split_name(name)
    return (CampaignResult(name=base, model=meta.model, gpu=meta.gpu, isl=space.isl,
                           osl=space.osl, phases=phases, composed=composed, composed_front=front,
                           composition_refusal=refusal), space, meta)


@dataclass
class Campaign:
    """Everything `topotune tune` needs; `run()` runs each phase study then composes the PD front."""

    model_path: str
    space: SearchSpace
    backend_name: str
    executor: Executor
    storage_url: str
    options: TuneOptions
    artifacts_dir: Path
    on_event: ProgressCallback = lambda _e: None
    stop: StopSignal = field(default_factory=StopSignal)
    phases: tuple[str, ...] = ALL_PHASES  # those the space defines run, in this order
    name: str = ""  # prefix of the phase studies; default campaign_name(model, GPU, workload)
    cluster: str | None = None  # the calibration store's cluster name; default derived from the GPU and network
    learn_cluster: bool = True  # start each study from what the cluster taught earlier studies (tuner/cluster)
    retry_risks: bool = False  # launch configs that crashed on this cluster before (default: no sampler does)

    def __post_init__(self) -> None:
        local = Path(self.model_path).expanduser()
        if local.exists():  # stored absolute (#46): `show`, `export` and `reverify` work from any directory
            self.model_path = str(local.resolve())
        self.model: ModelSpec = load_model(self.model_path)
        self.gpu: GpuSpec = get_gpu(self.space.cluster.gpu)
        for phase in self.space.phases:  # fail before any trial when a phase cannot run at all
            self.space.expand(phase, self.model)
        if not self.name:
            w = self.space
            self.name = campaign_name(self.model.name, self.gpu.name, w.isl, w.osl)

    def phase_study_name(self, phase: str) -> str:
        return f"{self.name}/{phase}"

    def _warm_start(self, phase: str, pair_with_tps: frozenset[int],
                    transfer: StudyTransfer | None = None) -> list[dict[str, Any]]:
        return predicted_front_params(self.space, phase, self.model, self.gpu,  # type: ignore[arg-type]
                                      pair_with_tps=pair_with_tps,
                                      calibration=transfer.calibration if transfer is not None else None,
                                      skip=(lambda t: transfer.known_risk(t) is not None) if transfer else None)

    def run(self) -> CampaignResult:
        storage = open_storage(self.storage_url)
        pair_with: frozenset[int] = frozenset()
        for phase in self.phases:
            if phase not in self.space.phases or self.stop.is_set():
                continue
            # learnt per phase: the decode study already starts from what the prefill study just measured
            transfer = open_transfer(self.storage_url, self.gpu, self.model, str(self.model_path),
                                     vllm_version=self.space.cluster.vllm_version, cluster=self.cluster,
                                     learn=self.learn_cluster, retry_risks=self.retry_risks)
            run = PhaseRun(phase=phase, space=self.space, model=self.model, model_path=str(self.model_path),  # type: ignore[arg-type]
                           gpu=self.gpu, storage=storage, study_name=self.phase_study_name(phase),
                           backend_name=self.backend_name, executor=self.executor, options=self.options,
                           artifacts_dir=self.artifacts_dir, on_event=self.on_event, stop=self.stop,
                           warm_start_params=lambda p=phase, tps=pair_with, t=transfer: self._warm_start(p, tps, t),
                           pair_with_tps=pair_with, transfer=transfer)
            study = run.run()
            if pairing_limits_tp(self.space, self.model):
                pair_with = frozenset(p.deployment.groups[0].topology.tp
                                      for p in _phase_result(study, phase).front)
        result, _, _ = load_campaign(self.storage_url, self.name)
        return result
