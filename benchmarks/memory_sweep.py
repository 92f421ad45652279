"""How fast the memory model screens a cluster: every topology of 72 GB300 GPUs for the reference model.

Goal (issue 2): the whole sweep well under a second. Prints the count, the time and configs per second.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from tuner.hardware import get_gpu
from tuner.memory import MemoryInputs, sweep_topologies
from tuner.models import load_model

REFERENCE = Path(__file__).resolve().parents[1] / "examples" / "models" / "qwen3.8-2.4t-a95b-nvfp4"


def main() -> None:
    t0 = time.perf_counter()
    model = load_model(REFERENCE)
    load_s = time.perf_counter() - t0
    gpu = get_gpu("gb300")
    inputs = MemoryInputs(isl=8192, osl=1024)
    timings, rows = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        rows = sweep_topologies(model, gpu, 72, inputs, mtp_values=(0, 1, 2, 3))
        timings.append(time.perf_counter() - t0)
    best = min(timings)
    fitting = sum(r.memory.fits for r in rows)
    print(f"model load (config.json -> spec, {len(model.tensors):,} tensor entries): {load_s * 1000:.1f} ms")
    print(f"valid topologies x MTP depths on 72 x GB300: {len(rows)} ({fitting} fit in memory)")
    print(f"sweep time: best {best * 1000:.1f} ms, median {statistics.median(timings) * 1000:.1f} ms")
    print(f"configs per second: {len(rows) / best:,.0f}")
    print(f"goal (< 1 s for the whole sweep): {'met' if best < 1.0 else 'NOT met'} ({best / 1.0:.3f} of budget)")


if __name__ == "__main__":
    main()
