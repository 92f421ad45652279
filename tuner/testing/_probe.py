"""ProbeBackend: a backend for executor tests and fault-injection benchmarks.

ProbeBackend records when each trial ran and on which hosts (so a test can compute the peak number of GPUs in use
across studies from inside the trials), optionally starts a child process in its own session (as vLLM does) so a
test can check that nothing a trial started survives a kill, and then delegates to a real backend or returns OK.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from tuner.backends import Backend, TrialRequest, TrialResult, TrialStatus
from tuner.executors import BackendSpec

EVENTS = "events.jsonl"
CHILDREN = "children.txt"


class ProbeBackend(Backend):
    name = "probe"

    def __init__(self, record_dir: str, *, delay_s: float = 0.0, spawn: bool = False,
                 inner: BackendSpec | None = None) -> None:
        self.record_dir = Path(record_dir)
        self.delay_s = delay_s
        self.spawn = spawn
        self.inner = inner

    def _record(self, **event: object) -> None:
        self.record_dir.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"t": time.time(), "pid": os.getpid(), **event}) + "\n"
        with (self.record_dir / EVENTS).open("a") as fh:  # one short O_APPEND write per event: atomic
            fh.write(line)

    def run(self, request: TrialRequest) -> TrialResult:
        started = time.monotonic()
        child = None
        if self.spawn:  # a long-lived child in its own session, like a vLLM server
            child = subprocess.Popen(["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.record_dir.mkdir(parents=True, exist_ok=True)
            with (self.record_dir / CHILDREN).open("a") as fh:
                fh.write(f"{child.pid}\n")
        self._record(event="start", trial=request.trial_id, gpus=request.deployment.num_gpus,
                     hosts=[h.model_dump() for h in request.hosts], child=child.pid if child else None)
        try:
            time.sleep(self.delay_s)
            if self.inner is not None:
                result = self.inner.build().run(request)
            else:
                result = TrialResult(status=TrialStatus.OK, duration_s=time.monotonic() - started)
        finally:
            self._record(event="end", trial=request.trial_id, gpus=request.deployment.num_gpus)
            if child is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        return result


def probe_spec(record_dir: str | Path, **options: object) -> BackendSpec:
    """A ProbeBackend recording into `record_dir` (options: delay_s, spawn, inner), as the spec executors take: a
    partial of the class, which pickles to Ray's workers and tells the executor the class's needs."""
    return BackendSpec("probe", factory=functools.partial(ProbeBackend, str(record_dir), **options))


def read_events(record_dir: str | Path) -> list[dict]:
    path = Path(record_dir) / EVENTS
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def peak_gpus(events: list[dict]) -> int:
    """The most GPUs in use at once, from start/end events (an end sorts before a start at the same instant).

    A start without an end (its worker was killed) counts until the trial's next start or the last event."""
    timeline: list[tuple[float, int, int]] = []
    open_starts: dict[str, dict] = {}
    last_t = max((e["t"] for e in events), default=0.0)
    for e in sorted(events, key=lambda e: e["t"]):
        if e["event"] == "start":
            if e["trial"] in open_starts:  # the previous attempt died without an end
                timeline.append((e["t"], 0, -open_starts[e["trial"]]["gpus"]))
            open_starts[e["trial"]] = e
            timeline.append((e["t"], 1, e["gpus"]))
        elif e["trial"] in open_starts:
            del open_starts[e["trial"]]
            timeline.append((e["t"], 0, -e["gpus"]))
    for e in open_starts.values():
        timeline.append((last_t, 0, -e["gpus"]))
    in_use = peak = 0
    for _, _, delta in sorted(timeline):
        in_use += delta
        peak = max(peak, in_use)
    return peak


def spawned_children(record_dir: str | Path) -> list[int]:
    path = Path(record_dir) / CHILDREN
    return [int(x) for x in path.read_text().split()] if path.exists() else []
