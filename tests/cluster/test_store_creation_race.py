"""Creators that open the cluster tables of one fresh database at once (studies started together, a CLI beside
the service) all get every table: the loser of the creation race used to take "already exists" on the first
table as done, skip the second and fail reading it ("no such table: topotune_cluster_failures")."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from _support.races import race

from tuner.cluster import ClusterKey, ClusterStore, StoredFailure, cluster_metadata
from tuner.topology import Topology
from tuner.trial_status import TrialStatus

_CREATORS = 6
_PG = os.environ.get("TOPOTUNE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
_KEY = ClusterKey("race", "H100", "nvlink", "0.1", "default")


@pytest.fixture(params=["sqlite", "postgresql"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh SQLite file, or a fresh PostgreSQL schema (the default prefix, so the real table names race)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh.db'}"
        return
    psycopg = pytest.importorskip("psycopg")
    try:
        admin = psycopg.connect(_PG, autocommit=True, connect_timeout=5)
    except psycopg.OperationalError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL at {_PG} unreachable: {exc}")
    schema = f"tt_race_{uuid.uuid4().hex[:10]}"
    admin.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield _PG.replace("postgresql://", "postgresql+psycopg://") + f"?options=-csearch_path%3D{schema}"
    finally:
        admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        admin.close()


def _create_and_use(url: str, name: str) -> None:
    store = ClusterStore(url)
    store.record_failure(_KEY, StoredFailure(model_name=name, topology=Topology(tp=1), status=TrialStatus.CRASHED,
                                             reason="race", study=name))
    store.read_runs(_KEY)
    store.read_failures(_KEY)


def _assert_complete(url: str, names: set[str], errors: list[str]) -> None:
    assert not errors, errors
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        tables = set(inspector.get_table_names())
        meta = cluster_metadata()
        assert set(meta.tables) <= tables
        for table in meta.sorted_tables:
            assert {ix.name for ix in table.indexes} <= {ix["name"] for ix in inspector.get_indexes(table.name)}
    finally:
        engine.dispose()
    assert {f.study for f in ClusterStore(url).read_failures(_KEY)} == names  # every creator wrote its row


def test_processes_creating_the_cluster_tables_at_once_all_succeed(fresh_url: str) -> None:
    names = [f"proc-{i}" for i in range(_CREATORS)]
    codes, errors = race(_create_and_use, fresh_url, names, processes=True)
    assert codes == [0] * _CREATORS, errors
    _assert_complete(fresh_url, set(names), errors)


def test_threads_creating_the_cluster_tables_at_once_all_succeed(fresh_url: str) -> None:
    names = [f"thread-{i}" for i in range(_CREATORS)]
    _, errors = race(_create_and_use, fresh_url, names, processes=False)
    _assert_complete(fresh_url, set(names), errors)
