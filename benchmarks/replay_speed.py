"""How long the replay takes for 10,000 requests, one aggregated instance and a 4P1D deployment.

Targets (issue #45), on one core: <= 0.3 s aggregated, <= 0.6 s 4P1D. Run it pinned to one core:
    taskset -c 0 .venv/bin/python benchmarks/replay_speed.py
Llama-3.1-70B on H200, a lognormal chat mix (2,000 / 300 tokens), Poisson at about 80% of what each deployment
carries; the best of three runs is printed (the machine is shared).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tuner.deployment import parse_deployment
from tuner.hardware import get_gpu
from tuner.models import load_model
from tuner.perf import RooflineModel
from tuner.replay import ArrivalProcess, ReplayPlan, replay
from tuner.workload import Workload

REPO = Path(__file__).resolve().parents[1]
REQUESTS = 10_000
WORKLOAD = Workload.model_validate({
    "input_tokens": {"distribution": "lognormal", "mean": 2000, "stddev": 1500, "max_tokens": 16000},
    "output_tokens": {"distribution": "lognormal", "mean": 300, "stddev": 200, "max_tokens": 2000},
    "prefix": {"shared_tokens": 1024, "num_prefixes": 4}})


def _best_of(runs: int, plan: ReplayPlan, perf: RooflineModel) -> tuple[float, object]:
    best = float("inf")
    report = None
    for _ in range(runs):
        start = time.perf_counter()
        report = replay(perf, plan)
        best = min(best, time.perf_counter() - start)
    return best, report


def main() -> None:
    perf = RooflineModel(load_model(REPO / "examples/models/llama-3.1-70b"), get_gpu("h200"))
    print(f"load average {os.getloadavg()[0]:.2f}")
    for name, deployment, rate, target in (("aggregated TP8", "TP8", 4.0, 0.3),
                                           ("4P1D", "4P:TP4,1D:TP8", 10.0, 0.6)):
        plan = ReplayPlan(deployment=parse_deployment(deployment), workload=WORKLOAD,
                          arrival=ArrivalProcess("poisson", rate_rps=rate), num_requests=REQUESTS)
        seconds, report = _best_of(3, plan, perf)
        print(f"{name}: {REQUESTS:,} requests at {rate:g} req/s replayed in {seconds:.3f} s (target <= {target} s); "
              f"{report.steps:,} engine steps, TTFT p50 {report.ttft_ms.p50:,.0f} ms, ITL p50 "
              f"{report.itl_ms.p50:.1f} ms, {report.queue.describe()}")


if __name__ == "__main__":
    main()
