"""Dependencies as types, so route signatures stay short (SessionDep, SettingsDep, ...)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated, TypeVar

from fastapi import Depends, Path, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from api.config import ApiSettings
from api.errors import FieldError, NotFound
from api.metrics import ServiceMetrics
from api.models import StudyRecord
from api.runner import StudyRunner
from api.views import ResultCache

RecordT = TypeVar("RecordT")
_bearer = HTTPBearer(auto_error=False, description="TOPOTUNE_API_TOKEN")


def get_settings(request: Request) -> ApiSettings:
    return request.app.state.settings


def get_session(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        yield session


def get_runner(request: Request) -> StudyRunner:
    return request.app.state.runner


def get_cache(request: Request) -> ResultCache:
    return request.app.state.cache


def get_metrics(request: Request) -> ServiceMetrics:
    return request.app.state.metrics


def require_token(request: Request,
                  credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)]) -> None:
    """Documents the scheme in OpenAPI; the check itself is AuthMiddleware (it runs before body parsing and also
    accepts a signed-in browser's session cookie with its CSRF token)."""
    auth = getattr(request.state, "auth", None)
    if auth is None or not auth.can_mutate:
        raise FieldError(("header", "authorization"), "missing or wrong bearer token", status_code=401,
                         kind="unauthorized")


SettingsDep = Annotated[ApiSettings, Depends(get_settings)]
SessionDep = Annotated[Session, Depends(get_session)]
RunnerDep = Annotated[StudyRunner, Depends(get_runner)]
CacheDep = Annotated[ResultCache, Depends(get_cache)]
MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]
Authorized = Depends(require_token)


# A stored row's id in a path (an integer column: larger ids are refused as invalid, not looked up).
RowId = Annotated[int, Path(ge=1, le=2**31 - 1)]


def stored(session: Session, model: type[RecordT], row_id: int, what: str) -> RecordT:
    """The row of `model` with this id, or 404 naming `what`."""
    record = session.get(model, row_id)
    if record is None:
        raise NotFound(what, row_id)
    return record


def get_study(study_id: RowId, session: SessionDep) -> StudyRecord:
    return stored(session, StudyRecord, study_id, "study")


StudyDep = Annotated[StudyRecord, Depends(get_study)]
