"""Alembic environment: the engine comes from api.db (never from an ini file or the environment)."""

from __future__ import annotations

from alembic import context

from api.models import Base
from tuner.cluster import cluster_metadata

config = context.config
engine = config.attributes["engine"]
version_table = config.get_main_option("version_table")


def _include(obj, name, type_, reflected, compare_to) -> bool:  # type: ignore[no-untyped-def]
    # Optuna's tables share the database: autogenerate must only ever see ours.
    return type_ != "table" or str(name).startswith("topotune_")


with engine.connect() as connection:
    context.configure(connection=connection, target_metadata=[Base.metadata, cluster_metadata()],
                      version_table=version_table, include_object=_include,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()
    connection.commit()
