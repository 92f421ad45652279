"""Processes that open one fresh database at once all get a working storage (Optuna creates its schema on first
open; the loser of that race used to fail with a duplicate alembic_version row or an existing table)."""

from __future__ import annotations

import optuna
from _support.races import race

from tuner.study import open_storage

_PROCESSES = 6


def _open_and_create(url: str, name: str) -> None:
    optuna.create_study(study_name=name, storage=open_storage(url), load_if_exists=True)


def test_processes_opening_a_fresh_database_at_once_all_succeed(storage_url: str) -> None:
    codes, errors = race(_open_and_create, storage_url, [f"race-{i}" for i in range(_PROCESSES)], processes=True,
                         timeout_s=120)
    assert not errors, errors
    assert codes == [0] * _PROCESSES
    stored = {s.study_name for s in optuna.get_all_study_summaries(open_storage(storage_url))}
    assert stored == {f"race-{i}" for i in range(_PROCESSES)}
