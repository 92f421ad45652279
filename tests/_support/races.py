"""Workers that start one piece of work at the same moment (one barrier), as processes or threads, and report
what went wrong: the race tests of the study storage and the cluster store."""

from __future__ import annotations

import multiprocessing
import queue
import threading
from collections.abc import Callable


def _worker(work: Callable[[str, str], None], url: str, name: str, start, failures) -> None:  # type: ignore[no-untyped-def]
    start.wait()  # every worker opens the database at the same moment
    try:
        work(url, name)
    except Exception as exc:  # reported to the test, which names it
        failures.put(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0]}")


def race(work: Callable[[str, str], None], url: str, names: list[str], *, processes: bool,
         timeout_s: float = 180.0) -> tuple[list[int | None], list[str]]:
    """`work(url, name)` for every name at once (spawned processes, or threads of this one); the processes' exit
    codes (none for threads) and every failure reported. `work` is a module-level function (a spawned process
    imports it)."""
    procs: list[multiprocessing.process.BaseProcess] = []
    workers: list[multiprocessing.process.BaseProcess | threading.Thread]
    if processes:
        ctx = multiprocessing.get_context("spawn")
        start, failures = ctx.Barrier(len(names)), ctx.Queue()
        procs = [ctx.Process(target=_worker, args=(work, url, name, start, failures)) for name in names]
        workers = list(procs)
    else:
        start, failures = threading.Barrier(len(names)), queue.Queue()
        workers = [threading.Thread(target=_worker, args=(work, url, name, start, failures)) for name in names]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=timeout_s)
    errors = []
    while not failures.empty():
        errors.append(failures.get())
    return [p.exitcode for p in procs], errors
