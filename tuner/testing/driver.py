"""`python -m tuner.testing.driver MODEL SPACE STORAGE ARTIFACTS RECORDS TRIALS DELAY_S`: one driver of a small
campaign of ProbeBackend trials on RAY_ADDRESS (the driver-restart checks kill this process mid-study and start
it again)."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from tuner.executors import BackendSpec, RayExecutor, ensure_ray
from tuner.testing._campaign import small_campaign
from tuner.testing._probe import probe_spec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tuner.testing.driver")
    for name in ("model", "space", "storage", "artifacts", "records"):
        p.add_argument(name)
    p.add_argument("trials", type=int)
    p.add_argument("delay_s", type=float)
    p.add_argument("--gpus", type=int, default=12)
    p.add_argument("--gpus-per-host", type=int, default=4)
    p.add_argument("--parallel", type=int, default=2)
    a = p.parse_args(argv)
    ensure_ray(address=os.environ["RAY_ADDRESS"], num_gpus=a.gpus)
    spec = probe_spec(a.records, delay_s=a.delay_s, spawn=True, inner=BackendSpec("simulated"))
    executor = RayExecutor(spec, gpus_per_host=a.gpus_per_host, max_parallel=a.parallel)
    try:
        result = small_campaign(model_path=a.model, space_path=a.space, executor=executor, storage_url=a.storage,
                                artifacts_dir=Path(a.artifacts), trials=a.trials, num_gpus=a.gpus,
                                gpus_per_host=a.gpus_per_host).run()
    finally:
        executor.shutdown()
    phase = result.phases["decode"]
    print(json.dumps({"launched": phase.launched, "counts": phase.counts, "front": len(phase.front)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
