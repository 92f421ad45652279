"""/healthz: the database answers, the schema is at head, the runner threads are alive."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import func, select

from api.db import current_revision
from api.models import SCHEMA_VERSION, StudyRecord, StudyStatus
from api.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
def healthz(request: Request) -> JSONResponse:
    state = request.app.state
    try:
        revision = current_revision(state.engine)
        with state.sessions() as s:
            active = s.scalar(select(func.count()).select_from(StudyRecord).where(StudyRecord.status.in_(
                [StudyStatus.QUEUED, StudyStatus.RUNNING, StudyStatus.CANCELLING]))) or 0
        database = "ok"
    except Exception as exc:  # report, never raise: this is what the compose healthcheck polls
        revision, active, database = None, 0, f"error: {type(exc).__name__}"
    alive = state.runner.threads_alive
    healthy = database == "ok" and revision == SCHEMA_VERSION and alive == state.settings.max_parallel_studies
    body = Health(status="ok" if healthy else "degraded", database=database, schema_revision=revision,
                  runner_threads_alive=alive, studies_active=active,
                  watcher=state.watcher.state if state.watcher else "off")
    return JSONResponse(body.model_dump(), status_code=200 if healthy else 503)
