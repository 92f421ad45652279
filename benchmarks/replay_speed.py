"""How long the replay takes for 10,000 requests, one aggregated instance and a 4P1D deployment.

Targets (issue #45), on one core: <= 0.3 s aggregated, <= 0.6 s 4P1D. Run it pinned to one core:
    taskset -c 0 .venv/bin/python benchmarks/replay_speed.py
Llama-3.1-70B on H200, a lognormal chat mix (2,000 / 300 tokens), Poisson at about 80% of what each deployment
carries. Printed: the first run (cold: every distinct batch priced by the step cost model for the first time) and
the best of three (later runs find the prices in the memo shared by pricers of the same step costs), wall and
CPU seconds (the machine is shared: CPU time is what other jobs inflate least). docs/benchmarks/replay-speed.md.
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
from tuner.replay import _engine as replay_engine
from tuner.workload import Workload

REPO = Path(__file__).resolve().parents[1]
REQUESTS = 10_000
WORKLOAD = Workload.model_validate({
    "input_tokens": {"distribution": "lognormal", "mean": 2000, "stddev": 1500, "max_tokens": 16000},
    "output_tokens": {"distribution": "lognormal", "mean": 300, "stddev": 200, "max_tokens": 2000},
    "prefix": {"shared_tokens": 1024, "num_prefixes": 4}})


def _runs(runs: int, plan: ReplayPlan, perf: RooflineModel) -> tuple[list[tuple[float, float]], object]:
    """(wall s, CPU s) of each run, and the last report."""
    times = []
    report = None
    for _ in range(runs):
        start, cpu = time.perf_counter(), time.process_time()
        report = replay(perf, plan)
        times.append((time.perf_counter() - start, time.process_time() - cpu))
    return times, report


def main() -> None:
    perf = RooflineModel(load_model(REPO / "examples/models/llama-3.1-70b"), get_gpu("h200"))
    compiled = replay_engine.__file__.endswith((".so", ".pyd"))  # a copy built by scripts/mypyc-replay.sh
    print(f"load average {os.getloadavg()[0]:.2f}; replay modules {'compiled (mypyc)' if compiled else 'pure Python'}")
    for name, deployment, rate, target in (("aggregated TP8", "TP8", 4.0, 0.3),
                                           ("4P1D", "4P:TP4,1D:TP8", 10.0, 0.6)):
        plan = ReplayPlan(deployment=parse_deployment(deployment), workload=WORKLOAD,
                          arrival=ArrivalProcess("poisson", rate_rps=rate), num_requests=REQUESTS)
        times, report = _runs(3, plan, perf)
        wall, cpu = min(t[0] for t in times), min(t[1] for t in times)
        print(f"{name}: {REQUESTS:,} requests at {rate:g} req/s replayed in {wall:.3f} s, best of 3 (target <= "
              f"{target} s; CPU {cpu:.3f} s; first run {times[0][0]:.3f} s, CPU {times[0][1]:.3f} s); "
              f"{report.steps:,} engine steps, TTFT p50 {report.ttft_ms.p50:,.0f} ms, ITL p50 "
              f"{report.itl_ms.p50:.1f} ms, {report.queue.describe()}")


if __name__ == "__main__":
    main()
