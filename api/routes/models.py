"""/v1/models: register a model by path (the webhook of a model store), list them."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status
from sqlalchemy import func, select

from api.deps import Authorized, RunnerDep, SessionDep, SettingsDep
from api.errors import FieldError
from api.models import ModelRecord, ModelStatus
from api.schemas import ModelCreate, ModelList, ModelPublic
from api.service import ConfigNotReady, register_model

router = APIRouter(prefix="/v1/models", tags=["models"])


def to_public(r: ModelRecord) -> ModelPublic:
    return ModelPublic(id=r.id, path=r.path, name=r.name, source=r.source, status=r.status, reason=r.reason,
                       study_id=r.study_id, created_at=r.created_at)


@router.post("", status_code=status.HTTP_201_CREATED, dependencies=[Authorized],
             responses={200: {"model": ModelPublic, "description": "already registered: no new study"}})
def create_model(body: ModelCreate, session: SessionDep, settings: SettingsDep, runner: RunnerDep,
                 response: Response) -> ModelPublic:
    """Register a model folder; when it fits the configured cluster, a study starts on the default space."""
    try:
        record, created = register_model(session, settings, body.path, source="api", auto_tune=body.auto_tune,
                                          loc=("body", "path"))
    except ConfigNotReady as exc:
        raise FieldError(("body", "path"), str(exc)) from exc
    if not created:
        response.status_code = status.HTTP_200_OK
    elif record.status is ModelStatus.TUNING and record.study_id is not None:
        runner.submit(record.study_id)
    return to_public(record)


@router.get("")
def list_models(session: SessionDep, offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
                limit: Annotated[int, Query(ge=1, le=500)] = 100) -> ModelList:
    total = session.scalar(select(func.count()).select_from(ModelRecord)) or 0
    rows = session.scalars(select(ModelRecord).order_by(ModelRecord.id.desc()).offset(offset).limit(limit)).all()
    return ModelList(items=[to_public(r) for r in rows], total=total)
