"""Processes that open one fresh database at once all get a working storage (Optuna creates its schema on first
open; the loser of that race used to fail with a duplicate alembic_version row or an existing table)."""

from __future__ import annotations

import multiprocessing

import optuna

from tuner.study import open_storage

_PROCESSES = 6


def _open_and_create(url: str, name: str, start, failures) -> None:
    start.wait()  # every process opens the database at the same moment
    try:
        optuna.create_study(study_name=name, storage=open_storage(url), load_if_exists=True)
    except Exception as exc:  # reported to the test, which names it
        failures.put(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")


def test_processes_opening_a_fresh_database_at_once_all_succeed(storage_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    start, failures = ctx.Barrier(_PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_open_and_create, args=(storage_url, f"race-{i}", start, failures))
             for i in range(_PROCESSES)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    errors = []
    while not failures.empty():
        errors.append(failures.get())
    assert not errors, errors
    assert [p.exitcode for p in procs] == [0] * _PROCESSES
    stored = {s.study_name for s in optuna.get_all_study_summaries(open_storage(storage_url))}
    assert stored == {f"race-{i}" for i in range(_PROCESSES)}
