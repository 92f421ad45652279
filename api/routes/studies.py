"""/v1/studies: start, list, inspect, cancel, trials, the fronts, export. Thin: parse, call, shape."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from fastapi.responses import PlainTextResponse
from sqlalchemy import func, select

from api.deps import Authorized, CacheDep, RunnerDep, SessionDep, SettingsDep, StudyDep
from api.errors import FieldError
from api.models import EventRecord, StudyRecord, StudyStatus
from api.schemas import (
    CancelResult,
    EventPublic,
    ExportFormat,
    Links,
    ParetoPublic,
    PhaseName,
    ReverifyAccepted,
    ReverifyCreate,
    ReverifyReports,
    StudyCreate,
    StudyDetail,
    StudyList,
    StudyPublic,
    TrialPage,
)
from api.service import STUDY_FIELDS
from api.views import exportable, pareto, phase_progress, trial_public
from tuner.errors import ConfigError, TopotuneError
from tuner.export import campaign_operating_point
from tuner.export import export_point as render_point
from tuner.space import SearchSpace
from tuner.study import ReverifyState, reverify_state, stored_reports

router = APIRouter(prefix="/v1/studies", tags=["studies"])


def to_public(r: StudyRecord) -> StudyPublic:
    return StudyPublic(
        id=r.id, campaign=r.campaign, status=r.status, model_name=r.model_name, model_path=r.model_path,
        space_name=r.space_name, backend=r.backend, trials_per_phase=r.trials_per_phase, sampler=r.sampler,
        seed=r.seed, error=r.error, resumes=r.resumes, created_at=r.created_at, started_at=r.started_at,
        finished_at=r.finished_at,
        links=Links(self_url=f"/v1/studies/{r.id}", ui_url=f"/ui/studies/{r.id}",
                    pareto_url=f"/v1/studies/{r.id}/pareto"))


@router.post("", status_code=status.HTTP_201_CREATED, dependencies=[Authorized])
def create_study(body: StudyCreate, session: SessionDep, settings: SettingsDep, runner: RunnerDep,
                 response: Response) -> StudyPublic:
    """Queue a study and return its id at once; the background runner runs it."""
    from api.service import create_study as create

    record = create(session, settings, body)
    runner.submit(record.id)
    response.headers["Location"] = f"/v1/studies/{record.id}"
    return to_public(record)


@router.get("")
def list_studies(session: SessionDep, status_filter: Annotated[StudyStatus | None, Query(alias="status")] = None,
                 offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
                 limit: Annotated[int, Query(ge=1, le=500)] = 100) -> StudyList:
    query = select(StudyRecord)
    if status_filter is not None:
        query = query.where(StudyRecord.status == status_filter)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(StudyRecord.id.desc()).offset(offset).limit(limit)).all()
    return StudyList(items=[to_public(r) for r in rows], total=total)


@router.get("/{study_id}")
def get_study(record: StudyDep, session: SessionDep, cache: CacheDep) -> StudyDetail:
    """Status, progress, counts by outcome and failures with reasons, per phase (never waits for a front: while
    another request refreshes the study, the last snapshot answers)."""
    snap = cache.snapshot(record, wait=False)
    phases = phase_progress(record, snap)
    launched = sum(p.launched for p in phases.values())
    budget = sum(p.budget for p in phases.values()) or 1
    events = session.scalars(select(EventRecord).where(EventRecord.study_id == record.id)
                             .order_by(EventRecord.id.desc()).limit(20)).all()
    done = record.status is StudyStatus.SUCCEEDED
    return StudyDetail(**to_public(record).model_dump(), launched=launched, budget=budget,
                       progress_fraction=1.0 if done else min(1.0, launched / budget), phases=phases,
                       constraints=dict(record.space.get("constraints", {})),
                       recent_events=[EventPublic(at=e.at, kind=e.kind, phase=e.phase, trial_number=e.trial_number,
                                                  message=e.message) for e in events])


@router.post("/{study_id}/cancel", dependencies=[Authorized])
def cancel_study(record: StudyDep, session: SessionDep, runner: RunnerDep) -> CancelResult:
    """Queued: cancelled now. Running: `cancelling` until the driver stops (in-flight trials end as cancelled)."""
    return CancelResult(id=record.id, status=runner.cancel(session, record))


@router.get("/{study_id}/trials")
def list_trials(record: StudyDep, cache: CacheDep, phase: PhaseName | None = None,
                offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
                limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> TrialPage:
    rows = cache.trials(record, phase)
    return TrialPage(items=[trial_public(r) for r in rows[offset:offset + limit]], total=len(rows), offset=offset,
                     limit=limit)


@router.get("/{study_id}/pareto", response_model=ParetoPublic)
def get_pareto(record: StudyDep, cache: CacheDep) -> Response:
    """Feasible front per phase and the composed PD front (served from a cache keyed by the trials' states)."""
    return Response(content=pareto(record, cache.snapshot(record)), media_type="application/json")


@router.get("/{study_id}/export", response_class=PlainTextResponse,
            responses={200: {"content": {"text/plain": {}}, "description": "a ready-to-run recipe"}})
def export_point(record: StudyDep, cache: CacheDep, point: Annotated[int, Query(ge=0, le=100_000)] = 0,
                 fmt: Annotated[ExportFormat, Query(alias="format")] = "vllm") -> PlainTextResponse:
    """A recipe for row `point` of the composed front (or of the phase fronts when there is no PD front)."""
    snap = cache.snapshot(record, full=True)
    deployments = exportable(snap.result) if snap.result else []
    if not snap.result or not (deployments or snap.result.exports_composed):
        raise FieldError(("query", "point"), "the study has no front yet")
    if deployments and not 0 <= point < len(deployments):
        raise FieldError(("query", "point"), f"no point {point}; the front has {len(deployments)} (see /pareto)")
    space = snap.space or SearchSpace.model_validate(record.space)
    try:  # a PD study without a composed front: the library's refusal (exports_composed), its fix once
        operating = campaign_operating_point(snap.result, space, model_path=record.model_path,
                                             model_name=record.model_name, point=point, study=record.campaign,
                                             backend=record.backend,
                                             instead=f"see each phase's front at /v1/studies/{record.id}/pareto")
    except ConfigError as exc:
        raise FieldError.of(("query", "point"), exc.renamed(STUDY_FIELDS)) from None
    text = render_point(operating, fmt)
    suffix = {"vllm": "sh"}.get(fmt, "yaml")
    return PlainTextResponse(text, headers={
        "Content-Disposition": f'attachment; filename="study{record.id}-point{point}.{suffix}"'})


@router.post("/{study_id}/reverify", status_code=status.HTTP_202_ACCEPTED, dependencies=[Authorized])
def reverify_study(record: StudyDep, body: ReverifyCreate, session: SessionDep, runner: RunnerDep,
                   response: Response) -> ReverifyAccepted:
    """Re-measure a finished study's front (the exported recipes' configs first) on what the cluster runs now;
    the verdicts (unchanged, faster, slower, no longer starts) arrive at GET .../reverify (docs/reverify.md)."""
    runner.reverify(session, record, body)
    url = f"/v1/studies/{record.id}/reverify"
    response.headers["Location"] = url
    return ReverifyAccepted(id=record.id, status_url=url)


@router.get("/{study_id}/reverify")
def reverify_reports(record: StudyDep, runner: RunnerDep, settings: SettingsDep, session: SessionDep
                     ) -> ReverifyReports:
    """Every re-verification of the study, oldest first, and whether one is running (in this service or any
    other process). One whose process died (kill -9, a crash) is found here, stored as failed with why, and
    told as the study's event; the study can then be re-verified."""
    try:
        state = reverify_state(settings.database_url, record.campaign)
        reports = [r.as_json() for r in stored_reports(settings.database_url, record.campaign)]
    except TopotuneError:  # the study has no trials yet (its Optuna studies do not exist)
        state, reports = ReverifyState(running=False, error=None), []
    if state.recovered is not None:
        session.add(EventRecord(study_id=record.id, kind="reverify_failed", message=state.recovered.error or ""))
        session.commit()
    return ReverifyReports(id=record.id, running=runner.reverifying(record.id) or state.running,
                           error=runner.reverify_errors.get(record.id) or state.error, reports=reports)
