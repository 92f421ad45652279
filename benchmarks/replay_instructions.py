"""The speed benchmark's plan replayed N times, for instruction counts under callgrind (CPU seconds on this shared
machine move with the load; instructions do not). docs/benchmarks/replay-speed.md.

    valgrind --tool=callgrind .venv/bin/python benchmarks/replay_instructions.py agg|pd|none N [dump]

`none`: imports and the plan only (subtract it from a run's total); `dump`: `callgrind_control -d` after the set-up
and after each replay, so each part is its own callgrind.out file (the replay alone).
"""

from __future__ import annotations

import os
import subprocess
import sys

from replay_speed import REPO, REQUESTS, WORKLOAD

from tuner.deployment import parse_deployment
from tuner.hardware import get_gpu
from tuner.models import load_model
from tuner.perf import RooflineModel
from tuner.replay import ArrivalProcess, ReplayPlan, replay

PLANS = {"agg": ("TP8", 4.0), "pd": ("4P:TP4,1D:TP8", 10.0), "none": ("TP8", 4.0)}


def _dump(tag: str) -> None:
    subprocess.run(["callgrind_control", "-d", tag, str(os.getpid())], check=False, stdout=subprocess.DEVNULL)


def main() -> None:
    which, runs = sys.argv[1], int(sys.argv[2])
    dump = sys.argv[3:] == ["dump"]
    perf = RooflineModel(load_model(REPO / "examples/models/llama-3.1-70b"), get_gpu("h200"))
    deployment, rate = PLANS[which]
    plan = ReplayPlan(deployment=parse_deployment(deployment), workload=WORKLOAD,
                      arrival=ArrivalProcess("poisson", rate_rps=rate), num_requests=REQUESTS)
    if dump:
        _dump("setup")
    for i in range(runs if which != "none" else 0):
        report = replay(perf, plan)
        if dump:
            _dump(f"replay{i + 1}")
        print(f"{which} replay {i + 1}: {report.steps:,} engine steps, TTFT p50 {report.ttft_ms.p50:.3f} ms")


if __name__ == "__main__":
    main()
