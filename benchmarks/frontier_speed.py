"""How fast the performance model is: instance points per second, and the full reference frontier (goal < 5 s).

Run: .venv/bin/python benchmarks/frontier_speed.py [MODEL_DIR]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from tuner.errors import DoesNotFitError
from tuner.frontier import Constraints, combined_front, compose_disaggregated
from tuner.hardware import get_gpu
from tuner.models import load_model
from tuner.perf import DECODE_LADDER, RooflineModel, candidate_topologies, sweep_curves
from tuner.topology import Role

REPO = Path(__file__).resolve().parents[1]
CANDIDATES = (REPO / "examples" / "models" / "qwen3.8-2.4t-a95b-nvfp4",
              Path("/work/shared/models/qwen3.8-2.4t-a95b-nvfp4"))


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else next(p for p in CANDIDATES if p.exists())
    gpu = get_gpu("gb300")

    started = time.perf_counter()
    model = load_model(path)
    perf = RooflineModel(model, gpu)
    topologies = candidate_topologies(perf, 72, mtp_depths=(0, 1, 2, 3))
    curves = sweep_curves(perf, topologies, isl=8192, osl=1024, prefill_mtp_depths=(0, 1, 2, 3))
    swept = time.perf_counter()
    points = compose_disaggregated(curves.prefill, curves.decode,
                                   Constraints(max_gpus=72, same_tp=True, same_mtp=True))
    front = combined_front(points)
    _ = [p.deployment for p in front]  # what the CLI renders
    done = time.perf_counter()

    # warm point rate: every (topology, concurrency) decode point again, constants already cached
    fitting = [t for t in topologies if t.mtp == 0][:20]
    t0 = time.perf_counter()
    count = 0
    for topo in fitting:
        try:
            cap = perf.capacity(topo, Role.DECODE, isl=8192, osl=1024)
        except DoesNotFitError:  # skipped, as the sweep does
            continue
        levels = [c for c in DECODE_LADDER if c <= cap]
        count += len(perf.predict_curve(topo, Role.DECODE, isl=8192, osl=1024, concurrencies=levels))
    warm = time.perf_counter() - t0

    print(f"model {model.name} on 72 x {gpu.name}, ISL/OSL 8192/1024")
    print(f"topologies (TP, DP, EP, MTP) checked : {len(topologies)}")
    print(f"instance points predicted          : {curves.num_points} "
          f"({curves.num_points / (swept - started):,.0f} points/s cold, incl. model load and memory model)")
    print(f"warm point rate                    : {count / warm:,.0f} points/s ({count} points in {warm * 1e3:.1f} ms)")
    print(f"xPyD deployments composed          : {len(points)} in {(done - swept) * 1e3:.0f} ms")
    print(f"full reference frontier            : {done - started:.2f} s (goal < 5 s); {len(front)} points on the front")
    print(f"front ends                         : {max(p.total_tok_s_per_gpu for p in front):,.0f} tok/s/GPU, "
          f"{max(p.tok_s_per_user for p in front):.1f} tok/s/user")


if __name__ == "__main__":
    main()
