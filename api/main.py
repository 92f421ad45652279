"""create_app(settings): the whole service, built on demand (nothing is created at import time).

Order of a start: migrations (the service's tables) -> Optuna's storage (its tables) -> the dashboard -> the
runner (resumes what was running) -> the model watcher. The Optuna dashboard is mounted at "/" last: its bundle
hard-codes /static, /api, /dashboard and /csv, so our own routes live under /v1, /ui, /healthz, /metrics, /docs.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import RedirectResponse
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Receive, Scope, Send

from api.config import ApiSettings
from api.dashboard_banner import DashboardBanner
from api.dashboard_guard import DashboardGuard
from api.db import make_engine, make_session_factory, upgrade
from api.deployment_watch import DeploymentWatcher
from api.errors import FieldError, field_error_handler, validation_error_handler
from api.limits import BodySizeLimitMiddleware
from api.metrics import ServiceMetrics
from api.models import StudyRecord
from api.routes import advice, clusters, health, metrics, models, pages, replay, signin, studies, watches
from api.runner import StudyRunner
from api.schemas import ReverifyCreate
from api.security import AuthMiddleware
from api.sessions import SessionSigner
from api.views import ResultCache
from api.watcher import ModelWatcher

log = logging.getLogger("topotune.api")


class LazyDashboard:
    """The optuna-dashboard WSGI app behind a2wsgi, built at start-up (it needs the storage, which needs the DB)."""

    def __init__(self) -> None:
        self.app: ASGIApp | None = None
        self.storage: Any = None  # optuna's RDBStorage once built

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.app is None:
            await send({"type": "http.response.start", "status": 503,
                        "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"the dashboard starts with the service"})
            return
        await self.app(scope, receive, send)

    def build(self, storage_url: str) -> None:
        from a2wsgi import WSGIMiddleware
        from optuna_dashboard import wsgi

        from tuner.study import open_storage

        self.storage = open_storage(storage_url)
        self.app = WSGIMiddleware(wsgi(self.storage), workers=4)  # type: ignore[arg-type]

    def study_exists(self, study_id: int) -> bool:
        if self.storage is None:
            return True  # not started: __call__ answers 503
        try:
            self.storage.get_study_name_from_id(study_id)
        except KeyError:
            return False
        return True


def _warm_cache(sessions: sessionmaker[Session], cache: ResultCache, recent: int = 16) -> None:
    """Build the fronts of active and recent studies in the background, so the first page after a restart is
    served from memory instead of paying the cold read."""
    with sessions() as s:
        records = s.scalars(select(StudyRecord).order_by(StudyRecord.id.desc()).limit(recent)).all()
        for r in records:
            s.expunge(r)
    cache.warm(sorted(records, key=lambda r: not r.status.active))


def reverify_trigger(sessions: sessionmaker[Session], runner: StudyRunner) -> Callable[[int, str, str | None], None]:
    """What the watcher calls on a new vLLM version or new weights: the same re-verification as the endpoint (a
    simulated study emulates the cluster's new version; a real one re-runs on what the hosts run)."""
    def trigger(study_id: int, why: str, cluster_version: str | None) -> None:
        with sessions() as session:
            record = session.get(StudyRecord, study_id)
            if record is None:
                return
            emulate = cluster_version if record.backend == "simulated" else None
            runner.reverify(session, record, ReverifyCreate(reason=why[:200], emulate_vllm=emulate))

    return trigger


def create_app(settings: ApiSettings) -> FastAPI:
    engine = make_engine(settings.database_url)
    sessions = make_session_factory(engine)
    service_metrics = ServiceMetrics(sessions, settings.database_url)
    runner = StudyRunner(settings, sessions, service_metrics)
    cache = ResultCache(settings.database_url, snapshot_dir=settings.data_dir / "snapshots")
    watcher = ModelWatcher(settings, sessions, runner.submit, reverify_trigger(sessions, runner)) \
        if settings.watch_models else None
    dashboard = LazyDashboard()
    deployment_watcher = DeploymentWatcher(sessions)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(upgrade, engine)
        await run_in_threadpool(dashboard.build, settings.database_url)
        runner.start()
        await run_in_threadpool(_warm_cache, sessions, cache)
        if watcher is not None:
            watcher.start()
        deployment_watcher.start()
        try:
            yield
        finally:
            deployment_watcher.stop()
            if watcher is not None:
                watcher.stop()
            await run_in_threadpool(runner.shutdown)
            engine.dispose()

    app = FastAPI(title="topotune", version="0.1.0", lifespan=lifespan,
                  description="Find the best way to serve a large model with vLLM on a GPU cluster: studies, "
                              "fronts and recipes over REST. Mutating endpoints need `Authorization: Bearer`.")
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessions = sessions
    app.state.metrics = service_metrics
    app.state.runner = runner
    app.state.cache = cache
    app.state.watcher = watcher
    app.state.deployment_watcher = deployment_watcher
    app.add_exception_handler(FieldError, field_error_handler)
    app.add_exception_handler(RequestValidationError, validation_error_handler)
    app.add_middleware(BodySizeLimitMiddleware)
    token = settings.token()
    signer = SessionSigner(token, settings.session_hours * 3600) if token else None
    app.state.signer = signer
    app.add_middleware(AuthMiddleware, token=token, read_auth=settings.read_auth, signer=signer)
    for module in (health, metrics, studies, advice, replay, models, clusters, watches, pages, signin):
        app.include_router(module.router)

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/ui")

    # last: everything not matched above is the Optuna dashboard, read-only (api/dashboard_guard.py)
    app.mount("/", DashboardBanner(DashboardGuard(dashboard, dashboard.study_exists)))
    return app
