"""Fixtures of the service tests: settings on SQLite or PostgreSQL, an app factory, helpers to poll studies."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from api_helpers import PG_DSN, api_settings, reference_model_store
from fastapi.testclient import TestClient

from api.config import ApiSettings
from api.main import create_app


@pytest.fixture
def model_store(tmp_path: Path) -> Path:
    """A model store holding a copy of the reference model (clients name models relative to it)."""
    return reference_model_store(tmp_path)


def _postgres_url() -> Iterator[str]:
    try:
        import psycopg

        conn = psycopg.connect(PG_DSN, autocommit=True)
    except Exception as exc:
        pytest.skip(f"PostgreSQL at 127.0.0.1:5432 (db test) unreachable: {exc}")
    schema = f"topotune_test_{uuid.uuid4().hex[:10]}"  # a fresh schema per test: reruns never collide
    with conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"postgresql+psycopg://root@127.0.0.1:5432/test?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'topotune.db'}"
    else:
        yield from _postgres_url()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'topotune.db'}"


@pytest.fixture
def make_settings(tmp_path: Path, model_store: Path) -> Callable[..., ApiSettings]:
    def make(database_url: str, **overrides: Any) -> ApiSettings:
        return api_settings(tmp_path, database_url, **{"models_dir": model_store, **overrides})

    return make


@pytest.fixture
def client_for() -> Iterator[Callable[[ApiSettings], TestClient]]:
    """Started apps (lifespan run); each is stopped at the end of the test unless the test closed it."""
    clients: list[TestClient] = []

    def start(settings: ApiSettings) -> TestClient:
        client = TestClient(create_app(settings))
        client.__enter__()
        clients.append(client)
        return client

    yield start
    for c in clients:
        with contextlib.suppress(RuntimeError):  # already closed by the test
            c.__exit__(None, None, None)
