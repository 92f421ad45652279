"""SQLite as every topotune store opens it: write-ahead log, synchronous=NORMAL.

Optuna commits each trial attribute on its own (931 commits for a 26-trial simulated study); in SQLite's default
rollback journal each commit waits for an fsync (12 ms each on the project's CI-like 2-core machine: 11.4 of that
study's 15.3 s). In WAL with synchronous=NORMAL a commit survives a crash of the process (kill -9); only a power
loss may undo the last ones. Readers do not block the writer either (the service's pages read while the runner
writes). The mode sticks to the database file; synchronous is per connection, hence the listener.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, event


def use_wal(engine: Engine) -> Engine:
    """Every connection `engine` opens from now on (pooled ones are dropped) in WAL, synchronous=NORMAL; engines
    on other databases are returned untouched."""
    if engine.dialect.name != "sqlite":
        return engine

    @event.listens_for(engine, "connect")
    def _wal(dbapi_conn: Any, _record: Any) -> None:
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    engine.dispose()  # connections opened before the listener (Optuna's schema check) come back with it
    return engine
