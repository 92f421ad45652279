"""The replay's results before and after an engine change: every report field and per-request record of 29
replays (the speed benchmark's two, preemption, MTP, sessions, traces, DP, PD, GDN state blocks, a long-prefill
threshold, no prefix caching) and the engine's step logs on 45 scheduler cases (the requests of
tests/replay/test_against_vllm_scheduler.py at other cache sizes, thresholds and budgets).

    git stash / checkout the code before; .venv/bin/python benchmarks/replay_equality.py dump /tmp/before.pkl
    back to the change;                 .venv/bin/python benchmarks/replay_equality.py compare /tmp/before.pkl

Prints one line per case: identical, float-rounding only (|a - b| <= 1e-9 relative), or the fields that differ.
docs/benchmarks/replay-speed.md.
"""

from __future__ import annotations

import importlib.util
import math
import pickle
import sys
from pathlib import Path

from tuner.deployment import parse_deployment
from tuner.hardware import get_gpu
from tuner.models import load_model
from tuner.perf import RooflineModel
from tuner.replay import ArrivalProcess, ReplayPlan, Sessions, replay
from tuner.router import RouterPolicy
from tuner.workload import Workload

REPO = Path(__file__).resolve().parents[1]


def _fixed(isl: int, osl: int, **extra: object) -> Workload:
    return Workload.model_validate({"isl": isl, "osl": osl, **extra})


MIX = Workload.model_validate({
    "input_tokens": {"distribution": "lognormal", "mean": 2000, "stddev": 1500, "max_tokens": 16000},
    "output_tokens": {"distribution": "lognormal", "mean": 300, "stddev": 200, "max_tokens": 2000},
    "prefix": {"shared_tokens": 1024, "num_prefixes": 4}})
PER_TOKEN = 2 * 80 * 8 * 128 * 2 / 8  # Llama-3.1-70B's KV bytes per token per GPU at TP8


def _plan(deployment: str, workload: Workload, arrival: ArrivalProcess, mtp: int = 0, **extra: object) -> ReplayPlan:
    return ReplayPlan(deployment=parse_deployment(deployment, mtp=mtp), workload=workload, arrival=arrival,
                      **extra)  # type: ignore[arg-type]


def _dense_cases():  # type: ignore[no-untyped-def]
    h200 = get_gpu("h200")
    dense = load_model(REPO / "examples/models/llama-3.1-70b")
    perf = RooflineModel(dense, h200)
    tiny = RooflineModel(dense, h200, kv_cache_memory_bytes=int(PER_TOKEN * 10_000))
    small = RooflineModel(dense, h200, kv_cache_memory_bytes=int(PER_TOKEN * 60_000))
    trace = Workload.from_trace(REPO / "examples/traces/chat-multiturn.jsonl")
    shared = _fixed(3000, 50, prefix={"shared_tokens": 2048, "num_prefixes": 8})
    poisson = ArrivalProcess("poisson", rate_rps=4.0)
    yield "bench_agg", perf, _plan("TP8", MIX, poisson, num_requests=10000)
    yield "bench_pd", perf, _plan("4P:TP4,1D:TP8", MIX, ArrivalProcess("poisson", rate_rps=10.0), num_requests=10000)
    yield "closed1", perf, _plan("TP8", _fixed(2000, 200), ArrivalProcess("closed", concurrency=1), num_requests=1)
    yield "tiny_preempt", tiny, _plan("TP8", _fixed(1000, 2000), ArrivalProcess("closed", concurrency=12),
                                      num_requests=24)
    yield "small_preempt_mix", small, _plan("TP8", MIX, ArrivalProcess("poisson", rate_rps=6.0), num_requests=800)
    yield "small_pd", small, _plan("2P:TP4,1D:TP8", MIX, ArrivalProcess("poisson", rate_rps=5.0), num_requests=600)
    yield "closed32", perf, _plan("TP8", _fixed(2000, 200), ArrivalProcess("closed", concurrency=32),
                                  num_requests=600, warmup_share=0.1)
    yield "past", perf, _plan("TP8", _fixed(2000, 200), ArrivalProcess("poisson", rate_rps=12.0), num_requests=600)
    yield "cache_aware4x", perf, _plan("4x:TP8", shared, ArrivalProcess("poisson", rate_rps=2.0), num_requests=200)
    yield "rr4x", perf, _plan("4x:TP8", shared, ArrivalProcess("poisson", rate_rps=2.0),
                              router=RouterPolicy.ROUND_ROBIN, num_requests=200)
    yield "pd2p", perf, _plan("2P:TP4,1D:TP8", _fixed(2000, 200), ArrivalProcess("poisson", rate_rps=1.0),
                              num_requests=50)
    yield "sessions", perf, _plan("TP8", _fixed(500, 100), ArrivalProcess("poisson", rate_rps=0.5),
                                  sessions=Sessions(turns=4, think_ms=500), num_requests=40)
    yield "sessions_small", tiny, _plan("TP8", _fixed(500, 300), ArrivalProcess("poisson", rate_rps=3),
                                        sessions=Sessions(turns=4, think_ms=500), num_requests=400)
    yield "sessions_mix", perf, _plan("TP8", MIX, ArrivalProcess("gamma", rate_rps=3, cv=2),
                                      sessions=Sessions(turns=3, think_ms=1000), num_requests=1500)
    yield "trace", perf, _plan("TP8", trace, ArrivalProcess("trace"))
    yield "trace_r4", perf, _plan("1P:TP4,1D:TP2", trace, ArrivalProcess("trace", rate_rps=4.0))
    yield "trace_small", tiny, _plan("TP8", trace, ArrivalProcess("trace", rate_rps=2.0))
    yield "dp", perf, _plan("TP2DP4", MIX, ArrivalProcess("poisson", rate_rps=6.0), num_requests=1500)
    yield "threshold", perf, _plan("TP8", MIX, poisson, num_requests=1500, long_prefill_token_threshold=512)
    yield "noprefix", perf, _plan("TP8", MIX, poisson, num_requests=1500, prefix_caching=False)


def _other_cases():  # type: ignore[no-untyped-def]
    h200 = get_gpu("h200")
    ds = load_model(REPO / "examples/models/deepseek-v3")
    dsp = RooflineModel(ds, h200)
    dss = RooflineModel(ds, h200, kv_cache_memory_bytes=70_000 * 20000)
    three = ArrivalProcess("poisson", rate_rps=3.0)
    yield "mtp_agg2", dsp, _plan("TP8", MIX, three, 2, num_requests=1500)
    yield "mtp_agg3", dsp, _plan("TP8", MIX, three, 3, num_requests=1500)
    yield "mtp_pd", dsp, _plan("1P:TP8,1D:TP8", MIX, three, 1, num_requests=1500)
    yield "mtp_small", dss, _plan("TP8", MIX, ArrivalProcess("poisson", rate_rps=4.0), 2, num_requests=800)
    yield "mtp_sessions", dss, _plan("TP8", _fixed(500, 300), three, 2, sessions=Sessions(turns=4, think_ms=500),
                                     num_requests=400)
    for name in ("qwen3-next-80b-a3b", "deepseek-v3", "gpt-oss-120b"):
        perf = RooflineModel(load_model(REPO / "examples/models" / name), h200)
        yield "model_" + name, perf, _plan("TP8", MIX, ArrivalProcess("poisson", rate_rps=4.0), num_requests=1500)
    qwen = RooflineModel(load_model(REPO / "examples/models/qwen3-next-80b-a3b"), h200,
                         kv_cache_memory_bytes=int(PER_TOKEN * 20000))
    yield "model_qwen_small", qwen, _plan("TP4", MIX, ArrivalProcess("poisson", rate_rps=6.0), num_requests=800)


def _scheduler_logs() -> dict:
    sys.path.insert(0, str(REPO / "tests"))
    spec = importlib.util.spec_from_file_location("tv", REPO / "tests/replay/test_against_vllm_scheduler.py")
    tv = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(tv)  # type: ignore[union-attr]
    out: dict = {}
    for blocks in (200, 16, 12, 10, 30):
        for threshold in (0, 24, 8):
            for seqs, budget in ((4, 64), (8, 128), (2, 32)):
                case = {"block_size": 16, "max_num_seqs": seqs, "max_num_batched_tokens": budget,
                        "max_model_len": 512, "num_blocks": blocks, "long_prefill_token_threshold": threshold,
                        "requests": tv._requests()}
                try:
                    out[(blocks, threshold, seqs, budget)] = tv._replay_steps(case)
                except Exception as e:  # a refusal is a result to compare too
                    out[(blocks, threshold, seqs, budget)] = repr(e)
    return out


def run() -> dict:
    results: dict = {}
    for cases in (_dense_cases(), _other_cases()):
        for name, perf, plan in cases:
            try:
                results[name] = replay(perf, plan).as_json()
            except Exception as e:  # a refusal is a result to compare too
                results[name] = f"{type(e).__name__}: {e}"
    results["scheduler_logs"] = _scheduler_logs()
    return results


def close(a: object, b: object, path: tuple, diffs: list) -> None:
    """Append to `diffs` where a and b differ by more than float rounding."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            diffs.append((path, "keys"))
            return
        for k in a:
            close(a[k], b[k], (*path, k), diffs)
    elif isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            diffs.append((path, f"length {len(a)} vs {len(b)}"))
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            close(x, y, (*path, i), diffs)
    elif isinstance(a, float) and isinstance(b, float):
        if not (a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))):
            diffs.append((path, f"{a!r} vs {b!r}"))
    elif a != b:
        diffs.append((path, f"{str(a)[:80]} vs {str(b)[:80]}"))


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in ("dump", "compare"):
        sys.exit("usage: replay_equality.py dump|compare FILE")
    if sys.argv[1] == "dump":
        Path(sys.argv[2]).write_bytes(pickle.dumps(run()))
        return
    before = pickle.loads(Path(sys.argv[2]).read_bytes())  # a file this script wrote
    after = run()
    for name, old in before.items():
        diffs: list = []
        close(old, after.get(name), (), diffs)
        verdict = "identical" if old == after.get(name) else (f"{len(diffs)} DIFFER" if diffs else
                                                               "float-rounding only")
        print(f"{name}: {verdict}")
        for d in diffs[:5]:
            print("   ", d)


if __name__ == "__main__":
    main()
