"""Storage fixtures: every storage test runs on SQLite and on the PostgreSQL server (a fresh database each)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_ADMIN_URL = os.environ.get("TOPOTUNE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _fresh_postgres() -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg")
    name = f"topotune_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        if os.environ.get("CI"):
            raise  # CI has the server: a missing one is a failure, not a skip
        pytest.skip(f"PostgreSQL at {PG_ADMIN_URL} unreachable: {exc}")
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        url = PG_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + f"/{name}"
        yield url
    finally:
        from tuner.study import close_storage

        close_storage(url)
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'studies.db'}"
    else:
        yield from _fresh_postgres()
