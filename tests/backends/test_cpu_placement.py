"""tuner.backends.vllm._cpu_placement on real process trees: vLLM's front end off its CPU worker's cores, and the
client's process group below the server's priority."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from tuner.backends.vllm._cpu_placement import CLIENT_NICE, is_worker, lower_priority, pin_front_end, process_tree

CORES = set(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores")

# a child: a worker (named as vLLM names it, bound to the cores in argv[2]) or another process, each with a thread
# (a worker given two lists: its main thread on the first cores, its second thread on the others)
_CHILD = ("import os, sys, threading, time\n"
          "lists = [{int(c) for c in cpus.split(',')} for cpus in sys.argv[2].split('/')]\n"
          "if sys.argv[1] == 'worker':\n"
          "    open('/proc/self/comm', 'w').write('VLLM::Worker_TP0')\n"
          "    os.sched_setaffinity(0, lists[-1])\n"
          "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
          "if sys.argv[1] == 'worker':\n"
          "    os.sched_setaffinity(0, lists[0])\n"
          "print('ready', flush=True)\n"
          "time.sleep(60)\n")


def _server(*worker_cpus: set[int]) -> str:
    """A parent (the API server) starting an engine core and a worker, then a thread of its own."""
    cpus = "/".join(",".join(map(str, sorted(c))) for c in worker_cpus)
    return ("import subprocess, sys, threading, time\n"
            f"kids = [subprocess.Popen([sys.executable, '-c', {_CHILD!r}, role, {cpus!r}], stdout=subprocess.PIPE,"
            " text=True)\n"
            "        for role in ('worker', 'engine')]\n"
            "[k.stdout.readline() for k in kids]\n"
            "threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
            "print('ready', flush=True)\n"
            "time.sleep(60)\n")


@pytest.fixture
def start_server() -> Iterator:
    started: list[subprocess.Popen] = []

    def start(*worker_cpus: set[int]) -> subprocess.Popen:
        server = subprocess.Popen([sys.executable, "-c", _server(*worker_cpus)], stdout=subprocess.PIPE, text=True)
        started.append(server)
        assert server.stdout.readline().strip() == "ready"  # after both children and every thread started
        return server

    yield start
    for server in started:
        for pid in process_tree(server.pid)[::-1]:
            os.kill(pid, 9)
        server.wait()


def _affinities(pid: int) -> dict[int, set[int]]:
    return {int(t): os.sched_getaffinity(int(t)) for t in os.listdir(f"/proc/{pid}/task")}


@needs_two_cores
def test_front_end_is_pinned_off_the_workers_cores(start_server) -> None:
    """Every process of the server but vLLM's CPU worker moves, threads included, to the cores the worker leaves
    free; the worker keeps its binding."""
    worker_core = min(CORES)
    server = start_server({worker_core})
    tree = process_tree(server.pid)
    assert len(tree) == 3 and sum(is_worker(pid) for pid in tree) == 1
    others = CORES - {worker_core}
    assert pin_front_end(server.pid) == others
    for pid in tree:
        for tid, cpus in _affinities(pid).items():
            assert cpus == ({worker_core} if is_worker(pid) else others), (pid, tid)


@needs_two_cores
def test_two_servers_front_ends_avoid_both_workers(start_server) -> None:
    """Servers on one host are pinned together: no front end lands on another server's worker. Where the workers
    hold every core, nothing moves (None)."""
    cores = sorted(CORES)
    first, second = start_server({cores[0]}), start_server({cores[-1]})
    assert pin_front_end(first.pid, second.pid) is None  # the two workers hold both ends: on 2 cores, every core
    for pid in process_tree(first.pid) + process_tree(second.pid):
        if not is_worker(pid):
            assert all(cpus == CORES for cpus in _affinities(pid).values()), pid
    if len(cores) > 2:
        free = pin_front_end(first.pid, second.pid)
        assert free == CORES - {cores[0], cores[-1]}


@needs_two_cores
def test_a_worker_thread_on_another_core_keeps_that_core_from_the_front_end(start_server) -> None:
    """A worker's cores are all its threads': a worker whose main thread runs on another core than its second
    thread (as a PD pair's prefill worker did on 2 cores) leaves the front end only the cores neither is on."""
    cores = sorted(CORES)
    server = start_server({cores[0]}, {cores[-1]})
    worker = next(pid for pid in process_tree(server.pid) if is_worker(pid))
    assert set(map(frozenset, _affinities(worker).values())) == {frozenset({cores[0]}), frozenset({cores[-1]})}
    assert pin_front_end(server.pid) == (CORES - {cores[0], cores[-1]} or None)


def test_no_worker_no_pinning() -> None:
    """A process tree without a vLLM worker (not a CPU server, or one not started yet) is left alone."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert pin_front_end(proc.pid) is None
        assert os.sched_getaffinity(proc.pid) == CORES
    finally:
        proc.kill()
        proc.wait()


def test_client_group_runs_below_the_server() -> None:
    """lower_priority renices the client's whole process group, a child it started before too."""
    code = ("import subprocess, sys, time\n"
            "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print(kid.pid, flush=True)\n"
            "time.sleep(60)\n")
    client = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        kid = int(client.stdout.readline())
        lower_priority(client.pid)
        assert os.getpriority(os.PRIO_PROCESS, client.pid) == CLIENT_NICE
        assert os.getpriority(os.PRIO_PROCESS, kid) == CLIENT_NICE
    finally:
        os.killpg(client.pid, 9)
        client.wait()
