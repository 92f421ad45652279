"""Where a vLLM CPU server's front end and its load generator run on the host: off the CPU worker's cores.

vLLM's CPU backend binds its worker's OpenMP threads to all cores but the ones it reserves for the "scheduler
proc" (vllm/utils/ompmultiprocessing.py: "at least reserve 1/local_world_size core for scheduler proc", with
"TODO: make scheduler proc sleep when idle"; VLLM_CPU_OMP_THREADS_BIND=auto), but leaves the API server and the
engine core (the scheduler) free to run on any core. On a small machine the kernel then puts them on the worker's
core for part of a run and every step waits behind them; and a load generator at the server's priority on the
remaining core takes that core from them. Measured on 2 cores (docs/workloads.md, "The cause, measured: where
vLLM's front end runs"; benchmarks/replay_cpu_validation.py `show-placement`): closed loops' steps up to ~2x
slower; at one closed-loop client vLLM's token gaps went p50 4.0 -> 3.2 ms, p90 9.4 -> 5.9 ms, and the closed loop
at eight carried 27.3 req/s against 21.8, once the front end was pinned and the client ran at CLIENT_NICE.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

_PROC = Path("/proc")
# the title vLLM gives its workers (v1/executor/multiproc_executor.py through utils/system_utils.py
# set_process_title: VLLM_PROCESS_NAME_PREFIX "VLLM" + "::Worker", a rank suffix after it)
WORKER_COMM = "VLLM::Worker"

#: The load generator's (AIPerf's) priority: below the server's. A closed loop's client works between the server's
#: steps (each answer's end starts the next request); at the server's own priority on the core the front end runs
#: on it took that core from it: with the front end pinned, at one client and eight, vLLM's token gaps p50 were 4.5
#: and 8.6 ms beside 3.2 and 4.5 ms with the client at nice 19 (benchmarks/replay_cpu_validation.py
#: `show-placement`). A load generator does not run on the server's cores in a real deployment; where it has its own
#: cores the priority changes nothing.
CLIENT_NICE = 19


def is_worker(pid: int) -> bool:
    """Is `pid` one of vLLM's CPU workers (the processes whose OpenMP threads vLLM binds to cores)?"""
    with contextlib.suppress(OSError):
        return (_PROC / str(pid) / "comm").read_text().startswith(WORKER_COMM)
    return False


def _children() -> dict[int, list[int]]:
    """Every process's children, read off /proc/<pid>/stat (its ppid, after the command name's ')')."""
    kids: dict[int, list[int]] = {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int((entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants, parents first (vLLM's API server starts the engine core, which starts the
    workers)."""
    kids = _children()

    def walk(p: int) -> Iterator[int]:
        yield p
        for k in kids.get(p, ()):
            yield from walk(k)

    return list(walk(pid))


def _threads(pid: int) -> list[int]:
    with contextlib.suppress(OSError):
        return [int(t) for t in os.listdir(_PROC / str(pid) / "task")]
    return []


def pin_front_end(*pids: int) -> frozenset[int] | None:
    """Bind every process of these servers' trees but their CPU workers (the API server, the engine core with the
    scheduler, their helpers; a router too), every thread of each, to the cores no worker thread is bound to; return
    those cores. None, touching nothing: no worker found (not a vLLM CPU server, or not started yet) or the workers
    hold every core the servers may use (then there is no other core to move to: a PD pair on 2 cores).

    The `pids` must be this host's processes that the caller started (their descendants are found here): one call
    for all the servers on a host, so that no front end lands on another server's worker. Call it once the servers
    are healthy (their workers bound); threads and processes started later inherit the binding."""
    trees = [process_tree(pid) for pid in pids]
    members = [p for tree in trees for p in tree]
    workers = [p for p in members if is_worker(p)]
    if not workers:
        return None
    worker_cpus: set[int] = set()
    allowed: set[int] = set()
    for pid in members:
        # a worker's cores are every core any of its threads is bound to: its main thread is not always on its
        # OpenMP cores (measured, a prefill worker of a PD pair on 2 cores: main thread on core 1, told core 0)
        for tid in _threads(pid) if pid in workers else (pid,):
            with contextlib.suppress(OSError):  # a process or thread that ended meanwhile
                (worker_cpus if pid in workers else allowed).update(os.sched_getaffinity(tid))
    free = frozenset(allowed - worker_cpus)
    if not free:
        return None
    for pid in members:
        if pid in workers:
            continue
        for tid in _threads(pid):
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                os.sched_setaffinity(tid, free)
    return free


def lower_priority(pgid: int, nice: int = CLIENT_NICE) -> None:
    """Run process group `pgid` (a client started in its own session, and whatever it starts) at `nice`: the whole
    group at once from the parent, no preexec_fn in a threaded runner. A group already gone: nothing to do."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PGRP, pgid, nice)
