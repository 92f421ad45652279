"""A backend for executor tests and fault-injection benchmarks (like optuna.testing: shipped, not user-facing).

ProbeBackend records when each trial ran and on which hosts (so a test can compute the peak number of GPUs in use
across studies from inside the trials), optionally starts a child process in its own session (as vLLM does) so a
test can check that nothing a trial started survives a kill, and then delegates to a real backend or returns OK.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from tuner.backends import Backend, TrialRequest, TrialResult, TrialStatus
from tuner.executors._host import BackendSpec

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


# -- fault injection (shared by tests/executors and benchmarks/fault_injection.py) -------------------------

@dataclass
class KillReport:
    kills: int = 0
    recovered: int = 0  # the killed trial was relaunched or finished within the grace period
    stuck: int = 0  # ... or not
    max_recovery_s: float = 0.0
    victims: list[str] = field(default_factory=list)


def kill_runners(executor, *, kills: int, interval_s: float, grace_s: float, stop: threading.Event | None = None
                 ) -> KillReport:
    """kill -9 the runner of a trial in flight, `kills` times, and time how long until the executor recovers it."""
    from tuner.executors._host import RUNNER_PID

    report = KillReport()
    rng = random.Random(0)
    while report.kills < kills and not (stop and stop.is_set()):
        time.sleep(interval_s)
        candidates = []
        for handle in executor.in_flight():
            folder = handle.request.artifacts_dir
            pid_file = Path(folder) / RUNNER_PID if folder else None
            if pid_file is not None and pid_file.exists():
                with contextlib.suppress(ValueError, OSError):
                    candidates.append((handle, int(pid_file.read_text())))
        if not candidates:
            continue
        handle, pid = rng.choice(candidates)
        attempts = handle.attempts
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed_at = time.monotonic()
        report.kills += 1
        report.victims.append(handle.request.trial_id)
        while time.monotonic() - killed_at < grace_s and handle.attempts == attempts and handle.result is None:
            time.sleep(0.05)
        if handle.attempts != attempts or handle.result is not None:
            report.recovered += 1
            report.max_recovery_s = max(report.max_recovery_s, time.monotonic() - killed_at)
        else:
            report.stuck += 1
    return report


def small_campaign(*, repo: Path, executor, storage_url: str, artifacts_dir: Path, trials: int,
                   num_gpus: int, gpus_per_host: int, seed: int = 0):
    """The reference model and space, decode phase only, on a cluster of num_gpus: a Campaign ready to run()."""
    from tuner.space import load_space
    from tuner.study import Campaign, TuneOptions

    space = load_space(repo / "search_spaces" / "gb300-nvl72-8k1k.yaml")
    space = space.model_copy(update={"cluster": space.cluster.model_copy(
        update={"num_gpus": num_gpus, "gpus_per_host": gpus_per_host})})
    options = TuneOptions(trials=trials, sampler="tpe", seed=seed, warm_start=False, heartbeat_s=1.0,
                          trial_timeout_s=120.0)
    return Campaign(model_path=str(repo / "examples" / "models" / "qwen3.8-2.4t-a95b-nvfp4"), space=space,
                    backend_name="simulated", executor=executor, storage_url=storage_url, options=options,
                    artifacts_dir=artifacts_dir, phases=("decode",))


def study_counts(storage_url: str, study_name: str) -> dict[str, int]:
    """Launched (sampled) trials by state, from the storage."""
    import optuna

    from tuner.study import open_storage

    study = optuna.load_study(study_name=study_name, storage=open_storage(storage_url))
    counts: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False):
        if t.user_attrs.get("kind") != "sampled":
            continue
        key = t.state.name.lower()
        if t.state.name == "FAIL":
            key = f"fail_{t.user_attrs.get('status', '')}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def _driver_main(argv: list[str] | None = None) -> int:
    """`python -m tuner.executors._testing REPO STORAGE ARTIFACTS RECORDS TRIALS DELAY`: one driver of a small
    campaign on RAY_ADDRESS (the driver-restart test kills this process mid-study and starts it again)."""
    import argparse
    import functools

    from tuner.executors._ray import RayExecutor
    from tuner.executors._session import ensure_ray

    p = argparse.ArgumentParser()
    for name in ("repo", "storage", "artifacts", "records"):
        p.add_argument(name)
    p.add_argument("trials", type=int)
    p.add_argument("delay_s", type=float)
    p.add_argument("--gpus", type=int, default=12)
    p.add_argument("--gpus-per-host", type=int, default=4)
    p.add_argument("--parallel", type=int, default=2)
    a = p.parse_args(argv)
    ensure_ray(address=os.environ["RAY_ADDRESS"], num_gpus=a.gpus)
    spec = BackendSpec("probe", factory=functools.partial(
        ProbeBackend, a.records, delay_s=a.delay_s, spawn=True, inner=BackendSpec("simulated")))
    executor = RayExecutor(spec, gpus_per_host=a.gpus_per_host, max_parallel=a.parallel)
    try:
        result = small_campaign(repo=Path(a.repo), executor=executor, storage_url=a.storage,
                                artifacts_dir=Path(a.artifacts), trials=a.trials, num_gpus=a.gpus,
                                gpus_per_host=a.gpus_per_host).run()
    finally:
        executor.shutdown()
    phase = result.phases["decode"]
    print(json.dumps({"launched": phase.launched, "counts": phase.counts, "front": len(phase.front)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_driver_main())
