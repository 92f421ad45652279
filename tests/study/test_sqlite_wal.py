"""Every SQLite store topotune opens runs in WAL with synchronous=NORMAL (tuner/sqlite.py): Optuna's storage and
the cluster store, on the same file, whatever opened it first."""

from __future__ import annotations

from pathlib import Path

from tuner.cluster import ClusterStore
from tuner.study import close_storage, open_storage


def test_optuna_and_cluster_stores_on_sqlite_run_in_wal_with_normal_sync(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    try:
        for engine in (open_storage(url).engine, ClusterStore(url).engine):
            with engine.connect() as conn:
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
                assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL (FULL is 2)
    finally:
        close_storage(url)
