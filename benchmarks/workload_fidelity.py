"""Fidelity of the workload layer (tuner/perf/_traffic.py) on published runs with a length mix or shared prefixes.

Replays benchmarks/data/public_workload_measurements.yaml: ShareGPT runs (GPUStack's performance lab), shared-prefix
multi-replica traffic at a request rate behind a prefix-aware or a random router (llm-d), long random prompts at a
fixed concurrency (vLLM's FP8 KV-cache post). Each row is predicted with its GPU class's calibration fitted by
benchmarks/fidelity.py on the fixed-length table WITHOUT the row's source (held out), and scored on what the source
reports: throughput, TTFT mean/p50/p90/p99 and TPOT/ITL mean/p50/p90/p99. Errors are exp(|log(pred/measured)|) - 1.

TPOT and ITL are scored on the definition of the tool that measured the row (the figure names follow `vllm bench
serve`): `tpot_*` is per request, (e2e - TTFT) / (output tokens - 1), and is scored against the replay's per-request
ITL (AIPerf's definition, `ReplayReport.itl_ms`); `itl_*` from `vllm bench serve` (GPUStack, the vLLM blog) is every
gap between two streamed chunks, pooled over the requests (vllm/benchmarks/lib/endpoint_request_func.py appends one
gap per SSE event that carries `choices`; vllm/benchmarks/serve.py `calculate_metrics` pools them, `itls +=
output.itl`, and takes np.mean / np.median / np.percentile), scored against the replay's token gaps
(`ReplayReport.token_gap_ms`, tuner/replay/_gaps.py). A row that reports both is scored on both. Not modelled: the
chat endpoint's role-only first event (vLLM's chat serving sends it just before the first token's, so `--backend
openai-chat` logs one ~0 ms gap per request: about 1 / output tokens off the mean, nothing at p50/p99 past 100
tokens). The analytic model gives a per-request ITL and a mean time per token, not the gaps' distribution: it is
scored on TPOT and on the ITL mean only, and says so.

What the rows do not say is assumed, and printed as such:
- ShareGPT's length spread (no source reports it): lognormal with the run's mean lengths and a coefficient of
  variation of 1, capped as `vllm bench serve` samples ShareGPT (prompts <= 1024 tokens, prompt + output <= 2048).
- the vLLM post's "+-15%" lengths: uniform over +-15% (a histogram).
- llm-d's per-replica load: the offered rate split evenly over the replicas; "precise" routing is cache-aware,
  "random" is not.
TPOT (vllm bench's per-request figure) is compared with the model's per-request ITL sketch. llm-d's runs were measured
with inference-perf between July and November 2025, which took a timestamp for every line of the SSE stream, the
blank line closing each event included (LINE_TIMESTAMP_SOURCES): its ITL p50 is 0 ms and its ITL mean is the decode
time over 2n + 1 gaps, half the per-token ITL. The model's ITL is turned into that figure (`reported_itl_mean`), and
only the ITL mean is scored there. The model is given the per-pod KV capacity llm-d states (vLLM's startup log).

Not scored as figures, and why: bursts (every prompt sent at once) are finite runs, not a steady state the workload
layer describes (the fixed-length table replays them with RooflineModel.predict_burst and marks these runs unscored);
an open-loop level the model calls saturated has no latency to compare. For rate rows the benchmark instead checks
the saturation verdict against the source: measured saturated when its TTFT p90 exceeds 10 s (the queue grew through
the stage), keeping up when TTFT p90 < 2 s and it delivered >= 75% of the offered output tokens, else ambiguous
(the stage was too short to tell).

Last, the real CPU trace trial (benchmarks/data/cpu_trace_trial.yaml, measured by benchmarks/real_trial_cpu.py
--trace builtin): the simulator re-predicts that request and its p90 TTFT/ITL error is printed. The catalog's `cpu`
device is not calibrated for this machine (one trial is one point, too few to fit a CPU class and hold anything
out), so the error is printed as it comes.

With --replay, every scored row is also replayed event by event through vLLM's scheduler (tuner/replay: the same
held-out calibration, the row's replicas behind the router it names, Poisson arrivals at the row's rate or its
closed loop, 1,000 sampled requests with a 10% warm-up) and scored the same way, beside the analytic figures, and
#45's targets are printed as met or not met. llm-d's shared_prefix traffic is replayed as inference-perf sent it: its
num_groups x num_prompts_per_group prompts, generated once and cycled in a shuffled order (so a whole prompt recurs),
and its stages as inference-perf ran them (STAGE_IDLE_S): the source's warm-up stage, drained, then the row's stage
alone, int(rate x duration) requests at the row's rate (constant or Poisson, as the row says) from an idle server,
measured to its last answer; such a finite stage is called saturated as the source's is (TTFT p90 > 10 s), since
its requests in flight rise through a stage shorter than a request whatever the load.

Side by side (with --replay): NVIDIA aisimulate's predictions of the same rows on the replay's own request stream
(benchmarks/data/aisimulate.yaml, written with the exact commands by benchmarks/aisimulate_runs.py, so this runs
without aisimulate installed) are scored the same way on the rows both run.

How far these targets can go with this model at all: benchmarks/workload_floor.py fits the calibration on the
evaluated figures themselves (the in-sample floor) and prints it beside the held-out figures, with the rows' noise.

Run: .venv/bin/python benchmarks/workload_fidelity.py [--rows] [--replay]
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fidelity

from tuner.errors import TopotuneError
from tuner.hardware import get_gpu
from tuner.metrics import ServingMetrics
from tuner.models import load_model
from tuner.perf import Calibration, RooflineModel, predict_traffic
from tuner.router import RouterPolicy
from tuner.topology import Role, Topology
from tuner.workload import HistogramLengths, LogNormalLengths, PrefixSharing, Workload

if TYPE_CHECKING:
    from tuner.replay import ReplayReport

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "benchmarks" / "data" / "public_workload_measurements.yaml"
SHAREGPT_CV = 1.0  # assumed: no source reports ShareGPT's spread
SHAREGPT_MAX_PROMPT = 1024  # vllm bench serve's ShareGPT sampler drops longer prompts
SHAREGPT_MAX_TOTAL = 2048
#: Sources measured with inference-perf between its commits 23b52d0 (2025-07-11) and 3631096 (2025-11-14). Its
#: streaming reader (inference_perf/apis/completion.py `process_response`) iterates the SSE body line by line and
#: takes a timestamp for every line, the blank line closing each `data:` event included; its report
#: (inference_perf/reportgen/base.py `summarize_requests`) takes ITL over every gap between consecutive timestamps.
#: Each token therefore adds a ~0 ms gap: the reported ITL mean is a request's decode time over 2n + 1 gaps (n
#: tokens and the [DONE] event), half the per-token ITL, and its p50 is 0 ms. Fixed upstream in 3631096 (one
#: timestamp per event) and PR #566.
LINE_TIMESTAMP_SOURCES = frozenset({"llmd-kvcache-37cap-llama70b-h100", "llmd-kvcache-73cap-qwen3-32b-h100"})
#: TPOT / ITL figures pooled by #45's ITL target: per request (tpot_*) and the tools' ITL (itl_*, see the docstring)
TPOT_KEYS = ("tpot_mean", "tpot_p50", "tpot_p90", "tpot_p99")
ITL_KEYS = ("itl_mean", "itl_p50", "itl_p90", "itl_p99")
HASH_BLOCK_TOKENS = 400  # the cycled-prompt traces' hash blocks (a multiple of vLLM's 16-token blocks)
#: inference-perf runs each stage of its load ladder to the end: after a stage's duration its load generator waits
#: until every request of the stage has finished before the next stage starts (inference_perf/loadgen/
#: load_generator.py at 1ccc48b, `mp_run`: "Wait until all requests are finished processing"; at 23b52d0 each
#: worker's STAGE_END awaits its in-flight requests; the one-process `run` leaves its TaskGroup only when every request
#: is done), then sleeps `load.interval` (1 s by default). So llm-d's stages did not overlap: each started on an idle
#: server (its prefix cache warm) and ended with its own drain, and a stage's row is its requests alone. The replay
#: leaves this long idle between the warm-up and the stage (that the warm-up drained in it is checked).
STAGE_IDLE_S = 3600.0
#: a rate row is measured saturated past this TTFT p90 (its queue grew through the stage; `measured_verdict`)
SATURATED_TTFT_P90_MS = 10_000.0


@dataclass(frozen=True)
class Replay:
    """A row as the model sees it: instance topology, replicas, workload, what was assumed."""

    topology: Topology
    replicas: int
    workload: Workload
    cache_aware: bool
    assumed: str


@dataclass(frozen=True)
class Scored:
    row: dict
    prediction: ServingMetrics | None
    errors: dict[str, float]  # metric -> log(pred / measured)
    note: str
    saturated: bool | None = None  # open-loop rows: the model's verdict


def measured_verdict(row: dict) -> str:
    """saturated / keeping up / ambiguous, from what an open-loop stage delivered (see the module docstring)."""
    m, load = row["measured"], row["load"]
    ttft_p90 = (m.get("ttft_ms") or {}).get("p90", 0.0)
    offered = float(load["request_rate"]) * float(row["workload"]["osl_nominal"])
    if ttft_p90 > SATURATED_TTFT_P90_MS:
        return "saturated"
    if ttft_p90 < 2_000 and float(m.get("output_tok_s", 0.0)) >= 0.75 * offered:
        return "keeping up"
    return "ambiguous"


def _model_dir(name: str) -> Path | None:
    for candidate in (REPO / name, REPO / "benchmarks" / "data" / "models" / name.split("/")[-1].lower(),
                      REPO / "examples" / "models" / name.split("/")[-1].lower()):
        if (candidate / "config.json").exists():
            return candidate
    return None


def _replay(row: dict) -> Replay:
    w, load = row["workload"], row["load"]
    topology_text = str(row["topology"])
    replicas = 1
    match = re.match(r"^(\d+)\s*x\s*(TP\d+)", topology_text)
    if match:
        replicas, topology_text = int(match[1]), match[2]
    topo = Topology.parse(topology_text, role=Role.BOTH, max_num_seqs=1024)
    assumed = []
    if "sharegpt" in str(w.get("dataset", "")).lower():
        isl, osl = float(w["isl_mean"]), float(w["osl_mean"])
        inputs = LogNormalLengths(mean=isl, stddev=SHAREGPT_CV * isl, max_tokens=SHAREGPT_MAX_PROMPT)
        outputs = LogNormalLengths(mean=osl, stddev=SHAREGPT_CV * osl, max_tokens=SHAREGPT_MAX_TOTAL - 1)
        assumed.append(f"ShareGPT spread lognormal CV {SHAREGPT_CV:g}")
        prefix = None
    elif "shared_prefix_tokens" in w:
        inputs = int(w["isl_nominal"])
        outputs = int(w["osl_nominal"])
        prefix = PrefixSharing(shared_tokens=int(w["shared_prefix_tokens"]), num_prefixes=int(w["num_groups"]))
        assumed.append("rate split evenly over replicas")
    else:
        isl, osl = float(w["isl_nominal"]), float(w["osl_nominal"])
        inputs = HistogramLengths(bins=tuple((round(isl * f), 1.0) for f in np.linspace(0.85, 1.15, 7)))
        outputs = HistogramLengths(bins=tuple((round(osl * f), 1.0) for f in np.linspace(0.85, 1.15, 7)))
        assumed.append("+-15% uniform")
        prefix = None
    if load["kind"] == "rate":
        shape = {"arrival": "poisson", "request_rates": (float(load["request_rate"]) / replicas,)}
    elif load["kind"] == "closed":
        shape = {"concurrency": (int(load["max_concurrency"]),)}
    else:
        raise ValueError("a burst is a finite run, not a steady state (not scored here)")
    workload = Workload.model_validate({"input_tokens": inputs, "output_tokens": outputs, "prefix": prefix, **shape})
    router = str(row.get("router", ""))
    return Replay(topo, replicas, workload, cache_aware=not router.startswith("random"), assumed="; ".join(assumed))


def reported_itl_mean(row: dict, decode_ms: float, tokens: float, requests: float) -> float:
    """The ITL mean the row's tool reports for `requests` answers of `tokens` output tokens in all, decoded in
    `decode_ms` (first to last token, summed): per token gap, or inference-perf's per-line gaps
    (LINE_TIMESTAMP_SOURCES: 2 per token and 1 for [DONE])."""
    if row["source"] in LINE_TIMESTAMP_SOURCES:
        return decode_ms / (2 * tokens + requests)
    return decode_ms / (tokens - requests)


def stated_kv_tokens(row: dict) -> int | None:
    """The per-replica KV-cache tokens the source states (vLLM's startup log), when it does."""
    match = re.search(r"KV cache ([\d,]+) tokens", str(row["topology"]))
    return int(match[1].replace(",", "")) if match else None


def row_perf(row: dict, model_dir: Path, cal: Calibration, topology: Topology) -> RooflineModel:
    """The row's model: its GPU, the held-out calibration, and the KV capacity the source states (if any)."""
    gpu = get_gpu(str(row["gpu"]))
    model = load_model(model_dir)
    tokens = stated_kv_tokens(row)
    if tokens is None:
        return RooflineModel(model, gpu, cal)
    layout = RooflineModel(model, gpu, cal).state(topology, Role.BOTH, isl=1024, osl=128).memory.layout
    pages = -(-tokens // layout.block_size) + 1  # vLLM's null block
    return RooflineModel(model, gpu, cal, kv_cache_memory_bytes=pages * layout.page_size_bytes * layout.group_size)


@dataclass(frozen=True)
class StageTrace:
    """One inference-perf stage as a trace (`stage_trace`): where it is, how many requests warm the cache first,
    how many the stage sends, and when the warm-up's last and the stage's first request are sent."""

    path: Path
    warmup_requests: int
    stage_requests: int
    warmup_end_ms: float
    stage_start_ms: float

    @property
    def warmup_share(self) -> float:
        """ReplayPlan's warm-up share that makes exactly the warm-up's requests unmeasured (it rounds up)."""
        return (self.warmup_requests - 0.5) / (self.warmup_requests + self.stage_requests)


def stage_trace(row: dict, path: Path, seed: int = 0) -> StageTrace:
    """One stage of llm-d's inference-perf ladder as a trace, as the source ran it (STAGE_IDLE_S says why): the
    source's warm-up stage (the rate and duration its `ramp` states; else one cycle of the prompts at the row's
    rate), idle while it drains, then the stage alone: int(rate x duration) requests at the row's rate (constant or
    Poisson), which are what the stage's report is made of. The prompts are num_groups x num_prompts_per_group,
    generated once (a shared prefix per group, a question per prompt) and shuffled; every stage sends them from the
    first, cycling (inference_perf/datagen/shared_prefix_datagen.py `get_request(n)`, n counted per stage)."""
    w, load = row["workload"], row["load"]
    groups, per = int(w["num_groups"]), int(w["num_prompts_per_group"])
    shared, isl, osl = int(w["shared_prefix_tokens"]), int(w["isl_nominal"]), int(w["osl_nominal"])
    rate = float(load["request_rate"])
    rng = np.random.default_rng(seed)
    order = rng.permutation(groups * per).tolist()
    shared_ids = shared // HASH_BLOCK_TOKENS
    own_ids = -(-isl // HASH_BLOCK_TOKENS) - shared_ids
    warm = re.search(r"warm-up ([\d.]+) rps x ([\d.]+) s", str(load.get("ramp", "")))
    warm_rps, warm_n = (float(warm[1]), int(float(warm[1]) * float(warm[2]))) if warm else (rate, len(order))
    stage_n = int(rate * float(load["stage_duration_s"]))  # load_generator.py: int(stage.rate * stage.duration)
    lines: list[str] = []

    def send(n: int, t: float) -> None:
        prompt = order[n % len(order)]
        group = prompt // per
        ids = [group * shared_ids + j for j in range(shared_ids)]
        ids += [groups * shared_ids + prompt * own_ids + j for j in range(own_ids)]
        lines.append(f'{{"timestamp": {t:.3f}, "input_length": {isl}, "output_length": {osl}, "hash_ids": {ids}}}')

    def sends(count: int, rps: float, t: float) -> float:
        """`count` sends from `t` at `rps`; returns the last one's time."""
        last = t
        for n in range(count):
            send(n, t)
            last = t
            t += 1000.0 / rps if load.get("arrival") == "constant" else float(rng.exponential(1000.0 / rps))
        return last

    warmup_end = sends(warm_n, warm_rps, 0.0)
    stage_start = warmup_end + STAGE_IDLE_S * 1e3
    sends(stage_n, rate, stage_start)
    path.write_text("\n".join(lines) + "\n")
    return StageTrace(path, warm_n, stage_n, warmup_end, stage_start)


def drained(report: ReplayReport, trace: StageTrace) -> bool:
    """Whether the replay's deployment was idle (nothing waiting or running) at some time between the warm-up's last
    send and the stage's first, as inference-perf's next stage starts only then."""
    return any(p.waiting + p.running == 0 for p in report.timeline
               if trace.warmup_end_ms <= p.t_s * 1e3 < trace.stage_start_ms)


def measuring_tool(row: dict) -> str | None:
    """The benchmark client that measured the row, which decides what its ITL means: inference-perf with a timestamp
    per SSE line (LINE_TIMESTAMP_SOURCES), `vllm bench serve` where the row or its source says so, else None."""
    if row["source"] in LINE_TIMESTAMP_SOURCES:
        return "inference-perf"
    what = _sources().get(row["source"], {}).get("what", "")
    text = f"{row.get('bench_command', '')} {row.get('workload', '')} {what}"
    return "vllm bench serve" if "vllm bench serve" in text else None


@functools.cache
def _sources() -> dict[str, dict]:
    return yaml.safe_load(TABLE.read_text())["sources"]


def _measured(row: dict) -> dict[str, float]:
    """The row's figures by scoring key: tok/s, ttft_*, tpot_* (per request), itl_* (the tool's ITL: token gaps
    for `vllm bench serve`, the mean only for inference-perf's per-line gaps, none for an unknown tool)."""
    m = row["measured"]
    out: dict[str, float] = {}
    gpus = int(row.get("gpus", 1))
    if "total_tok_s" in m:
        out["tok_s_per_gpu"] = float(m["total_tok_s"]) / gpus
    elif "output_tok_s" in m and row["load"]["kind"] != "rate":  # llm-d stages end mid-request: not a rate
        out["output_tok_s_per_gpu"] = float(m["output_tok_s"]) / gpus
    tool = measuring_tool(row) if "itl_ms" in m else None
    for key, name in (("ttft_ms", "ttft"), ("tpot_ms", "tpot"), ("itl_ms", "itl")):
        for stat, value in (m.get(key) or {}).items():
            if key == "itl_ms" and not (tool == "vllm bench serve" or (tool == "inference-perf" and stat == "mean")):
                continue  # inference-perf's per-line p50 is 0 ms; an unknown tool's ITL has no known definition
            if isinstance(value, int | float) and value > 0:
                out[f"{name}_{stat}"] = float(value)
    return out


def _predicted(m: ServingMetrics, key: str) -> float | None:
    """The analytic model's figure for a scoring key; None for the token gaps' percentiles (vllm bench serve's ITL
    p50/p90/p99), which a steady state does not give: it has a per-request ITL sketch and a mean time per token (the
    pooled gaps' mean: every request's decode time over its gaps, summed)."""
    if key == "tok_s_per_gpu":
        return m.total_tok_s_per_gpu
    if key == "output_tok_s_per_gpu":
        return m.output_tok_s_per_gpu
    metric, stat = key.split("_", 1)
    if metric == "ttft":
        return m.ttft_ms_mean if stat == "mean" else m.ttft_ms_at(stat)
    if stat == "mean":
        return m.itl_ms_mean
    return m.itl_ms_at(stat) if metric == "tpot" else None


def same_source(workload_sources: dict[str, dict], fixed_sources: dict[str, dict]) -> dict[str, frozenset[str]]:
    """Each workload source with the fixed-length table's sources of the same published page: the two tables name
    some pages differently (GPUStack's GLM-4.x/H200 page is `gpustack-glm-4x-h200` here and `gpustack-glm-4.6-h200`
    there), and holding a source out must hold out its rows under either name."""
    pages: dict[str, set[str]] = {}
    for name, s in fixed_sources.items():
        if s.get("page"):
            pages.setdefault(str(s["page"]).rstrip("/"), set()).add(name)
    return {name: frozenset({name} | pages.get(str(s.get("page") or "-").rstrip("/"), set()))
            for name, s in workload_sources.items()}


class Calibrations:
    """The class calibration fitted on the fixed-length table without one source (cached per class, source)."""

    def __init__(self) -> None:
        fixed_sources, self.rows = fidelity.load_table(fidelity.TABLE)
        self.replayer = fidelity.Replayer()
        self.same = same_source(yaml.safe_load(TABLE.read_text())["sources"], fixed_sources)
        self._fits: dict[tuple[str, frozenset[str]], Calibration] = {}

    def key(self, gpu: str, source: str) -> tuple[str, frozenset[str]]:
        """The GPU class and the fixed-length sources held out for a row: rows with equal keys share a fit."""
        cls = fidelity.gpu_class(self.replayer.gpu(gpu))
        held = self.same.get(source, frozenset({source}))
        return cls, frozenset(s for s in held if any(r.source == s for r in self.rows))

    def held_out(self, gpu: str, source: str) -> tuple[Calibration, str]:
        cls, held = self.key(gpu, source)
        if (cls, held) not in self._fits:
            train = [r for r in self.rows if r.is_vllm and r.source not in held
                     and fidelity.gpu_class(self.replayer.gpu(r.gpu)) == cls]
            self._fits[(cls, held)] = fidelity.fit_class(self.replayer, train, fidelity.PRIORS[cls])
        return self._fits[(cls, held)], cls


class NotPredicted(Exception):
    """A row the model cannot take at all (no config.json for its model, a shape it cannot replay): scored as not
    predicted with `reason`, not an error of the run."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def scored(self, row: dict) -> Scored:
        return Scored(row, None, {}, self.reason)


def _held_out_model(row: dict, cals: Calibrations) -> tuple[Replay, RooflineModel, str]:
    """The row's shape, its model with the calibration fitted without its source, and that fit's GPU class; raises
    NotPredicted saying why there is none."""
    model_dir = _model_dir(str(row["model"]))
    if model_dir is None:
        raise NotPredicted(f"no config.json for {row['model']}")
    try:
        shape = _replay(row)
    except (KeyError, ValueError) as exc:
        raise NotPredicted(f"cannot replay: {exc}") from exc
    cal, cls = cals.held_out(str(row["gpu"]), str(row["source"]))
    return shape, row_perf(row, model_dir, cal, shape.topology), cls


def score_row(row: dict, cals: Calibrations) -> Scored:
    try:
        replay, perf, cls = _held_out_model(row, cals)
    except NotPredicted as exc:
        return exc.scored(row)
    try:
        curve = predict_traffic(perf, replay.topology, Role.BOTH, replay.workload, cache_aware=replay.cache_aware,
                                replicas=replay.replicas)
    except TopotuneError as exc:
        return Scored(row, None, {}, f"the model refuses the layout: {exc.message[:90]}")
    if not curve.points:
        sat = curve.saturated[0]
        return Scored(row, None, {}, f"predicted saturated: {sat.describe()}", saturated=True)
    m = curve.points[0]
    figures = {k: _predicted(m, k) for k in _measured(row)}
    if "itl_mean" in figures and row["source"] in LINE_TIMESTAMP_SOURCES:
        osl = float(row["workload"]["osl_nominal"])
        figures["itl_mean"] = reported_itl_mean(row, m.itl_ms_mean * (osl - 1), osl, 1.0)
    errors = {k: math.log(f / v) for k, v in _measured(row).items() if (f := figures[k]) is not None and f > 0}
    hit = f"; predicted prefix hits {m.prefix_hit_share:.0%}" if m.prefix_hit_share else ""
    return Scored(row, m, errors, f"{cls} fit without {row['source']}; assumed: {replay.assumed or 'nothing'}{hit}",
                  saturated=False if replay.workload.open_loop else None)


def replay_row(row: dict, cals: Calibrations, requests: int = 1000) -> Scored:
    """The row replayed through the scheduler (tuner/replay) instead of the steady-state formulas."""
    from tuner.deployment import Deployment
    from tuner.replay import ArrivalProcess, ReplayPlan, replay

    try:
        shape, perf, cls = _held_out_model(row, cals)
    except NotPredicted as exc:
        return exc.scored(row)
    load = row["load"]
    arrival = (ArrivalProcess("poisson", rate_rps=float(load["request_rate"])) if load["kind"] == "rate"
               else ArrivalProcess("closed", concurrency=int(load["max_concurrency"])))
    count = max(requests, 4 * arrival.concurrency)
    workload, warmup = shape.workload, 0.1
    tmp = tempfile.TemporaryDirectory()
    stage = None
    if "num_prompts_per_group" in row["workload"] and load["kind"] == "rate":  # an inference-perf stage
        stage = stage_trace(row, Path(tmp.name) / "trace.jsonl")
        workload = Workload.from_trace(stage.path, block_tokens=HASH_BLOCK_TOKENS)
        arrival, count, warmup = ArrivalProcess("trace"), None, stage.warmup_share
    plan = ReplayPlan(deployment=Deployment.single(shape.topology, shape.replicas), workload=workload,
                      arrival=arrival, num_requests=count, warmup_share=warmup,
                      router=RouterPolicy.CACHE_AWARE if shape.cache_aware else RouterPolicy.ROUND_ROBIN)
    try:
        with tmp:
            report = replay(perf, plan)
    except TopotuneError as exc:
        return Scored(row, None, {}, f"the replay refuses: {exc.message[:90]}",
                      saturated=True if load["kind"] == "rate" else None)
    figures = {"tok_s_per_gpu": report.total_tok_s_per_gpu,
               "output_tok_s_per_gpu": report.output_tok_s / report.num_gpus}
    # tpot_*: per request (AIPerf's ITL); itl_*: every streamed chunk's gap, pooled (vllm bench serve's ITL)
    for name, p in (("ttft", report.ttft_ms), ("tpot", report.itl_ms), ("itl", report.token_gap_ms)):
        figures.update({f"{name}_mean": p.mean, f"{name}_p50": p.p50, f"{name}_p90": p.p90, f"{name}_p99": p.p99})
    streamed = [r for r in report.requests if r.output_tokens > 1]
    if row["source"] in LINE_TIMESTAMP_SOURCES:
        figures["itl_mean"] = reported_itl_mean(row, sum(r.e2e_ms - r.ttft_ms for r in streamed),
                                                sum(r.output_tokens for r in streamed), len(streamed))
    errors = {k: math.log(figures[k] / v) for k, v in _measured(row).items() if figures.get(k, 0) > 0}
    saturated = report.queue.grows if load["kind"] == "rate" else None
    note = f"replay, {cls} fit without {row['source']}; prefix hits {report.prefix_hit_share:.0%}"
    if stage is not None:
        # a finite stage from an idle server: its requests in flight rise through a stage shorter than a request
        # whatever the load, so the queue's trend says nothing; judged as the source is (`measured_verdict`)
        saturated = report.ttft_ms.p90 > SATURATED_TTFT_P90_MS
        note += f"; one stage of {stage.stage_requests} requests after {stage.warmup_requests} of warm-up" + (
            "" if drained(report, stage) else f" (NOT drained in {STAGE_IDLE_S:g} s: the stage starts on its backlog)")
    return Scored(row, None, errors, note, saturated=saturated)


def _summary(name: str, group: list[Scored]) -> None:
    print(f"\n{name}: {len(group)} rows, held out by source; median / worst error per metric")
    metrics = sorted({k for s in group for k in s.errors})
    for key in metrics:
        values = [s.errors[key] for s in group if key in s.errors]
        worst = max(values, key=abs)
        print(f"  {key:<22} n={len(values):<3} median {statistics.median(_pct(v) for v in values):6.1f}%  "
              f"worst {_pct(worst):7.1f}% ({'over' if worst > 0 else 'under'})")


def _pooled(group: list[Scored], keys: tuple[str, ...]) -> list[float]:
    return [_pct(s.errors[k]) for s in group for k in keys if k in s.errors]


def itl_parts(group: list[Scored]) -> list[tuple[str, list[float]]]:
    """The ITL target's figures by definition: per request (TPOT), vllm bench serve's token gaps, inference-perf's
    per-line gaps (errors in %)."""
    def of(tool: str, keys: tuple[str, ...]) -> list[float]:
        return _pooled([s for s in group if measuring_tool(s.row) == tool], keys)

    return [("per request: TPOT (vllm bench serve)", _pooled(group, TPOT_KEYS)),
            ("token gaps: ITL mean/p50/p99 (vllm bench serve)", of("vllm bench serve", ITL_KEYS)),
            ("per-line gaps: ITL mean (inference-perf)", of("inference-perf", ITL_KEYS))]


def replay_targets(replayed: list[Scored], analytic: list[Scored], verdicts: list[tuple[Scored, str]]) -> list[str]:
    """#45's targets for the replayed vLLM rows, each printed as met or not met."""
    def line(name: str, value: float, goal: float, unit: str = "%") -> str:
        return f"  {name:<44} {value:6.1f}{unit}  (target <= {goal:.3g}{unit}: {'met' if value <= goal else 'not met'})"

    out = ["\ntargets (#45), vllm rows replayed, held out by source:"]
    ttft = (("TTFT p50 median error", ("ttft_p50",)), ("TTFT p90/p99 median error", ("ttft_p90", "ttft_p99")))
    for name, keys in ttft:
        values = _pooled(replayed, keys)
        out.append(line(f"{name} (n={len(values)})", statistics.median(values), 20))
        out.append(line(f"{name.replace('median', 'worst')} (x)", 1 + max(values) / 100, 2, "x"))
    itl = _pooled(replayed, TPOT_KEYS + ITL_KEYS)
    out.append(line(f"ITL median error, TPOT and ITL (n={len(itl)})", statistics.median(itl), 15))
    for name, values in itl_parts(replayed):
        out.append(f"    {name:<48} n={len(values):<3} median {statistics.median(values):5.1f}%" if values
                   else f"    {name:<48} n=0")
    for key in ("tok_s_per_gpu", "output_tok_s_per_gpu"):
        mine, today = _pooled(replayed, (key,)), _pooled(analytic, (key,))
        if mine and today:
            out.append(line(f"{key} median error (analytic: {statistics.median(today):.1f}%)",
                            statistics.median(mine), statistics.median(today)))
    wrong = [s.row["id"] for s, truth in verdicts if truth == "keeping up" and s.saturated]
    out.append(f"  {'loads called unstable the source kept up with':<44} {len(wrong):6d}   (target 0: "
               f"{'met' if not wrong else 'not met: ' + ', '.join(wrong)})")
    return out


CPU_TRIAL = Path(__file__).resolve().parent / "data" / "cpu_trace_trial.yaml"
TINY_CPU_MODEL = Path(__file__).resolve().parent / "data" / "tiny-cpu-model"


def cpu_trace_trial() -> list[str]:
    """The simulator (the catalog's uncalibrated `cpu` device) on the request of the recorded real CPU trace trial,
    against what that trial measured (each figure's median over the recorded runs): p90 TTFT/ITL errors and the
    prefix-cache hit share."""
    from real_trial_cpu import builtin_trace

    from tuner.backends import TrialRequest, make_backend
    from tuner.deployment import Deployment
    from tuner.topology import Topology
    from tuner.workload import Workload

    row = yaml.safe_load(CPU_TRIAL.read_text())
    with tempfile.TemporaryDirectory() as tmp:
        trace = builtin_trace(Path(tmp) / "trace.jsonl", row["block_tokens"])
        workload = Workload.from_trace(trace, block_tokens=row["block_tokens"], arrival="trace",
                                       request_rates=(row["rate_rps"],), requests_per_level=row["requests"])
        request = TrialRequest(trial_id="cpu-trace", model_path=str(TINY_CPU_MODEL), gpu="cpu",
                               deployment=Deployment.single(Topology.parse(row["topology"],
                                                                           max_num_seqs=row["max_num_seqs"])),
                               workload=workload, artifacts_dir=str(Path(tmp) / "trial"), timeout_s=60)
        points = make_backend("simulated").run(request).points
    measured = {key: float(np.median([run[key] for run in row["runs"]])) for key in row["runs"][0]}
    lines = [f"\nthe real CPU trace trial ({row['source']}; {row['requests']} requests sharing prefixes at "
             f"{row['rate_rps']:g} req/s, {row['topology']}): simulator (catalog `cpu`, not calibrated) vs measured"]
    if not points:
        return [*lines, "  simulator: saturated (no latency)"]
    sim = points[0]
    for key in ("ttft_ms_p90", "itl_ms_p90"):
        predicted, real = getattr(sim, key), measured[key]
        lines.append(f"  {key:<22} simulated {predicted:8.2f}  measured {real:8.2f}  error "
                     f"{_pct(math.log(predicted / real)):6.1f}% ({'over' if predicted > real else 'under'}, "
                     f"x{predicted / real:.2f})")
    lines.append(f"  {'prefix_hit_share':<22} simulated {sim.prefix_hit_share:8.4f}  measured "
                 f"{measured['prefix_hit_share']:8.4f}")
    return lines


AISIMULATE = Path(__file__).resolve().parent / "data" / "aisimulate.yaml"


@dataclass(frozen=True)
class PeerRun:
    """aisimulate's stored prediction of one row (benchmarks/aisimulate_runs.py): its figures by metric key, as
    `_measured` names them (its per-request ITL as tpot_*), or why it has none; `like_for_like` is False where it
    could not take the row's router."""

    id: str
    figures: dict[str, float]
    like_for_like: bool = True
    why: str = ""
    saturated: bool | None = None  # a rate row: whether aisimulate's queue grows (the replay's rule)


def load_aisimulate(path: Path = AISIMULATE) -> tuple[str, dict[str, PeerRun]]:
    """aisimulate's version and its stored runs by row id (TTFT/ITL over the post-warm-up window)."""
    data = yaml.safe_load(path.read_text())
    runs = {}
    for e in data["rows"]:
        if "why" in e:
            runs[e["id"]] = PeerRun(e["id"], {}, why=str(e["why"]))
            continue
        # aisimulate's ITL is per request (AIPerf's): scored as TPOT; it gives no token gaps
        figures = {f"{key}_{stat}": float(v) for name, key in (("ttft", "ttft"), ("itl", "tpot"))
                   for stat, v in e["window"][f"{name}_ms"].items()}
        runs[e["id"]] = PeerRun(e["id"], figures, like_for_like=bool(e.get("router_represented", True)),
                                saturated=e["window"].get("queue_grows"))
    return str(data["aisimulate"]), runs


def peer_errors(row: dict, run: PeerRun) -> dict[str, float]:
    """log(aisimulate / measured) on the row's TTFT and TPOT figures; on inference-perf's per-line rows, aisimulate's
    per-token ITL mean is turned into the figure that tool reported, as the model's and the replay's are. vllm bench
    serve's ITL (token gaps) is not compared: aisimulate reports per-request ITL only."""
    figures = dict(run.figures)
    if figures.get("tpot_mean", 0) > 0 and row["source"] in LINE_TIMESTAMP_SOURCES:
        osl = float(row["workload"]["osl_nominal"])
        figures["itl_mean"] = reported_itl_mean(row, figures["tpot_mean"] * (osl - 1), osl, 1.0)
    return {k: math.log(figures[k] / v) for k, v in _measured(row).items()
            if k.startswith(("ttft_", "tpot_", "itl_")) and figures.get(k, 0) > 0}


def _row_ttft(errors: dict[str, float]) -> float:
    """A row's TTFT error: the mean |log ratio| over the TTFT figures its source reports."""
    values = [abs(v) for k, v in errors.items() if k.startswith("ttft_")]
    return sum(values) / len(values) if values else math.nan


def _side_by_side_table(pairs: list[tuple[Scored, dict[str, float]]]) -> list[str]:
    lines = [f"  {'metric':<12} {'n':>3}   {'replay median':>13} {'worst':>9}   {'aisimulate median':>17} "
             f"{'worst':>9}   closer (rows)"]
    for key in sorted({k for s, e in pairs for k in e if k in s.errors}):
        both = [(s.errors[key], e[key]) for s, e in pairs if key in s.errors and key in e]
        mine, theirs = [a for a, _ in both], [b for _, b in both]
        wins = sum(abs(a) < abs(b) for a, b in both)
        lines.append(f"  {key:<12} {len(both):>3}   {statistics.median(_pct(v) for v in mine):12.0f}% "
                     f"{_worst(mine):>10}   {statistics.median(_pct(v) for v in theirs):16.0f}% "
                     f"{_worst(theirs):>10}   replay {wins}, aisimulate {len(both) - wins}")
    return lines


def _peer_verdicts(pairs: list[tuple[Scored, dict[str, float]]], runs: dict[str, PeerRun]) -> str:
    """Queue verdicts on the rate rows both run, against the source's clear ones (measured_verdict)."""
    clear = [(s, measured_verdict(s.row) == "saturated") for s, _ in pairs
             if s.saturated is not None and runs[s.row["id"]].saturated is not None
             and measured_verdict(s.row) != "ambiguous"]
    mine = sum(bool(s.saturated) == truth for s, truth in clear)
    theirs = sum(bool(runs[s.row["id"]].saturated) == truth for s, truth in clear)
    return (f"  queue verdicts on the rate rows, against the source's {len(clear)} clear ones: replay {mine} agree, "
            f"aisimulate {theirs}")


def _worst(values: list[float]) -> str:
    worst = max(values, key=abs)
    return f"{_pct(worst):.0f}% {'o' if worst > 0 else 'u'}"


def _side_by_side_rows(pairs: list[tuple[Scored, dict[str, float]]]) -> list[str]:
    """Per row: pred / measured for each TTFT figure its source reports, the replay's then aisimulate's."""
    lines = ["  per row, pred/measured (replay | aisimulate):"]
    for s, e in pairs:
        cells = [f"{k} x{math.exp(s.errors[k]):.2f} | x{math.exp(e[k]):.2f}" for k in sorted(e)
                 if k.startswith("ttft_") and k in s.errors]
        lines.append(f"    {s.row['id']:<34} {'   '.join(cells)}")
    return lines


def aisimulate_side_by_side(replayed: list[Scored], path: Path = AISIMULATE, rows: bool = False) -> list[str]:
    """The replay and aisimulate scored on the rows both run, on the same request stream: per metric median and
    worst error, and per row which one is closer on TTFT."""
    if not path.exists():
        return [f"\naisimulate: no stored runs ({path.name}; benchmarks/aisimulate_runs.py --run writes them)"]
    version, runs = load_aisimulate(path)
    pairs = [(s, peer_errors(s.row, runs[s.row["id"]])) for s in replayed
             if s.errors and s.row["id"] in runs and runs[s.row["id"]].like_for_like and runs[s.row["id"]].figures]
    pairs = [(s, e) for s, e in pairs if e]
    lines = [f"\naisimulate {version} side by side with the replay ({path.name}: the replay's own request stream, "
             f"same warm-up; error = max(pred/meas, meas/pred) - 1, worst o(ver)/u(nder)): {len(pairs)} rows both "
             f"run; aisimulate's per-request ITL is scored as TPOT, vllm bench serve's ITL (token gaps) is not "
             f"compared", *_side_by_side_table(pairs), *(_side_by_side_rows(pairs) if rows else [])]
    closer = {"replay": [], "aisimulate": []}
    for s, e in pairs:
        mine, theirs = _row_ttft(s.errors), _row_ttft(e)
        if not (math.isnan(mine) or math.isnan(theirs)):
            closer["replay" if mine < theirs else "aisimulate"].append(s.row["id"])
    for tool, ids in closer.items():
        lines.append(f"  TTFT closer with {tool} on {len(ids)} rows: {', '.join(ids) or '-'}")
    lines.append(_peer_verdicts(pairs, runs))
    missing = [s.row["id"] for s in replayed if s.errors and s.row["id"] not in runs]
    if missing:
        lines.append(f"  replayed rows with no stored aisimulate run ({len(missing)}; benchmarks/aisimulate_runs.py "
                     f"--run --only ID... adds them): {', '.join(missing)}")
    unlike = [i for i, r in runs.items() if r.figures and not r.like_for_like]
    if unlike:
        lines.append(f"  not compared ({len(unlike)}; the source's cache-aware router, which aisimulate's built-in "
                     f"stack does not model): {', '.join(unlike)}")
    for i, r in runs.items():
        if r.why and not r.why.startswith("not replayed by topotune"):
            lines.append(f"  aisimulate does not run {i}: {r.why[:150]}")
    cpu = yaml.safe_load(path.read_text()).get("cpu_validation") or {}
    if "why" in cpu:
        lines.append(f"  aisimulate does not run the real vLLM-CPU validation runs: {cpu['why'][:150]}")
    return lines


def _pct(log_ratio: float) -> float:
    return (math.exp(abs(log_ratio)) - 1.0) * 100.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", action="store_true", help="print every row's errors")
    ap.add_argument("--replay", action="store_true", help="also replay every row through the scheduler")
    args = ap.parse_args(argv)
    data = yaml.safe_load(TABLE.read_text())
    rows = data["rows"]
    cals = Calibrations()
    scored = [score_row(r, cals) for r in rows]
    groups = {"vllm": [s for s in scored if s.row["engine"] == "vllm" and s.errors],
              "other engines (not fitted, scored apart)": [s for s in scored if s.row["engine"] != "vllm"
                                                           and s.errors]}
    if args.rows:
        for s in scored:
            detail = "  ".join(f"{k} {math.exp(v):.2f}x" for k, v in sorted(s.errors.items()))
            print(f"{s.row['id']:<36} {detail or '-'}  [{s.note}]")
        print()
    skipped = [s for s in scored if not s.errors and s.saturated is None]
    print(f"{len(rows)} rows: {sum(1 for s in scored if s.errors)} scored on figures, "
          f"{sum(1 for s in scored if s.saturated)} predicted saturated, {len(skipped)} not replayed "
          f"({'; '.join(sorted({s.note.split(':')[0] for s in skipped}))})")
    verdicts = [(s, measured_verdict(s.row)) for s in scored if s.saturated is not None]
    if verdicts:
        print("\nopen-loop rows: the model's saturation verdict against the source's")
        for s, truth in verdicts:
            said = "saturated" if s.saturated else "keeping up"
            agree = "agree" if said == truth else ("-" if truth == "ambiguous" else "DISAGREE")
            print(f"  {s.row['id']:<24} model {said:<10}  source {truth:<10}  {agree}")
        clear = [(s, t) for s, t in verdicts if t != "ambiguous"]
        agreed = sum(1 for s, t in clear if (t == "saturated") == bool(s.saturated))
        print(f"  {agreed} of {len(clear)} clear verdicts agree ({len(verdicts) - len(clear)} ambiguous)")
    for name, group in groups.items():
        if group:
            _summary(name, group)
    unscored = [k for s in groups["vllm"] for k in _measured(s.row) if k in ITL_KEYS[1:] and k not in s.errors]
    if unscored:
        print(f"  not scored by the analytic model: {len(unscored)} token-gap percentiles (vllm bench serve's ITL "
              f"p50/p99): it gives a per-request ITL and a mean time per token, not the gaps' distribution")
    if args.replay:
        replayed = [replay_row(r, cals) for r in rows if r["engine"] == "vllm"]
        if args.rows:
            print()
            for s in replayed:
                detail = "  ".join(f"{k} {math.exp(v):.2f}x" for k, v in sorted(s.errors.items()))
                print(f"{s.row['id']:<36} {detail or '-'}  [{s.note}]")
        _summary("vllm, replayed through the scheduler (tuner/replay)", [s for s in replayed if s.errors])
        verdicts = [(s, measured_verdict(s.row)) for s in replayed if s.saturated is not None]
        clear = [(s, t) for s, t in verdicts if t != "ambiguous"]
        agreed = sum(1 for s, t in clear if (t == "saturated") == bool(s.saturated))
        print(f"  replay's queue verdicts: {agreed} of {len(clear)} clear verdicts agree with the source "
              f"({len(verdicts) - len(clear)} ambiguous)")
        print("\n".join(replay_targets([s for s in replayed if s.errors], groups["vllm"], verdicts)))
        print("  (the in-sample floor of these figures, the error left when the calibration is fitted on them: "
              "benchmarks/workload_floor.py)")
        print("\n".join(aisimulate_side_by_side(replayed, rows=args.rows)))
    print("\n".join(cpu_trace_trial()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
