"""Cluster-store fixtures: trials answered by a hidden truth (a cluster whose factors the tuner does not know)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tuner.cluster import ClusterStore

PG_URL = os.environ.get("TOPOTUNE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test").replace(
    "postgresql://", "postgresql+psycopg://")


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ClusterStore]:
    """A store with its own tables: SQLite in tmp_path, or PostgreSQL's `test` database under a unique prefix."""
    if request.param == "sqlite":
        yield ClusterStore(f"sqlite:///{tmp_path / 'studies.db'}")
        return
    pytest.importorskip("psycopg")
    try:
        found = ClusterStore(PG_URL, prefix=f"tt_{uuid.uuid4().hex[:10]}_")
    except Exception as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL at {PG_URL} unreachable: {exc}")
    try:
        yield found
    finally:
        found.drop()
