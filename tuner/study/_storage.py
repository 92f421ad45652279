"""Optuna storage from any SQLAlchemy URL, with errors that say what to fix."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import sqlalchemy.exc

from tuner.errors import ConfigError
from tuner.sqlite import use_wal

_LOCK = threading.Lock()
_STORAGES: dict[str, optuna.storages.RDBStorage] = {}


def open_storage(url: str) -> optuna.storages.RDBStorage:
    """One RDBStorage per URL per process (its engine pools connections)."""
    with _LOCK:
        if url in _STORAGES:
            return _STORAGES[url]
        engine_kwargs: dict = {}
        if url.startswith("sqlite"):
            path = url.split("///", 1)[-1]
            if path and path != ":memory:":
                try:
                    Path(path).parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise ConfigError(f"cannot create the folder of {path}: {exc.strerror}", field="--storage",
                                      fix="give a writable path, e.g. sqlite:////tmp/topotune.db") from exc
            engine_kwargs = {"connect_args": {"timeout": 60}}
        else:
            engine_kwargs = {"pool_pre_ping": True}
        try:
            storage = _create_schema_once(url, engine_kwargs)
        except ImportError as exc:
            raise ConfigError(f"no database driver for {url.split(':', 1)[0]} ({exc.name})", field="--storage",
                              fix="use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB") from exc
        except Exception as exc:  # sqlalchemy's OperationalError, ArgumentError, ...
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(f"cannot open storage {url!r}: {first_line}", field="--storage",
                              fix="check the URL and that the database server is reachable") from exc
        use_wal(storage.engine)
        _STORAGES[url] = storage
        return storage


@dataclass(frozen=True)
class TrialCensus:
    """Trials of every study in a storage, by Optuna state and by topotune outcome (for metrics scrapes)."""

    by_state: dict[str, int] = field(default_factory=dict)
    by_outcome: dict[str, int] = field(default_factory=dict)


def trial_census(url: str) -> TrialCensus:
    """Trials by state and outcome across the storage (empty before the first study created Optuna's tables)."""
    from tuner.study._optuna_compat import count_trials

    try:
        by_state, by_outcome = count_trials(open_storage(url))
    except Exception:
        return TrialCensus()
    return TrialCensus(by_state={str(getattr(s, "name", s)): n for s, n in by_state},
                       by_outcome={v.strip('"'): n for v, n in by_outcome})
def _create_schema_once(url: str, engine_kwargs: dict) -> optuna.storages.RDBStorage:
    """Optuna creates its tables on first open; two processes opening a fresh database at once (a driver and the
    service, or a resumed CLI) race on that and the loser sees a duplicate row or table. The winner's schema is
    then complete, so opening again succeeds: retry a few times instead of failing the loser."""
    attempts = 5
    for attempt in range(attempts):
        try:
            return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs)
        except sqlalchemy.exc.DBAPIError as exc:
            if attempt == attempts - 1 or not _lost_schema_race(exc):
                raise
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def _lost_schema_race(exc: sqlalchemy.exc.DBAPIError) -> bool:
    """A duplicate alembic_version row, or a table another process created first (SQLite and PostgreSQL)."""
    return isinstance(exc, sqlalchemy.exc.IntegrityError) or "already exists" in str(exc)


def close_storage(url: str) -> None:
    """Dispose of the storage opened for `url` (its pooled connections), e.g. before its database is dropped."""
    with _LOCK:
        storage = _STORAGES.pop(url, None)
    if storage is not None:
        storage.engine.dispose()
