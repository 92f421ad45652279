"""Migrations are the schema: upgrade on an empty database creates exactly the ORM's tables."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from api.db import VERSION_TABLE, current_revision, make_engine, upgrade
from api.models import SCHEMA_VERSION, Base
from tuner.cluster import cluster_metadata


def test_upgrade_on_empty_database(database_url):
    engine = make_engine(database_url)
    assert current_revision(engine) is None
    upgrade(engine)
    upgrade(engine)  # idempotent
    tables = set(inspect(engine).get_table_names())
    assert {"topotune_studies", "topotune_models", "topotune_events", VERSION_TABLE} <= tables
    assert set(cluster_metadata().tables) <= tables  # the cluster tables: created before any study starts
    assert current_revision(engine) == SCHEMA_VERSION
    with engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True})
        diffs = [d for d in compare_metadata(ctx, [Base.metadata, cluster_metadata()])
                 if not (d[0] == "remove_table" and (d[1].name == VERSION_TABLE
                                                     or not d[1].name.startswith("topotune_")))]
    assert diffs == [], diffs  # the ORM models and the migrations agree
    engine.dispose()


def test_optuna_and_service_share_the_database(sqlite_url):
    from tuner.study import open_storage

    engine = make_engine(sqlite_url)
    upgrade(engine)
    open_storage(sqlite_url)  # Optuna adds its tables (and its own alembic_version) next to ours
    tables = set(inspect(engine).get_table_names())
    assert {"studies", "trials", "alembic_version", "topotune_studies"} <= tables
    assert current_revision(engine) == SCHEMA_VERSION
