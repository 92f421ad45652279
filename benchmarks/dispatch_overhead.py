"""Per-trial overhead of RayExecutor with the simulated backend: placement + start + collect.

Runs N trials one after the other on the local default Ray head (logical GPUs, as `topotune tune` starts it) and
reports, per trial, the wall time from can_start to the finished result minus the backend's own run time.
Usage: .venv/bin/python benchmarks/dispatch_overhead.py [--trials 120] [--parallel 4]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tuner.backends import TrialRequest
from tuner.deployment import Deployment
from tuner.executors import RayExecutor, shutdown_ray
from tuner.settings import TunerSettings
from tuner.space import ClusterSpec
from tuner.topology import Role, Topology
from tuner.workload import Workload

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "examples" / "models" / "qwen3.8-2.4t-a95b-nvfp4"
SHAPES = ("TEP8", "TP4DP2", "TP8", "TP4DP2+EP")


def _request(i: int, folder: Path) -> TrialRequest:
    return TrialRequest(trial_id=f"bench#{i}", model_path=str(MODEL), gpu="gb300",
                        deployment=Deployment.single(Topology.parse(SHAPES[i % len(SHAPES)], role=Role.DECODE)),
                        workload=Workload(isl=8192, osl=1024, concurrency=(1, 16, 64)),
                        artifacts_dir=str(folder / f"trial-{i:04d}"), timeout_s=120)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--trials", type=int, default=120)
    p.add_argument("--parallel", type=int, default=4)
    a = p.parse_args()
    t0 = time.monotonic()
    executor = RayExecutor.start(TunerSettings(), ClusterSpec(gpu="gb300", num_gpus=16, gpus_per_host=4),
                                 "simulated", {}, max_parallel=a.parallel)
    startup_s = time.monotonic() - t0
    folder = Path(tempfile.mkdtemp(prefix="topotune-dispatch-"))
    try:
        for i in range(4):  # warm the worker pool and the simulator's caches (not counted)
            h = executor.submit(_request(10_000 + i, folder))
            while not executor.wait([h], 10):
                pass
        overhead, place, backend = [], [], []
        for i in range(a.trials):
            req = _request(i, folder)
            s = time.perf_counter()
            assert executor.can_start(req)
            placed = time.perf_counter()
            h = executor.submit(req)
            while not executor.wait([h], 10):
                pass
            total = time.perf_counter() - s
            assert h.result is not None and h.result.status.value != "crashed", h.result
            backend.append(h.result.duration_s)
            overhead.append(total - h.result.duration_s)
            place.append(placed - s)
        # throughput with parallel trials, as a study with --parallel runs them
        s = time.perf_counter()
        pending, running, n = [_request(1000 + i, folder) for i in range(a.trials)], [], 0
        while pending or running:
            while pending and executor.can_start(pending[0]):
                running.append(executor.submit(pending.pop(0)))
            done = executor.wait(running, 5)
            n += len(done)
            running = [h for h in running if h not in done]
        parallel_s = time.perf_counter() - s
    finally:
        executor.shutdown()
        shutdown_ray()
    ms = 1000.0
    print(f"Ray start-up (local head, 16 logical GPUs): {startup_s:.1f} s")
    print(f"sequential trials: {a.trials} (shapes {', '.join(SHAPES)}), simulated backend")
    print(f"  overhead per trial (wall - backend run): median {statistics.median(overhead) * ms:.0f} ms, "
          f"p95 {_pct(overhead, 0.95) * ms:.0f} ms, max {max(overhead) * ms:.0f} ms")
    print(f"  of which placement (can_start: reserve the groups): median {statistics.median(place) * ms:.1f} ms, "
          f"p95 {_pct(place, 0.95) * ms:.1f} ms")
    print(f"  backend run time itself: median {statistics.median(backend) * ms:.0f} ms")
    print(f"parallel ({a.parallel} in flight): {n} trials in {parallel_s:.1f} s = "
          f"{parallel_s / n * ms:.0f} ms per trial")


if __name__ == "__main__":
    main()
