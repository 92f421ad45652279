"""/v1/watches: deployment watches (create, read, change, delete, history, check now). Writes need sign-in (bearer
token, or a browser session with its CSRF token: api/security.py guards every mutating route)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import select
from sqlalchemy.orm import Session

from api.deployment_watch import DeploymentWatcher
from api.deps import Authorized, RowId, SessionDep, SettingsDep, stored
from api.errors import FieldError, NotFound
from api.models import WatchEventRecord, WatchRecord
from api.schemas import WatchCreate, WatchEventPublic, WatchList, WatchPublic, WatchUpdate
from api.service import resolve_model
from tuner.errors import TopotuneError
from tuner.hardware import get_gpu
from tuner.live import engine_from_flags
from tuner.workload import MetricsError, metrics_url

router = APIRouter(prefix="/v1/watches", tags=["watches"])


def get_watcher(request: Request) -> DeploymentWatcher:
    return request.app.state.deployment_watcher


WatcherDep = Annotated[DeploymentWatcher, Depends(get_watcher)]


def get_watch(watch_id: RowId, session: SessionDep) -> WatchRecord:
    return stored(session, WatchRecord, watch_id, "watch")


WatchDep = Annotated[WatchRecord, Depends(get_watch)]


def _check_urls(urls: list[str]) -> list[str]:
    out = []
    for i, url in enumerate(urls):
        try:
            out.append(metrics_url(url))
        except MetricsError as exc:
            raise FieldError.of(("body", "urls", i), exc) from exc
    return out


def _check_deployment(deployment: str, serve_flags: str) -> None:
    from tuner.deployment import parse_deployment

    try:
        engine, _ = engine_from_flags(serve_flags)
    except TopotuneError as exc:
        raise FieldError.of(("body", "serve_flags"), exc) from exc
    try:
        parse_deployment(deployment, **engine)
    except TopotuneError as exc:
        raise FieldError.of(("body", "deployment"), exc) from exc


def _latest_advice(session: Session, watch_id: int) -> WatchEventRecord | None:
    return session.scalar(select(WatchEventRecord).where(WatchEventRecord.watch_id == watch_id,
                                                         WatchEventRecord.kind == "advice")
                          .order_by(WatchEventRecord.id.desc()).limit(1))


def public(record: WatchRecord, session: Session) -> WatchPublic:
    latest = _latest_advice(session, record.id)
    state = record.state or {}
    return WatchPublic(
        id=record.id, name=record.name, urls=list(record.urls.get("urls", [])), deployment=record.deployment,
        serve_flags=record.serve_flags, model_path=record.model_path, hardware=record.hardware,
        max_gpus=record.max_gpus, max_ttft_ms=record.max_ttft_ms, max_itl_ms=record.max_itl_ms,
        percentile=record.percentile, period_s=record.period_s, thresholds=record.thresholds, enabled=record.enabled,
        baseline=state.get("baseline"), last_checked_at=record.last_checked_at, last_error=record.last_error,
        created_at=record.created_at,
        latest_advice=None if latest is None else WatchEventPublic.model_validate(latest, from_attributes=True))


@router.post("", status_code=201, dependencies=[Authorized])
def create_watch(body: WatchCreate, session: SessionDep, settings: SettingsDep) -> WatchPublic:
    """Watch a running deployment. It scrapes the URLs every `period_s` and never applies anything."""
    urls = _check_urls(body.urls)
    _check_deployment(body.deployment, body.serve_flags)
    model_path, _ = resolve_model(body.model_path, settings, ("body", "model_path"))
    try:
        get_gpu(body.hardware)
    except TopotuneError as exc:
        raise FieldError.of(("body", "hardware"), exc) from exc
    record = WatchRecord(name=body.name, urls={"urls": urls}, deployment=body.deployment,
                         serve_flags=body.serve_flags, model_path=str(model_path), hardware=body.hardware,
                         max_gpus=body.max_gpus, max_ttft_ms=body.max_ttft_ms, max_itl_ms=body.max_itl_ms,
                         percentile=body.percentile, period_s=body.period_s,
                         thresholds=body.thresholds.model_dump(), enabled=body.enabled, state={})
    session.add(record)
    session.commit()
    return public(record, session)


@router.get("")
def list_watches(session: SessionDep) -> WatchList:
    records = session.scalars(select(WatchRecord).order_by(WatchRecord.id)).all()
    return WatchList(watches=[public(r, session) for r in records])


@router.get("/{watch_id}")
def read_watch(record: WatchDep, session: SessionDep) -> WatchPublic:
    return public(record, session)


@router.patch("/{watch_id}", dependencies=[Authorized])
def update_watch(record: WatchDep, body: WatchUpdate, session: SessionDep, watcher: WatcherDep) -> WatchPublic:
    """Change a watch; a new deployment or new URLs start over (a new baseline from the next windows)."""
    given: dict[str, Any] = body.model_dump(exclude_unset=True)
    if "urls" in given:
        given["urls"] = {"urls": _check_urls(given["urls"] or [])}
    if {"deployment", "serve_flags"} & set(given):
        _check_deployment(given.get("deployment") or record.deployment,
                          given.get("serve_flags", record.serve_flags) or "")
    restart = bool({"urls", "deployment", "serve_flags"} & set(given))
    for name, value in given.items():
        if value is None and name not in ("max_ttft_ms", "max_itl_ms"):
            continue
        setattr(record, name, value)
    if restart:
        record.state = {}
        watcher.forget(record.id)
    session.commit()
    return public(record, session)


@router.delete("/{watch_id}", status_code=204, dependencies=[Authorized])
def delete_watch(record: WatchDep, session: SessionDep, watcher: WatcherDep) -> Response:
    session.delete(record)
    session.commit()
    watcher.forget(record.id)
    return Response(status_code=204)


@router.get("/{watch_id}/history")
def watch_history(record: WatchDep, session: SessionDep,
                  limit: Annotated[int, Query(ge=1, le=2000)] = 200) -> list[WatchEventPublic]:
    """The newest periods first: what each window's traffic was and what the watch decided."""
    rows = session.scalars(select(WatchEventRecord).where(WatchEventRecord.watch_id == record.id)
                           .order_by(WatchEventRecord.id.desc()).limit(limit)).all()
    return [WatchEventPublic.model_validate(r, from_attributes=True) for r in rows]


@router.post("/{watch_id}/check", dependencies=[Authorized])
async def check_watch(record: WatchDep, watcher: WatcherDep) -> WatchEventPublic:
    """Run one period now (the window since the last scrape), as the watch's own timer would."""
    event = await run_in_threadpool(watcher.check, record.id)
    if event is None:
        raise NotFound("watch", record.id)
    return WatchEventPublic.model_validate(event, from_attributes=True)
