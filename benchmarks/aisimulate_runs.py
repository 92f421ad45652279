"""Runs NVIDIA aisimulate on the published workload rows topotune's replay scores, and stores its figures.

aisimulate (aiconfigurator's successor, Apache-2.0, pre-releases on PyPI) replays requests event by event, as
tuner/replay does. For every vLLM row of benchmarks/data/public_workload_measurements.yaml that
benchmarks/workload_fidelity.py --replay scores (closed loops and request rates; bursts are not scored there), this
writes the SAME request stream the replay sends (tuner/replay's sampled requests: lengths, shared prefixes, seed 0,
Poisson send times at the row's rate) as a mooncake trace whose hash ids are the prompt's KV blocks, maps the row's
deployment onto an `aisimulate predict` configuration, runs it, and stores its figures WITH the exact command and
configuration in benchmarks/data/aisimulate.yaml (rows it cannot represent: why, with its error message).
benchmarks/workload_fidelity.py --replay reads that file, so the side by side runs without aisimulate installed.

aisimulate pins its own dependencies (jax, ~425 MB), so it lives in a venv of its own and is only run as a command
(topotune never imports it). The stable 0.13.0 on PyPI is a stub that downloads its wheel from NVIDIA's own index
(unreachable here); the newest pre-release ships the wheel on PyPI itself:

    python3 -m venv ~/.cache/topotune/aisim-venv
    ~/.cache/topotune/aisim-venv/bin/pip install --pre aisimulate==0.13.0.dev202610270000000085
    .venv/bin/python benchmarks/aisimulate_runs.py --run      # ~3 min on 2 cores; rewrites the stored file

Mapping (aisimulate's configuration schema, aisimulate/config/{engine,traffic}.py in the installed package):
- engine: mode aggregated, backend vllm, the row's checkpoint when aisimulate ships its config
  (aisimulate_core/model_configs; no hub access here), else the row's own config.json directory; h100 -> h100_sxm,
  h200 -> h200_sxm; workers.aggregated: parallelism {replicas, tensor, attention_data}, MoE layers over TP x DP
  GPUs (moe_tensor, or moe_expert with EP), scheduler {max_batched_tokens, max_sequences} and kv_cache
  {block_size, capacity.memory_fraction} as the replay's topology has them; kvcache_quant_mode fp8 where the row
  served an fp8 KV cache;
- traffic: source `trace` (mooncake, block_size = the KV block), load `trace_timestamps` for a rate row, or
  `concurrency` C for a closed loop;
- router: aisimulate's built-in stack places requests round robin (runner.py: placement provider round_robin);
  its KV-aware router is the Dynamo stack's, which does not run beside this pre-release (NO_KV_ROUTER says
  why, with the error). Rows whose source used a cache-aware router
  are run and stored, flagged `router_represented: false`, and kept out of the side by side.
Scored like the replay: per-request TTFT and ITL (aisimulate's per-request `itl_ms`, AIPerf's definition) over the
requests after the first 10% sent (the replay's warm-up), from aisimulate's --capture-per-request records;
aisimulate's own whole-run summary is stored beside them; for a rate row, whether its queue grows, by the replay's
own rule on aisimulate's per-request send and end times.

Run: .venv/bin/python benchmarks/aisimulate_runs.py [--run] [--inputs] [--aisim PATH] [--only ID ...]
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import json
import math
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workload_fidelity as wf

from tuner.hardware import get_gpu
from tuner.models import load_model
from tuner.perf import RooflineModel
from tuner.replay._arrivals import ArrivalProcess, arrival_times_ms, sampled_requests
from tuner.replay._report import queue_trend
from tuner.topology import Role

REPO = Path(__file__).resolve().parents[1]
STORED = REPO / "benchmarks" / "data" / "aisimulate.yaml"
WORK = Path(".topotune") / "aisimulate"  # relative to the repository's root (git-ignored): configs, traces, outputs
DEFAULT_AISIM = Path(os.environ.get("TOPOTUNE_AISIM", Path.home() / ".cache/topotune/aisim-venv/bin/aisimulate"))
AISIM_VERSION = "0.13.0.dev202610270000000085"
SYSTEMS = {"h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "gb200": "gb200", "gb300": "gb300"}
#: checkpoints whose architecture aisimulate ships under another name (same config.json shape)
ALIASES = {"deepseek-ai/DeepSeek-R1-0528": "deepseek-ai/DeepSeek-R1",
           "meta-llama/Llama-3.1-70B-Instruct": "meta-llama/Meta-Llama-3.1-70B",
           "meta-llama/Llama-3.1-8B": "meta-llama/Meta-Llama-3.1-8B"}
#: why the rows behind a cache-aware router are not like for like, with the attempt to run aisimulate's KV router
NO_KV_ROUTER = (
    "the source routed by KV-cache overlap; aisimulate's built-in engine stack places requests round robin "
    "(runner.py: placement provider round_robin), so this is a round-robin run, not the row's router. Its KV "
    "router is the Dynamo stack's (`aisimulate predict --stack dynamo` with `router: {policy: kv_router}`), from "
    "ai-dynamo 1.6.1, which pins aisimulate==0.13.0 (the stub that cannot install here); installed beside this "
    "pre-release with --no-deps it refuses every configuration: 'invalid engine launch config: "
    "engine.sglang.vlm_cache_bytes: unknown field `vlm_cache_bytes`'")
REQUESTS = 1000  # as workload_fidelity.replay_row: max(1,000, 4 x the closed loop's clients)
WARMUP_SHARE = 0.1
RUN_TIMEOUT_S = 600
RETRIES = 1


@dataclass(frozen=True)
class Plan:
    """One row's aisimulate configuration and request stream, or why there is none."""

    row: dict
    config: dict = field(default_factory=dict)
    trace: tuple[dict, ...] = ()
    router_represented: bool = True
    why: str = ""

    @property
    def id(self) -> str:
        return str(self.row["id"])


def shipped_configs(aisim: Path) -> set[str]:
    """HF ids whose config.json aisimulate ships (it has no hub access here)."""
    found: set[str] = set()
    for d in aisim.parent.parent.glob("lib/python3*/site-packages/aisimulate_core/model_configs"):
        found |= {p.name.removesuffix("_config.json").replace("--", "/", 1) for p in d.glob("*_config.json")}
    return found


def model_ref(row: dict, shipped: set[str]) -> str:
    """aisimulate's `engine.model`: a shipped config by its HF id, else the row's config.json directory."""
    checkpoint = str(row.get("checkpoint") or row["model"])
    for name in (checkpoint, ALIASES.get(checkpoint, "")):
        if name in shipped:
            return name
    model_dir = wf._model_dir(str(row["model"]))
    return str(model_dir.relative_to(REPO)) if model_dir else checkpoint


def trace_rows(specs: list, times: list[float] | None, block_size: int) -> tuple[dict, ...]:
    """Mooncake rows of the replay's requests: one hash id per KV block, equal where the prompts share the
    block's content (a shared prefix), fresh ids for the rest (a prompt's own text and its partial last block)."""
    ids: dict[object, int] = {}
    rows = []
    for i, spec in enumerate(specs):
        hashes = [ids.setdefault((key, b), len(ids) + 1) for key, blocks in spec.units for b in range(blocks)]
        while len(hashes) * block_size < spec.prompt_tokens:
            hashes.append(ids.setdefault(("own", i, len(hashes)), len(ids) + 1))
        row = {"input_length": spec.prompt_tokens, "output_length": spec.output_tokens, "hash_ids": hashes}
        if times is not None:
            row = {"timestamp": round(times[i], 3), **row}
        rows.append(row)
    return tuple(rows)


def plan(row: dict, shipped: set[str]) -> Plan:
    """The row as aisimulate takes it, with the replay's own request stream (see the module docstring)."""
    system = SYSTEMS.get(str(row["gpu"]))
    if system is None:
        return Plan(row, why=f"GPU {row['gpu']!r} has no aisimulate system")
    try:
        shape = wf._replay(row)
    except (KeyError, ValueError) as exc:
        return Plan(row, why=f"not replayed by topotune either: {exc}")
    model_dir = wf._model_dir(str(row["model"]))
    if model_dir is None:
        return Plan(row, why=f"no config.json for {row['model']}")
    topo, w, load = shape.topology, shape.workload, row["load"]
    model = load_model(model_dir)
    perf = RooflineModel(model, get_gpu(str(row["gpu"])))
    block = perf.state(topo, Role.BOTH, isl=w.isl, osl=w.osl).memory.layout.block_size
    closed = load["kind"] == "closed"
    clients = int(load["max_concurrency"]) if closed else 0
    specs = sampled_requests(w, max(REQUESTS, 4 * clients), block, 0, None)
    times = None if closed else arrival_times_ms(len(specs), ArrivalProcess("poisson",
                                                                             rate_rps=float(load["request_rate"])))
    parallel = {"replicas": shape.replicas, "tensor": topo.tp, "attention_data": topo.dp}
    if model.moe is not None:  # vLLM splits experts by tensor over TP x DP, or spreads them with EP
        parallel["moe_expert" if topo.ep else "moe_tensor"] = topo.tp * topo.dp
    worker = {"parallelism": parallel,
              "scheduler": {"max_batched_tokens": topo.max_num_batched_tokens, "max_sequences": topo.max_num_seqs},
              "kv_cache": {"block_size": block, "capacity": {"memory_fraction": topo.gpu_memory_utilization}}}
    engine = {"mode": "aggregated", "model": model_ref(row, shipped), "hardware": system, "backend": "vllm",
              "workers": {"aggregated": worker}}
    if "--kv-cache-dtype fp8" in str(row.get("serve_flags", "")):
        engine["kvcache_quant_mode"] = "fp8"
    config = {"traffic": {"source": {"type": "trace", "paths": [str(WORK / row["id"] / "trace.jsonl")],
                                     "format": "mooncake", "block_size": block},
                          "load": {"type": "concurrency", "concurrency": clients} if closed
                          else {"type": "trace_timestamps"}},
              "engine": engine}
    return Plan(row, config, trace_rows(specs, times, block), router_represented=not shape.cache_aware
                or shape.replicas == 1)


def command(aisim_name: str, row_id: str) -> list[str]:
    work = WORK / row_id
    return [aisim_name, "predict", "-c", str(work / "config.yaml"), "--output-dir", str(work / "out"),
            "--overwrite", "--format", "json", "--capture-per-request"]


def write_inputs(p: Plan) -> None:
    """The configuration and the trace, where the stored command reads them (from the repository's root)."""
    work = REPO / WORK / p.id
    work.mkdir(parents=True, exist_ok=True)
    (work / "config.yaml").write_text(yaml.safe_dump(p.config, sort_keys=False))
    with (work / "trace.jsonl").open("w") as f:
        f.writelines(json.dumps(r) + "\n" for r in p.trace)


def _stats(values: list[float]) -> dict[str, float]:
    a = np.asarray(values, dtype=float)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return {"mean": round(float(a.mean()), 3), "p50": round(float(p50), 3), "p90": round(float(p90), 3),
            "p99": round(float(p99), 3)}


def queue_grows(records: list[dict]) -> bool:
    """The replay's verdict (tuner/replay's queue_trend: requests in flight against send time over the second
    half of the sending window) on aisimulate's per-request send and end times."""
    sent = sorted(float(r["arrival_time_ms"]) for r in records)
    ends = sorted(float(r["terminal_time_ms"]) for r in records)
    in_flight = [i + 1 - bisect.bisect_right(ends, t) for i, t in enumerate(sent)]
    return queue_trend(sent, in_flight).grows


def window(records: list[dict], open_loop: bool, warmup_share: float = WARMUP_SHARE) -> dict[str, object]:
    """TTFT and ITL over the requests after the warm-up (the first share sent), as the replay measures them; for
    an open loop, whether the queue grows."""
    done = [r for r in records if r.get("terminal_status", "completed") == "completed" and r.get("ttft_ms") is not None]
    done.sort(key=lambda r: (float(r["arrival_time_ms"]), int(str(r["session_id"]).rsplit("_", 1)[-1])))
    kept = done[math.ceil(warmup_share * len(done)):]
    itl = [float(r["itl_ms"]) for r in kept if r.get("itl_ms") is not None and int(r["output_length"]) > 1]
    out: dict[str, object] = {"requests": len(kept), "warmup_requests": len(done) - len(kept),
                              "ttft_ms": _stats([float(r["ttft_ms"]) for r in kept]), "itl_ms": _stats(itl)}
    if open_loop:
        out["queue_grows"] = queue_grows(records)
    return out


def summary(report: dict) -> dict[str, object]:
    """aisimulate's own whole-run summary (every request, no warm-up cut)."""
    out: dict[str, object] = {}
    for name in ("ttft", "itl"):
        out[f"{name}_ms"] = {s: round(float(report[f"{k}_{name}_ms"]), 3)
                             for s, k in (("mean", "mean"), ("p50", "median"), ("p90", "p90"), ("p99", "p99"))}
    for key in ("output_throughput_tok_s", "total_throughput_tok_s", "request_throughput_rps",
                "prefix_cache_reused_ratio", "duration_ms", "completed_requests", "num_requests"):
        out[key] = round(float(report[key]), 4) if isinstance(report[key], float) else report[key]
    prov = report.get("prediction_provenance", {}).get("aggregated", {})
    out["perf_data"] = f"{prov.get('timing_source')} {prov.get('estimator')} vllm {prov.get('data_version')}"
    return out


def _execute(aisim: Path, cmd: list[str], out: Path) -> str:
    """Runs one prediction; '' when it wrote its report, else aisimulate's error line."""
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    if proc.returncode == 0 and (out / "prediction.json").exists():
        return ""
    lines = [ln.strip() for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln] or lines[-1:] or [str(proc.returncode)]
    message = errors[-1].removeprefix("aisimulate predict failed: ").split("; supported architectures")[0]
    return message.replace(str(aisim.parent.parent), "<aisimulate venv>")


def run_one(aisim: Path, p: Plan) -> dict[str, object]:
    write_inputs(p)
    cmd = command(str(aisim), p.id)
    stored = {"id": p.id, "command": shlex.join(command("aisimulate", p.id)), "config": p.config}
    stored["trace_sha256"] = hashlib.sha256((REPO / WORK / p.id / "trace.jsonl").read_bytes()).hexdigest()
    if not p.router_represented:
        stored["router_represented"] = False
        stored["note"] = NO_KV_ROUTER
    if "skip-layers" in str(p.row.get("serve_flags", "")):
        stored["note"] = ("the source kept the sliding-window layers' KV in bf16 (--kv-cache-dtype-skip-layers); "
                          "aisimulate takes one KV dtype for every layer, so this row runs as plain fp8 KV")
    out = REPO / WORK / p.id / "out"
    for _ in range(RETRIES + 1):
        message = _execute(aisim, cmd, out)
        if "timed out" not in message:  # its worker's shutdown deadline, missed on a loaded machine: once more
            break
    if message:
        return {**stored, "why": f"aisimulate predict failed: {message}"}
    report = json.loads((out / "prediction.json").read_text())
    records = [json.loads(ln) for ln in (out / "requests.jsonl").read_text().splitlines() if ln.strip()]
    open_loop = p.config["traffic"]["load"]["type"] != "concurrency"
    return {**stored, "window": window(records, open_loop), "summary": summary(report)}


CPU_DATA = REPO / "benchmarks" / "data" / "replay_cpu_validation.json"
CPU_MODEL = "benchmarks/data/tiny-cpu-model"


def cpu_validation_plan() -> Plan:
    """The real vLLM-CPU validation runs (benchmarks/replay_cpu_validation.py's data): their mooncake trace on its
    timestamps, their flags and KV budget, as an aisimulate configuration. aisimulate prices steps from GPU kernel
    data (its systems are GPUs), so this records what it answers for a CPU."""
    data = json.loads(CPU_DATA.read_text())
    model = json.loads((REPO / CPU_MODEL / "config.json").read_text())
    kv_bytes_per_token = 2 * model["num_hidden_layers"] * model["num_key_value_heads"] * model["head_dim"] * 2
    flags = data["flags"]
    worker = {"scheduler": {"max_batched_tokens": flags["max_num_batched_tokens"],
                            "max_sequences": flags["max_num_seqs"]},
              "kv_cache": {"block_size": 16, "bytes_per_token": kv_bytes_per_token,
                           "capacity": {"type": "fixed", "bytes": data["kv_cache_memory_bytes"]}}}
    config = {"traffic": {"source": {"type": "trace", "paths": [str(WORK / "cpu-validation" / "trace.jsonl")],
                                     "format": "mooncake", "block_size": data["block_tokens"]},
                          "load": {"type": "trace_timestamps"}},
              "engine": {"mode": "aggregated", "model": CPU_MODEL, "hardware": "cpu", "backend": "vllm",
                         "workers": {"aggregated": worker}}}
    return Plan({"id": "cpu-validation"}, config, tuple(data["trace"]))


def _line(entry: dict) -> str:
    if "why" in entry:
        return f"not run: {entry['why']}"
    w = entry["window"]
    flag = "" if entry.get("router_represented", True) else "  (router not represented)"
    return (f"TTFT p50 {w['ttft_ms']['p50']:9.1f} p90 {w['ttft_ms']['p90']:9.1f} ms  ITL mean "
            f"{w['itl_ms']['mean']:6.1f} ms{flag}")


HEADER = ("# aisimulate's predictions of benchmarks/data/public_workload_measurements.yaml's vLLM rows, written by\n"
          "# benchmarks/aisimulate_runs.py --run. Each `command` reproduces its row from the repository's root with\n"
          f"# aisimulate {AISIM_VERSION} in its own venv, after `benchmarks/aisimulate_runs.py --inputs` has\n"
          "# written its `config` and its trace (tuner/replay's request stream for the row, seed 0) under\n"
          f"# {WORK}/ID/. `window`: TTFT/ITL over the requests after the first 10% sent (the replay's warm-up);\n"
          "# `summary`: aisimulate's own whole-run figures. Rows with `why` were not predicted, for that reason.\n"
          "# `cpu_validation`: the real vLLM-CPU runs of benchmarks/replay_cpu_validation.py, offered the same way.\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="store_true", help="run aisimulate and rewrite the stored file")
    parser.add_argument("--inputs", action="store_true", help="only write each row's config and trace")
    parser.add_argument("--aisim", type=Path, default=DEFAULT_AISIM, help="the aisimulate executable")
    parser.add_argument("--only", nargs="*", default=None, help="re-run these row ids, keep the others stored")
    args = parser.parse_args(argv)
    rows = [r for r in yaml.safe_load(wf.TABLE.read_text())["rows"] if r["engine"] == "vllm"]
    if args.only is not None:
        rows = [r for r in rows if r["id"] in args.only]
    if not args.aisim.exists():
        print(f"aisimulate not found at {args.aisim}: install it in its own venv (see this file's docstring) "
              f"or pass --aisim PATH")
        return 2 if args.run or args.inputs else 0
    shipped = shipped_configs(args.aisim)
    plans = [plan(r, shipped) for r in rows]
    if not args.run:
        for p in [*plans, cpu_validation_plan()]:
            if p.config and args.inputs:
                write_inputs(p)
            print(f"{p.id:<36} " + (shlex.join(command("aisimulate", p.id)) if p.config else f"(not run: {p.why})"))
        return 0
    stored = yaml.safe_load(STORED.read_text()) if STORED.exists() and args.only is not None else {}
    old, old_cpu = {e["id"]: e for e in stored.get("rows", [])}, stored.get("cpu_validation")
    fresh = {}
    for p in plans:
        fresh[p.id] = run_one(args.aisim, p) if p.config else {"id": p.id, "why": p.why}
        print(f"{p.id:<36} {_line(fresh[p.id])}", flush=True)
    order = [r["id"] for r in yaml.safe_load(wf.TABLE.read_text())["rows"] if r["engine"] == "vllm"]
    entries = [fresh.get(i) or old[i] for i in order if i in fresh or i in old]
    cpu = run_one(args.aisim, cpu_validation_plan()) if args.only is None else old_cpu
    print(f"{'cpu-validation':<36} {_line(cpu)}")
    STORED.write_text(HEADER + yaml.safe_dump({"aisimulate": AISIM_VERSION, "rows": entries, "cpu_validation": cpu},
                                              sort_keys=False, width=100_000))
    print(f"wrote {STORED.relative_to(REPO)}: {sum('why' not in e for e in entries)} predicted, "
          f"{sum('why' in e for e in entries)} not")
    return 0


if __name__ == "__main__":
    sys.exit(main())
