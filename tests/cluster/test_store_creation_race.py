"""Creators that open the cluster tables of one fresh database at once (studies started together, a CLI beside
the service) all get every table: the loser of the creation race used to take "already exists" on the first
table as done, skip the second and fail reading it ("no such table: topotune_cluster_failures")."""

from __future__ import annotations

import multiprocessing
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

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


def _create_and_use(url: str, name: str, start, failures) -> None:  # type: ignore[no-untyped-def]
    start.wait()  # every creator opens the fresh database at the same moment
    try:
        store = ClusterStore(url)
        store.record_failure(_KEY, StoredFailure(model_name=name, topology=Topology(tp=1), status=TrialStatus.CRASHED,
                                                 reason="race", study=name))
        store.read_runs(_KEY)
        store.read_failures(_KEY)
    except Exception as exc:  # reported to the test, which names it
        failures.put(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")


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
    ctx = multiprocessing.get_context("spawn")
    start, failures = ctx.Barrier(_CREATORS), ctx.Queue()
    procs = [ctx.Process(target=_create_and_use, args=(fresh_url, f"proc-{i}", start, failures))
             for i in range(_CREATORS)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=180)
    errors = []
    while not failures.empty():
        errors.append(failures.get())
    assert [p.exitcode for p in procs] == [0] * _CREATORS, errors
    _assert_complete(fresh_url, {f"proc-{i}" for i in range(_CREATORS)}, errors)


def test_threads_creating_the_cluster_tables_at_once_all_succeed(fresh_url: str) -> None:
    import queue

    start, failures = threading.Barrier(_CREATORS), queue.Queue()
    threads = [threading.Thread(target=_create_and_use, args=(fresh_url, f"thread-{i}", start, failures))
               for i in range(_CREATORS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    errors = []
    while not failures.empty():
        errors.append(failures.get())
    _assert_complete(fresh_url, {f"thread-{i}" for i in range(_CREATORS)}, errors)


def test_creation_that_fails_for_another_reason_is_a_clear_error() -> None:
    """Not a lost race (a database that does not exist): a ConfigError naming --storage, not a retry loop or a
    read of a missing table later."""
    pytest.importorskip("psycopg")
    from tuner.errors import ConfigError

    url = _PG.replace("postgresql://", "postgresql+psycopg://").rsplit("/", 1)[0] + "/no_such_db_topotune"
    with pytest.raises(ConfigError) as err:
        ClusterStore(url)
    assert err.value.field == "--storage" and "no_such_db_topotune" in str(err.value)


def test_a_lost_race_on_the_first_table_still_creates_the_second(fresh_url: str) -> None:
    """The race made deterministic: just before this creator's CREATE TABLE of the runs table, another creator
    makes it (so this one gets "already exists" although its check found nothing). The store must still create
    the failures table and verify both, not take the error as "the other one did everything"."""
    meta = cluster_metadata()
    runs = next(name for name in meta.tables if name.endswith("runs"))
    other = sa.create_engine(fresh_url)
    raced: list[str] = []

    def create_it_first(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if not raced and statement.lstrip().upper().startswith(f"CREATE TABLE {runs.upper()}"):
            raced.append(statement)
            with other.begin() as conn2:
                meta.tables[runs].create(conn2)

    sa.event.listen(sa.Engine, "before_cursor_execute", create_it_first)
    try:
        store = ClusterStore(fresh_url)
    finally:
        sa.event.remove(sa.Engine, "before_cursor_execute", create_it_first)
        other.dispose()
    assert raced, "the race was not staged"
    store.record_failure(_KEY, StoredFailure(model_name="m", topology=Topology(tp=1), status=TrialStatus.CRASHED,
                                             reason="race", study="s"))
    _assert_complete(fresh_url, {"s"}, [])
