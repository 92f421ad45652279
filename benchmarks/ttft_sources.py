"""Why the replayed TTFT p50 misses by source (#45): what a predicted TTFT is made of, and what each source implies.

Part 1, per TTFT-p50 row of benchmarks/workload_fidelity.py --replay (vLLM, closed loop): the held-out calibration's
analytic split of the typical request's TTFT (benchmarks/workload_fidelity.py's row, its median prompt: ShareGPT's
lognormal median mean / sqrt(2), the blog's nominal 20k) into the queue wait, the front end (request_overhead_ms +
tokenizer) and the prompt's own chunk steps (how many, each split into GEMM compute at the step's efficiency,
attention, HBM, fixed overheads and the decoding requests' host cost), beside the replay's TTFT p50 and the
measured one.

Part 2, what each Hopper vLLM measurement implies about prefill speed, one factor at a time, all else at the class
calibration fitted on every fixed-length source (what the blog rows are predicted with):
- prefill-dominated figures (fixed-length bursts with 2k-32k-token prompts: tokens/s; the blog's 20k-token TTFT
  p50): the factor s by which prefill compute (prefill_flop_efficiency and attention_flop_efficiency together)
  must be faster (s > 1) or slower for the model to reproduce the figure;
- short-prompt TTFT (GPUStack's ShareGPT and fixed-length closed-loop rows): the request_overhead_ms that would
  reproduce the figure, everything else kept.
A model whose one calibration fits both needs s near 1 on every prefill-dominated row.

Part 3: the matched pair. Two rows of different sources whose long-prompt steps have the same composition (one H100,
8,192-token chunks of one prompt at long context, a handful of decodes beside them), priced per prompt token with two
free efficiencies (GEMM a, attention b): the system of the two measured per-token times, solved for (a, b).

Run: PYTHONPATH=. .venv/bin/python benchmarks/ttft_sources.py
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from pathlib import Path
from typing import NamedTuple

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fidelity
import workload_fidelity as wf

from tuner.perf import Calibration, RooflineModel
from tuner.perf._steps import _chunk_work
from tuner.topology import Role, Topology

SCALED = ("prefill_flop_efficiency", "attention_flop_efficiency")
LONG_PROMPT = 1900  # prefill-dominated: the fixed-length table's 2k, 4k and 32k bursts
NEW_STACK = (0, 14)  # Part 6: the Hopper table has vLLM 0.10.2-0.13 (GPUStack) and 0.18-0.21 (InferenceX)
#: GPUStack's Qwen3-14B page, Other Benchmark Cases, vLLM baseline, "random 32K input": "Median ITL (ms): 43.48"
#: (gpustack/gpustack docs/performance-lab/qwen3-14b/h100.md at 7ae332a; public_measurements.yaml keeps its TPOT only)
GPUSTACK_Q14B_32K_ITL_P50_MS = 43.48
BLOG_SPEED = 1.4  # Part 2: the blog rows' median s
FLOOR = Path(__file__).resolve().parent / "data" / "workload_floor.json"


def _pct(log_ratio: float) -> float:
    return (math.exp(log_ratio) - 1) * 100


def _typical_isl(row: dict) -> int:
    w = row["workload"]
    if "isl_mean" in w:  # ShareGPT, lognormal CV 1: median = mean / sqrt(1 + CV^2)
        return max(1, round(float(w["isl_mean"]) / math.sqrt(1 + wf.SHAREGPT_CV ** 2)))
    return int(w["isl_nominal"])


def _osl(row: dict) -> int:
    w = row["workload"]
    return round(float(w.get("osl_mean") or w["osl_nominal"]))


def ttft_rows() -> list[dict]:
    rows = yaml.safe_load(wf.TABLE.read_text())["rows"]
    return [r for r in rows if r["engine"] == "vllm" and r["load"]["kind"] == "closed"
            and (r["measured"].get("ttft_ms") or {}).get("p50")]



class HopperClass(NamedTuple):
    """The fixed-length table's rows, its Hopper vLLM rows and their class fit (fidelity.py's full per-class fit):
    what every Part after the breakdown starts from."""

    rows: list
    hopper: list
    full: Calibration


_FITTED: dict[int, HopperClass] = {}


def hopper_class(cals: wf.Calibrations) -> HopperClass:
    """Fitted once per run: the fit takes seconds and every Part reads the same one."""
    if id(cals) not in _FITTED:
        _, rows = fidelity.load_table(fidelity.TABLE)
        hopper = [r for r in rows if r.is_vllm and fidelity.gpu_class(cals.replayer.gpu(r.gpu)) == "hopper"]
        full = fidelity.fit_class(cals.replayer, hopper, fidelity.PRIORS["hopper"])
        _FITTED[id(cals)] = HopperClass(rows, hopper, full)
    return _FITTED[id(cals)]

def breakdown(cals: wf.Calibrations) -> None:
    print("Part 1: the typical request's predicted TTFT (analytic, held-out calibration), ms")
    print(f"  {'row':34s} {'meas':>6s} {'replay':>6s} {'model':>6s} = {'wait':>5s} + {'front':>5s} + chunks x "
          f"step ({'gemm':>6s} {'attn':>5s} {'hbm':>5s} {'fixed':>5s} {'reqs':>4s}) [tokens/chunk, decodes]  "
          f"prefill eff at chunk")
    for row in ttft_rows():
        shape = wf._replay(row)
        cal, _ = cals.held_out(str(row["gpu"]), str(row["source"]))
        model_dir = wf._model_dir(str(row["model"]))
        perf = wf.row_perf(row, model_dir, cal, shape.topology)
        isl, osl, c = _typical_isl(row), _osl(row), int(row["load"]["max_concurrency"])
        m, parts = perf.predict_with_parts(shape.topology, Role.BOTH, isl=isl, osl=osl, concurrency=c)
        point = perf.aggregated_point(shape.topology, c, isl=isl, osl=osl)
        chunk = min(float(isl), point.chunk_tokens)
        step = perf._mixed(shape.topology, isl, osl, 1)(point.decode_requests, chunk)
        steps = parts.prompt_ms / step.step_ms if step.step_ms else 0.0
        replayed = wf.replay_row(row, cals, requests=400)
        rep = math.exp(replayed.errors["ttft_p50"]) * row["measured"]["ttft_ms"]["p50"]
        eff = cal.prefill_flop_efficiency * chunk / (chunk + cal.prefill_half_tokens)
        print(f"  {row['id']:34s} {row['measured']['ttft_ms']['p50']:6.1f} {rep:6.1f} {m.ttft_ms_mean:6.1f} = "
              f"{parts.wait_ms:5.1f} + {parts.front_ms:5.1f} + {steps:4.2f} x ({step.compute_ms:6.1f} "
              f"{step.attention_ms:5.1f} {step.memory_ms:5.1f} {step.overhead_ms + step.comm_ms:5.1f} "
              f"{step.requests_ms:4.1f}) [{chunk:5.0f}, {point.decode_requests:4.1f}]  {eff:.2f}")
    print("  (gemm: the step's GEMM FLOPs at the step's efficiency; the step is max(gemm, hbm) + attn + fixed + reqs)")


def _solve(predict, measured: float, cal: Calibration, lo: float = 0.2, hi: float = 6.0) -> float:
    """The scale s of prefill compute speed at which predict(cal scaled) == measured (bisection in log s);
    predict must fall as s grows."""
    def f(s: float) -> float:
        scaled = cal.model_copy(update={n: cal.factor(n) * s for n in SCALED})
        return math.log(predict(scaled) / measured)
    a, b = math.log(lo), math.log(hi)
    if f(lo) * f(hi) > 0:
        return float("nan")
    for _ in range(40):
        mid = (a + b) / 2
        if f(math.exp(mid)) > 0:
            a = mid
        else:
            b = mid
    return math.exp((a + b) / 2)


def implied(cals: wf.Calibrations) -> None:
    replayer = cals.replayer
    _, hopper, full = hopper_class(cals)
    print("\nPart 2: what each Hopper vLLM figure implies, all else at the class fit on every fixed-length source")
    print("  " + ", ".join(f"{n}={full.factor(n):.3g}" for n in (*SCALED, "prefill_half_tokens",
                                                                  "request_overhead_ms")))
    print("  prefill-dominated figures: prefill compute speed s the figure asks for (1 = the class fit)")
    by_source: dict[str, list[float]] = {}
    for r in hopper:
        if r.load_kind != "burst" or r.isl < LONG_PROMPT:
            continue
        s = _solve(lambda cal, r=r: 1.0 / replayer.predict(r, cal).tok_s_per_gpu, 1.0 / r.tok_s_per_gpu, full)
        by_source.setdefault(f"{r.source} (vLLM {r.engine_version}, bursts)", []).append(s)
        print(f"    {r.id:34s} {r.source:30s} vLLM {r.engine_version:7s} isl {r.isl:6.0f}  s = {s:.2f}")
    for row in ttft_rows():
        if _typical_isl(row) < LONG_PROMPT:
            continue
        shape = wf._replay(row)
        model_dir = wf._model_dir(str(row["model"]))
        isl, osl, c = _typical_isl(row), _osl(row), int(row["load"]["max_concurrency"])

        def ttft(cal: Calibration, row=row, shape=shape, model_dir=model_dir, isl=isl, osl=osl, c=c) -> float:
            perf = wf.row_perf(row, model_dir, cal, shape.topology)
            return perf.predict(shape.topology, Role.BOTH, isl=isl, osl=osl, concurrency=c).ttft_ms_mean

        s = _solve(ttft, float(row["measured"]["ttft_ms"]["p50"]), full)
        by_source.setdefault(f"{row['source']} (vLLM not stated, 2026-04, TTFT p50)", []).append(s)
        print(f"    {row['id']:34s} {row['source']:30s} {'':12s} isl {isl:6d}  s = {s:.2f}")
    print("  median s by source:")
    for name, values in by_source.items():
        print(f"    {name:60s} {statistics.median(values):.2f}  (n={len(values)})")
    print("  short-prompt TTFT: request_overhead_ms the figure asks for (class fit: "
          f"{full.request_overhead_ms:.1f} ms)")
    for row in ttft_rows():
        if _typical_isl(row) >= LONG_PROMPT:
            continue
        shape = wf._replay(row)
        perf = wf.row_perf(row, wf._model_dir(str(row["model"])), full, shape.topology)
        isl, osl, c = _typical_isl(row), _osl(row), int(row["load"]["max_concurrency"])
        pred = perf.predict(shape.topology, Role.BOTH, isl=isl, osl=osl, concurrency=c).ttft_ms_mean
        need = full.request_overhead_ms + row["measured"]["ttft_ms"]["p50"] - pred
        print(f"    {row['id']:34s} measured {row['measured']['ttft_ms']['p50']:6.1f}  model {pred:6.1f}  "
              f"-> request_overhead_ms {need:5.1f}")


def matched_pair(cals: wf.Calibrations) -> None:
    """Qwen3-14B 32k burst (GPUStack, vLLM 0.11) against Llama-3.1-8B 20k TTFT (vLLM blog), one H100 each."""
    print("\nPart 3: matched long-prompt steps on one H100, two sources; per prompt token, GEMM FLOPs at a and "
          "attention FLOPs at b of the BF16 peak")
    _, fixed_rows = fidelity.load_table(fidelity.TABLE)
    replayer = cals.replayer
    burst = next(r for r in fixed_rows if r.id == "q14b-h100-32k")
    blog = next(r for r in ttft_rows() if r["id"] == "vb-fp8kv-llama8b-h100-bf16")
    gpu = replayer.gpu("h100")
    peak = gpu.tflops("bf16") * 1e12
    equations = []
    for label, perf, topo, isl, us_per_token in (
        ("q14b-h100-32k (GPUStack, vLLM 0.11.0): 100 x 32,000-token prompts sent at once",
         replayer.perf(burst, Calibration()), Topology.parse(burst.topology, role=Role.BOTH, **burst.engine_flags),
         round(burst.isl), None),
        ("vb-fp8kv-llama8b-h100-bf16 (vLLM blog): TTFT p50 of ~20,000-token prompts at c=8",
         RooflineModel(wf.load_model(wf._model_dir(str(blog["model"]))), gpu, Calibration()),
         Topology.parse("TP1", role=Role.BOTH), 20000, None)):
        state = perf.state(topo, Role.BOTH, isl=isl, osl=100)
        work = _chunk_work(state.costs, float(isl), 1, isl, 1.0, 1.0).flops
        gemm, attn = (work.bf16 + work.fp8 + work.fp4) / isl, work.attn / isl
        if us_per_token is None and label.startswith("q14b"):
            # the burst's duration is its prompts' chunk steps plus decode-only steps between them (at most 8
            # requests fit the KV cache at 32k); those are ~15 ms each: an upper bound of 13 s of the run
            duration_s = burst.load_value * (burst.isl + burst.osl) / burst.tok_s_per_gpu
            us_per_token = duration_s / (burst.load_value * burst.isl) * 1e6
            note = f"run {duration_s:.0f} s / {burst.load_value * burst.isl / 1e6:.1f} M prompt tokens"
        else:
            ttft_ms = float(blog["measured"]["ttft_ms"]["p50"])
            us_per_token = ttft_ms / 20000 * 1e3
            note = f"TTFT p50 {ttft_ms:.0f} ms / 20,000 tokens (front end and decodes not taken off)"
        equations.append((gemm / peak * 1e6, attn / peak * 1e6, us_per_token))
        print(f"  {label}\n    {gemm / 1e9:5.1f} GFLOP GEMM + {attn / 1e9:5.1f} GFLOP attention per token; "
              f"measured {us_per_token:5.1f} us per token ({note}) -> {(gemm + attn) / us_per_token / 1e6:4.0f} "
              f"TFLOP/s = {(gemm + attn) / us_per_token * 1e6 / peak:.2f} of the peak")
    (g1, a1, t1), (g2, a2, t2) = equations
    # the burst's decode-only steps (~7 requests at ~32k, GPUStack's median ITL each) taken off its run as well
    steps = burst.load_value * (burst.osl + burst.isl / 8192) / 7.0 - burst.load_value * burst.isl / 8192
    t1_prefill = t1 - steps * GPUSTACK_Q14B_32K_ITL_P50_MS * 1e3 / (burst.load_value * burst.isl)
    for label, t1_used in (("the whole run", t1), (f"less {steps:.0f} decode-only steps", t1_prefill)):
        det = g1 * a2 - g2 * a1
        u, v = (t1_used * a2 - t2 * a1) / det, (g1 * t2 - g2 * t1_used) / det  # u = 1/a, v = 1/b
        print(f"  solving g/a + t/b = time for both (burst: {label}, {t1_used:.1f} us per token): 1/a = {u:.2f}, "
              f"1/b = {v:.2f} -> " + ("no positive (a, b): no single pair of efficiencies reproduces both"
                                     if u <= 0 or v <= 0 else f"a = {1 / u:.2f}, b = {1 / v:.2f}"))
    for a in (0.35, 0.5, 0.65):
        for b in (0.35, 0.5, 0.65):
            print(f"    a = {a:.2f}, b = {b:.2f}: pred/meas  q14b-32k x{(g1 / a + a1 / b) / t1:.2f}   "
                  f"llama8b-20k x{(g2 / a + a2 / b) / t2:.2f}")


def long_decode_pair(cals: wf.Calibrations) -> None:
    """The decode-only steps beside the same long prompts: GPUStack's 32k burst against the blog's 20k closed loop."""
    replayer = cals.replayer
    fixed_rows, _, full = hopper_class(cals)
    burst = next(r for r in fixed_rows if r.id == "q14b-h100-32k")
    blog = next(r for r in ttft_rows() if r["id"] == "vb-fp8kv-llama8b-h100-bf16")
    print("\nPart 3c: decode-only steps at long context on one H100 (a token gap's median is one: most steps carry "
          "no chunk), measured against the class fit's step, ms")
    perf = replayer.perf(burst, full)
    topo = Topology.parse(burst.topology, role=Role.BOTH, **burst.engine_flags)
    running = perf.aggregated_point(topo, burst.load_value, isl=round(burst.isl), osl=round(burst.osl))
    step = perf._mixed(topo, round(burst.isl), round(burst.osl), 1)(running.running_per_rank, 0.0).step_ms
    print(f"  q14b-h100-32k (GPUStack, vLLM 0.11.0), {running.running_per_rank:.0f} requests at ~32k: median ITL "
          f"{GPUSTACK_Q14B_32K_ITL_P50_MS} ms, model {step:.1f} ms "
          f"-> measured x{GPUSTACK_Q14B_32K_ITL_P50_MS / step:.2f}")
    shape = wf._replay(blog)
    perf = wf.row_perf(blog, wf._model_dir(str(blog["model"])), full, shape.topology)
    step = perf._mixed(shape.topology, 20000, 2000, 1)(8.0, 0.0).step_ms
    itl = float(blog["measured"]["itl_ms"]["p50"])
    print(f"  vb-fp8kv-llama8b-h100-bf16 (vLLM blog), 8 requests at ~21k: median ITL {itl} ms, model {step:.1f} ms "
          f"-> measured x{itl / step:.2f}")


def short_pair(cals: wf.Calibrations) -> None:
    """Two GPUStack ShareGPT rows at c=4 on one H100: the front end each implies, bounded by the GPU's physics."""
    full = hopper_class(cals).full
    # the fastest the GPU can run the prompt's step: every byte at the HBM peak, every FLOP at the BF16 peak, no
    # kernel or step overhead; the slowest the model prices it: the class fit's own step
    ideal = full.model_copy(update={"hbm_efficiency": 1.0, "prefill_flop_efficiency": 1.0, "prefill_half_tokens": 0.0,
                                    "attention_flop_efficiency": 1.0, "moe_gemm_efficiency": 1.0,
                                    "kernel_latency_us": 0.0, "step_overhead_ms": 0.0, "request_step_us": 0.0})
    print("\nPart 3b: short prompts, two GPUStack rows at c=4 on one H100: the front end (TTFT minus the prompt's "
          "step) each implies, ms")
    bounds = {}
    for row in ttft_rows():
        if row["id"] not in ("gs-q8b-h100-sharegpt-c4", "gs-gptoss120b-h100-sharegpt-c4"):
            continue
        shape = wf._replay(row)
        isl, osl, c = _typical_isl(row), _osl(row), int(row["load"]["max_concurrency"])
        steps = []
        for cal in (ideal, full):
            perf = wf.row_perf(row, wf._model_dir(str(row["model"])), cal, shape.topology)
            point = perf.aggregated_point(shape.topology, c, isl=isl, osl=osl)
            steps.append(perf._mixed(shape.topology, isl, osl, 1)(point.decode_requests,
                                                                  min(float(isl), point.chunk_tokens)).step_ms)
        ttft = float(row["measured"]["ttft_ms"]["p50"])
        bounds[row["id"]] = (ttft - steps[1], ttft - steps[0])
        print(f"  {row['id']:34s} TTFT p50 {ttft:5.1f}; prompt step {steps[0]:5.1f} (peak rates) .. {steps[1]:5.1f} "
              f"(class fit) -> front end {ttft - steps[1]:5.1f} .. {ttft - steps[0]:5.1f}")
    (lo_a, hi_a), (lo_b, hi_b) = bounds["gs-q8b-h100-sharegpt-c4"], bounds["gs-gptoss120b-h100-sharegpt-c4"]
    verdict = "they do not" if lo_a > hi_b or lo_b > hi_a else "they do"
    print(f"  one request_overhead_ms for both needs the ranges to meet: {verdict} "
          f"(gap {max(lo_a - hi_b, lo_b - hi_a):.1f} ms)")


def pinned_by(cals: wf.Calibrations) -> None:
    """Which fixed-length rows each fitted factor moves most (what pins it in the class fit)."""
    replayer = cals.replayer
    _, hopper, full = hopper_class(cals)
    base = fidelity.score(replayer, hopper, {r.gpu: full for r in hopper})
    print("\nPart 4: what pins each factor of the Hopper class fit: the fixed-length figures a 10% change of it "
          "moves most (d log figure / d log factor; tput = tok/s/GPU, user = tok/s/user, ttft = TTFT, weight 0.5)")
    for name in fidelity.FIT_FACTORS:
        moved = full.model_copy(update={name: getattr(full, name) * 1.1})
        out = []
        for a, b in zip(base, fidelity.score(replayer, hopper, {r.gpu: moved for r in hopper}), strict=True):
            out.append((abs(b.tput_log_ratio - a.tput_log_ratio), f"{a.row.id} tput"))
            if a.user_log_ratio is not None and b.user_log_ratio is not None:
                out.append((abs(b.user_log_ratio - a.user_log_ratio), f"{a.row.id} user"))
            if a.row.ttft_ms and a.row.load_kind == "closed":
                out.append((abs(math.log(b.prediction.ttft_ms / a.prediction.ttft_ms)), f"{a.row.id} ttft"))
        top = sorted(out, reverse=True)[:4]
        print(f"  {name:26s} {getattr(full, name):7.3g}  " + ", ".join(f"{what} {d / math.log(1.1):.2f}"
                                                                       for d, what in top if d > 1e-4))


def floor_on_fixed(cals: wf.Calibrations) -> None:
    """The in-sample floor's TTFT-p50 calibration (fitted on the replayed TTFT p50 rows) on the fixed-length rows."""
    stored = json.loads(FLOOR.read_text())["fits"]["joint"]["TTFT p50"]
    replayer = cals.replayer
    _, hopper, full = hopper_class(cals)
    floor = Calibration.model_validate(stored)
    print("\nPart 5: the calibration that fits the 12 TTFT p50 rows best (benchmarks/workload_floor.py's joint "
          "TTFT p50 fit) on the fixed-length Hopper vLLM rows, in-sample, beside the class fit")
    prefill_only = full.model_copy(update={n: getattr(floor, n) for n in (*SCALED, "prefill_half_tokens",
                                                                          "request_overhead_ms")})
    blog_speed = full.model_copy(update={n: full.factor(n) * BLOG_SPEED for n in SCALED})
    for label, cal in (("class fit (fixed-length rows)", full), ("TTFT p50 floor fit, every factor", floor),
                       ("class fit, floor's prefill factors", prefill_only),
                       (f"class fit, prefill x{BLOG_SPEED:g} (the blog's s)", blog_speed)):
        scored = fidelity.score(replayer, hopper, {r.gpu: cal for r in hopper})
        print("  " + fidelity.summary(label, scored))
    print("  " + ", ".join(f"{n}={floor.factor(n):.3g}" for n in (*SCALED, "prefill_half_tokens",
                                                                   "request_overhead_ms")))


class _StackCalibrations:
    """wf.Calibrations' interface, answering every row with one calibration (the stack split's experiment)."""

    def __init__(self, cal: Calibration) -> None:
        self.cal = cal

    def held_out(self, gpu: str, source: str) -> tuple[Calibration, str]:
        return self.cal, f"hopper, vLLM >= {NEW_STACK[0]}.{NEW_STACK[1]}"


def stack_split(cals: wf.Calibrations) -> None:
    """Not the shipped model: the Hopper class split by vLLM version, the blog rows predicted by the newer half."""
    replayer = cals.replayer
    hopper = hopper_class(cals).hopper
    new = [r for r in hopper if fidelity._version(r.engine_version) >= NEW_STACK]
    cal = fidelity.fit_class(replayer, new, fidelity.PRIORS["hopper"])
    print(f"\nPart 6 (an experiment, not the shipped model): the Hopper class fitted only on its vLLM >= "
          f"{NEW_STACK[0]}.{NEW_STACK[1]} rows ({len(new)} rows of {len({r.source for r in new})} sources: "
          f"{', '.join(sorted({r.source for r in new}))}), the blog rows (vLLM not stated, posted 2026-04) "
          "replayed with it")
    print("  " + ", ".join(f"{n}={cal.factor(n):.3g}" for n in (*SCALED, "prefill_half_tokens", "hbm_efficiency",
                                                                 "request_overhead_ms")))
    print(f"  (priors: prefill_flop_efficiency={fidelity.PRIORS['hopper'].prefill_flop_efficiency:g}, "
          f"prefill_half_tokens={fidelity.PRIORS['hopper'].prefill_half_tokens:g}; these rows move prefill little, "
          "Part 2's ix sensitivity)")
    errors = []
    for row in ttft_rows():
        shipped = wf.replay_row(row, cals)
        scored = wf.replay_row(row, _StackCalibrations(cal)) if row["id"].startswith("vb-") else shipped
        errors.append(abs(scored.errors["ttft_p50"]))
        print(f"  {row['id']:34s} " + "  ".join(
            f"{k} x{math.exp(shipped.errors[k]):.2f}" + (f" -> x{math.exp(scored.errors[k]):.2f}"
                                                        if scored is not shipped else "")
            for k in sorted(scored.errors) if k in ("ttft_p50", "itl_p50", "output_tok_s_per_gpu")))
    print(f"  TTFT p50 median error over the {len(errors)} rows with the blog rows so predicted: "
          f"{_pct(statistics.median(errors)):.1f}%, worst x{math.exp(max(errors)):.2f}")


def main() -> int:
    cals = wf.Calibrations()
    breakdown(cals)
    implied(cals)
    matched_pair(cals)
    short_pair(cals)
    long_decode_pair(cals)
    pinned_by(cals)
    floor_on_fixed(cals)
    stack_split(cals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
