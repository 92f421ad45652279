"""Fidelity of the performance model on published, measured serving results it was not fitted on.

Replays benchmarks/data/public_measurements.yaml (every row cites its source), fits one calibration per GPU class
(Hopper: H100/H200; Blackwell: B200/GB200/GB300) on the vLLM rows, and reports the leave-one-SOURCE-out error:
for each source, the class calibration is fitted on the other sources' vLLM rows only and the held-out rows are
predicted with it. Errors are |log(predicted / measured)| of throughput per GPU and of per-user speed
(1000 / TPOT), shown as percentages (exp(|log ratio|) - 1). SGLang / TensorRT-LLM rows are scored apart with the
full vLLM fit and never fitted on.

Side by side: NVIDIA aiconfigurator's estimates of the same rows (benchmarks/data/aiconfigurator.yaml, written with
the exact commands by benchmarks/aiconfigurator_runs.py, so this runs without aiconfigurator installed) are scored
the same way on the rows both tools run; aiconfigurator is never fitted on this table, so its figures are held out
by construction, topotune's are the leave-one-source-out ones (vLLM rows) or the vLLM fit (other engines).

Run: .venv/bin/python benchmarks/fidelity.py [--table PATH] [--peer PATH] [--rows]
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from tuner.hardware import GpuSpec, get_gpu
from tuner.memory import Mxfp4Backend
from tuner.metrics import ServingMetrics
from tuner.models import ModelSpec, load_model
from tuner.perf import DECODE_LADDER, Calibration, RooflineModel, default_calibration
from tuner.topology import DEFAULT_ALL2ALL_BACKEND, Role, Topology

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "benchmarks" / "data" / "public_measurements.yaml"
PEER = REPO / "benchmarks" / "data" / "aiconfigurator.yaml"
ROLES = {"aggregated": Role.BOTH, "prefill": Role.PREFILL, "decode": Role.DECODE}
#: Engine settings a row replays with unless its `serve:` gives the source's own flags (vLLM's
#: --gpu-memory-utilization, --max-num-seqs, --max-num-batched-tokens, --kv-cache-dtype, --stream-interval,
#: --all2all-backend, --enable-dbo, --enable-eplb's redundant experts).
SERVE_DEFAULTS = {"gpu_memory_utilization": 0.9, "max_num_seqs": 1024, "max_num_batched_tokens": 8192,
                  "kv_cache_dtype": "auto", "stream_interval": 1, "all2all_backend": DEFAULT_ALL2ALL_BACKEND,
                  "dbo": False, "num_redundant_experts": 0}
#: Engine settings that size memory rather than the topology (--kv-cache-memory-bytes: the KV budget, exactly).
MEMORY_SETTINGS = ("kv_cache_memory_bytes",)
#: Factors fitted per GPU class: decode bandwidth, decode and prefill compute, the per-kernel latency floor, the
#: per-step scheduler cost and the front-end latency in TTFT. Each moves a different part of the curves.
FIT_FACTORS = ("hbm_efficiency", "flop_efficiency", "prefill_flop_efficiency", "prefill_half_tokens",
               "attention_flop_efficiency", "moe_gemm_efficiency",
               "fp8_gemm_efficiency", "kv_occupancy", "kernel_latency_us", "step_overhead_ms", "request_overhead_ms",
               "request_step_us", "streamed_request_share")
#: What a fit starts from and is pulled toward: physics-only values that owe nothing to the table (the generic
#: factors; Hopper's mature kernels stream HBM and run prefill GEMMs a little better). Never the library's
#: defaults, which are themselves fitted on this table and would leak the held-out source into its own fit.
PRIORS = {"hopper": Calibration(hbm_efficiency=0.85, prefill_flop_efficiency=0.5, attention_flop_efficiency=0.5,
                                 request_step_us=10.0, prefill_half_tokens=256.0),
          "blackwell": Calibration(attention_flop_efficiency=0.42, request_step_us=10.0, prefill_half_tokens=256.0)}
PRIOR_WEIGHT = 1.0  # pull toward the documented defaults (log space) so a class with few rows stays physical
PRIOR_WEIGHTS = {"request_step_us": 0.1}
TTFT_WEIGHT = 0.5  # TTFT is not a target metric; it only pins the front-end latency


@dataclass(frozen=True)
class Row:
    """One published measurement (see the YAML's header for the fields' meaning)."""

    id: str
    source: str
    engine: str
    engine_version: str
    gpu: str
    model: str
    checkpoint: str
    topology: str
    role: str
    isl: float
    osl: float
    load_kind: str
    load_value: int
    tok_s_per_gpu: float
    counts: str
    tpot_ms: float | None
    ttft_ms: float | None
    scored: bool = True
    why: str = ""
    serve: tuple[tuple[str, object], ...] = ()  # the source's own engine flags where they differ from SERVE_DEFAULTS

    @property
    def is_vllm(self) -> bool:
        """A row the calibration may be fitted on and the targets are measured on."""
        return self.engine == "vllm" and self.scored

    @property
    def engine_flags(self) -> dict[str, object]:
        """The topology's engine settings: SERVE_DEFAULTS with the source's own flags over them."""
        return {**SERVE_DEFAULTS, **{k: v for k, v in self.serve if k not in MEMORY_SETTINGS}}

    @property
    def kv_cache_memory_bytes(self) -> int | None:
        return dict(self.serve).get("kv_cache_memory_bytes")  # type: ignore[return-value]

    @property
    def tok_s_per_user(self) -> float | None:
        return 1000.0 / self.tpot_ms if self.tpot_ms else None


@dataclass(frozen=True)
class Prediction:
    tok_s_per_gpu: float
    tok_s_per_user: float
    ttft_ms: float


@dataclass(frozen=True)
class Scored:
    row: Row
    prediction: Prediction
    tput_log_ratio: float
    user_log_ratio: float | None


def load_table(path: Path) -> tuple[dict[str, dict[str, str]], list[Row]]:
    data = yaml.safe_load(path.read_text())
    sources = data["sources"]
    rows = []
    for r in data["rows"]:
        if r["source"] not in sources:
            raise SystemExit(f"{path}: row {r['id']} cites unknown source {r['source']!r}")
        load = r["load"]
        value = load.get("concurrency") or load.get("prompts") or load.get("up_to")
        m = r["measured"]
        serve = r.get("serve") or {}
        unknown = sorted(set(serve) - set(SERVE_DEFAULTS) - set(MEMORY_SETTINGS))
        if unknown:
            raise SystemExit(f"{path}: row {r['id']} serve: unknown setting(s) {unknown}")
        rows.append(Row(id=r["id"], source=r["source"], engine=r["engine"], engine_version=str(r["engine_version"]),
                        gpu=r["gpu"], model=r["model"], checkpoint=r["checkpoint"], topology=r["topology"],
                        role=r["role"], isl=float(r["isl"]), osl=float(r["osl"]), load_kind=load["kind"],
                        load_value=int(value), tok_s_per_gpu=float(m["tok_s_per_gpu"]), counts=m["counts"],
                        tpot_ms=m.get("tpot_ms"), ttft_ms=m.get("ttft_ms"), scored=r.get("scored", True),
                        why=r.get("why", ""), serve=tuple(sorted(serve.items()))))
    return sources, rows


@dataclass(frozen=True)
class PeerEstimate:
    """aiconfigurator's figures for one row, in the row's own units."""

    id: str
    tok_s_per_gpu: float
    tok_s_per_user: float | None  # None for a prefill-only run (no TPOT)
    command: str


def peer_throughput(figures: dict[str, object], row: Row) -> float:
    """The row's throughput figure from aiconfigurator's: its tokens/s/gpu counts output tokens only, so a row
    counting total (or input) tokens uses its seq/s with the lengths it was given (the row's, rounded) over the
    command's GPUs (--tp x --dp; a prefill-only run has no output tokens to scale)."""
    if row.counts == "output":
        return float(figures["output_tok_s_per_gpu"])  # type: ignore[arg-type]
    argv = shlex.split(str(figures["command"]))
    gpus = int(argv[argv.index("--tp") + 1]) * (int(argv[argv.index("--dp") + 1]) if "--dp" in argv else 1)
    isl, osl = max(1, round(row.isl)), max(1, round(row.osl))
    tokens = isl if row.counts == "input" else isl + osl
    return float(figures["seq_per_s"]) * tokens / gpus  # type: ignore[arg-type]


def load_peer(path: Path, rows: Sequence[Row]) -> tuple[dict[str, PeerEstimate], dict[str, str]]:
    """The stored aiconfigurator estimates by row id, and why the others were not run. Every stored id must be a
    public row's."""
    data = yaml.safe_load(path.read_text())
    by_id = {r.id: r for r in rows}
    estimates: dict[str, PeerEstimate] = {}
    skipped: dict[str, str] = {}
    for e in data["rows"]:
        row = by_id.get(e["id"])
        if row is None:
            raise SystemExit(f"{path}: {e['id']!r} matches no row of the public table; re-run "
                             f"benchmarks/aiconfigurator_runs.py --run")
        if "why" in e:
            skipped[row.id] = e["why"]
            continue
        estimates[row.id] = PeerEstimate(row.id, peer_throughput(e, row),
                                         1000.0 / float(e["tpot_ms"]) if e.get("tpot_ms") else None,
                                         e["command"])
    return estimates, skipped


def gpu_class(gpu: GpuSpec) -> str:
    return gpu.architecture


def crosses_hosts(row: Row, gpu: GpuSpec) -> bool:
    """One instance larger than the GPU's NVLink domain: its EP group runs over the hosts' network."""
    return Topology.parse(row.topology).num_gpus > gpu.nvlink_domain_gpus


class Replayer:
    """Predicts rows; keeps one model per (checkpoint, GPU) so refits reuse the per-topology constants."""

    def __init__(self) -> None:
        self._models: dict[str, ModelSpec] = {}
        self._gpus: dict[str, GpuSpec] = {}
        self._perf: dict[tuple[str, str, float | None, Mxfp4Backend | None, int | None], RooflineModel] = {}

    def gpu(self, name: str) -> GpuSpec:
        if name not in self._gpus:
            self._gpus[name] = get_gpu(name)
        return self._gpus[name]

    def perf(self, row: Row, cal: Calibration) -> RooflineModel:
        graphs = 0.0 if _version(row.engine_version) < (0, 21) else None
        mxfp4 = _mxfp4_backend(row, self.gpu(row.gpu))
        kv_bytes = row.kv_cache_memory_bytes
        key = (row.model, row.gpu, graphs, mxfp4, kv_bytes)
        base = self._perf.get(key)
        if base is None:
            if row.model not in self._models:
                self._models[row.model] = load_model(REPO / row.model)
            base = self._perf[key] = RooflineModel(self._models[row.model], self.gpu(row.gpu), cal,
                                                   cuda_graph_gib=graphs, mxfp4_backend=mxfp4,
                                                   kv_cache_memory_bytes=kv_bytes)
        return base.with_calibration(cal)

    def predict(self, row: Row, cal: Calibration) -> Prediction:
        perf = self.perf(row, cal)
        role = ROLES[row.role]
        topo = Topology.parse(row.topology, role=role, **row.engine_flags)
        isl, osl = max(1, round(row.isl)), max(1, round(row.osl))
        if row.load_kind == "burst" and role is Role.BOTH:
            m = perf.predict_burst(topo, isl=isl, osl=osl, prompts=row.load_value)
            return Prediction(_throughput(m, row.counts), m.tok_s_per_user, m.ttft_ms_mean)
        if row.load_kind == "peak":
            levels = [c for c in DECODE_LADDER if c <= row.load_value] or [row.load_value]
        else:
            levels = [row.load_value]
        curve = perf.predict_curve(topo, role, isl=isl, osl=osl, concurrencies=levels)
        best = max(curve, key=lambda m: _throughput(m, row.counts))
        return Prediction(_throughput(best, row.counts), best.tok_s_per_user, best.ttft_ms_mean)


def _version(text: str) -> tuple[int, int]:
    """(major, minor) of a vLLM version; an unreleased `main` counts as new.

    vLLM reserves CUDA-graph memory before sizing the KV cache only since 0.21 ("CUDA graph memory profiling is
    enabled (default since v0.21.0)", vLLM's start-up log), so older rows replay with no reserve.
    """
    parts = text.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return (99, 0)


def _mxfp4_backend(row: Row, gpu: GpuSpec) -> Mxfp4Backend | None:
    """vLLM before 0.12 ran MXFP4 experts on Hopper with Marlin: triton_kernels was not a dependency yet ("users
    have to install `triton_kernels` manually", vLLM PR #27370; bundled by #28788), and Marlin's padded experts
    are what vLLM 0.10.1 and 0.11.2 logged for gpt-oss-120b on one H100 ("Model loading took 65.9651 GiB",
    vllm#23278 and a v0.11.2 start-up log; the memory model gives 65.9). None: vLLM's default for the GPU."""
    if row.is_vllm and gpu.architecture == "hopper" and _version(row.engine_version) < (0, 12):
        return Mxfp4Backend.MARLIN
    return None


def _throughput(m: ServingMetrics, counts: str) -> float:
    if counts == "output":
        return m.output_tok_s_per_gpu
    if counts == "input":
        return m.request_throughput_rps * m.isl / m.num_gpus
    return m.total_tok_s_per_gpu


def score(replayer: Replayer, rows: Sequence[Row], cal_for: dict[str, Calibration]) -> list[Scored]:
    out = []
    for row in rows:
        p = replayer.predict(row, cal_for[row.gpu])
        user = row.tok_s_per_user
        out.append(Scored(row, p, math.log(p.tok_s_per_gpu / row.tok_s_per_gpu),
                          math.log(p.tok_s_per_user / user) if user else None))
    return out


def _residuals(replayer: Replayer, rows: Sequence[Row], cal: Calibration, base: Calibration) -> list[float]:
    res = []
    for s in score(replayer, rows, {r.gpu: cal for r in rows}):
        res.append(s.tput_log_ratio)
        if s.user_log_ratio is not None:
            res.append(s.user_log_ratio)
        if s.row.ttft_ms and s.row.load_kind == "closed":
            res.append(TTFT_WEIGHT * math.log(s.prediction.ttft_ms / s.row.ttft_ms))
    for name in FIT_FACTORS:
        res.append(PRIOR_WEIGHTS.get(name, PRIOR_WEIGHT) * math.log(getattr(cal, name) / getattr(base, name)))
    return res


def fit_class(replayer: Replayer, rows: Sequence[Row], base: Calibration) -> Calibration:
    """Bounded least squares in log space over the rows' throughput, per-user speed and (weakly) TTFT."""
    from scipy.optimize import least_squares

    bounds = {name: _factor_bounds(name) for name in FIT_FACTORS}
    # start inside the box: a factor starting on its bound (e.g. kv_occupancy = 1) would not move off it
    x0 = [math.log(min(max(getattr(base, n), bounds[n][0] * 1.05), bounds[n][1] * 0.9)) for n in FIT_FACTORS]
    lo = [math.log(bounds[n][0]) for n in FIT_FACTORS]
    hi = [math.log(bounds[n][1]) for n in FIT_FACTORS]

    def calibration(x: Sequence[float]) -> Calibration:
        return base.model_copy(update={n: math.exp(v) for n, v in zip(FIT_FACTORS, x, strict=True)})

    result = least_squares(lambda x: _residuals(replayer, rows, calibration(x), base), x0, bounds=(lo, hi),
                           diff_step=1e-3, max_nfev=60 * len(FIT_FACTORS))
    return calibration(result.x)


def _factor_bounds(name: str) -> tuple[float, float]:
    """The Calibration field's own bounds, tightened to what a fit may plausibly reach."""
    return {"hbm_efficiency": (0.4, 0.9), "flop_efficiency": (0.1, 1.0), "prefill_flop_efficiency": (0.15, 1.0),
            "prefill_half_tokens": (1.0, 2048.0),
            "attention_flop_efficiency": (0.15, 1.0),
            "moe_gemm_efficiency": (0.15, 1.0), "fp8_gemm_efficiency": (0.3, 1.0), "kv_occupancy": (0.5, 1.0),
            "kernel_latency_us": (0.5, 20.0),
            "step_overhead_ms": (0.05, 20.0), "request_step_us": (0.5, 200.0), "streamed_request_share": (0.02, 1.0),
            "request_overhead_ms": (1.0, 200.0)}[name]


def leave_one_source_out(replayer: Replayer, rows: Sequence[Row]) -> tuple[list[Scored], dict[str, str]]:
    """Each vLLM source predicted by its class calibration fitted on the other sources only.

    A source whose rows span GPU classes (one post measuring B200 and H100) is held out of every class it has rows
    in: each of its rows is predicted by its own class's fit on the other sources."""
    vllm = [r for r in rows if r.is_vllm]
    classes = {r.gpu: gpu_class(replayer.gpu(r.gpu)) for r in rows}
    held: list[Scored] = []
    notes: dict[str, str] = {}
    for source in sorted({r.source for r in vllm}):
        parts = []
        for cls in sorted({classes[r.gpu] for r in vllm if r.source == source}):
            target = [r for r in vllm if r.source == source and classes[r.gpu] == cls]
            train = [r for r in vllm if r.source != source and classes[r.gpu] == cls]
            fitted = fit_class(replayer, train, PRIORS[cls]) if train else PRIORS[cls]
            parts.append(f"fitted on {len({r.source for r in train})} other {cls} source(s), {len(train)} rows"
                         if train else f"no other {cls} source: physics priors")
            held += score(replayer, target, {r.gpu: fitted for r in target})
        notes[source] = "; ".join(parts)
    return held, notes


def _pct(log_ratio: float) -> float:
    return (math.exp(abs(log_ratio)) - 1.0) * 100.0


def summary(name: str, scored: Sequence[Scored]) -> str:
    tput = [abs(s.tput_log_ratio) for s in scored]
    user = [abs(s.user_log_ratio) for s in scored if s.user_log_ratio is not None]

    def stats(v: list[float]) -> str:
        return f"median {_pct(statistics.median(v)):5.1f}%  worst {_pct(max(v)):6.1f}%  (n={len(v)})" if v else "n=0"

    return f"{name:<38} tok/s/GPU {stats(tput)} | tok/s/user {stats(user)}"


def print_rows(scored: Sequence[Scored]) -> None:
    print(f"{'row':<28} {'engine':<7} {'gpu':<6} {'load':<12} {'tok/s/GPU meas':>14} {'pred':>9} {'err':>7} "
          f"{'tok/s/user meas':>15} {'pred':>7} {'err':>7} {'TTFT meas':>9} {'pred':>7}")
    for s in scored:
        r, p = s.row, s.prediction
        user = f"{r.tok_s_per_user:15.1f} {p.tok_s_per_user:7.1f} {_signed(s.user_log_ratio):>7}" \
            if s.user_log_ratio is not None else f"{'-':>15} {p.tok_s_per_user:7.1f} {'-':>7}"
        ttft = f"{r.ttft_ms:9.0f} {p.ttft_ms:7.0f}" if r.ttft_ms else f"{'-':>9} {'-':>7}"
        print(f"{r.id:<28} {r.engine:<7} {r.gpu:<6} {r.load_kind + ' ' + str(r.load_value):<12} "
              f"{r.tok_s_per_gpu:14,.0f} {p.tok_s_per_gpu:9,.0f} {_signed(s.tput_log_ratio):>7} {user} {ttft}")


def _signed(log_ratio: float | None) -> str:
    if log_ratio is None:
        return "-"
    return f"{(math.exp(log_ratio) - 1) * 100:+.0f}%"


def _ratio(log_ratio: float) -> str:
    return f"x{math.exp(abs(log_ratio)):.3f}"


def side_by_side(ours: Sequence[Scored], peer: dict[str, PeerEstimate]) -> list[tuple[Scored, Scored]]:
    """(topotune, aiconfigurator) scored on every row both tools ran."""
    pairs = []
    for s in ours:
        e = peer.get(s.row.id)
        if e is None:
            continue
        user = s.row.tok_s_per_user
        theirs = Scored(s.row, Prediction(e.tok_s_per_gpu, e.tok_s_per_user or float("nan"), float("nan")),
                        math.log(e.tok_s_per_gpu / s.row.tok_s_per_gpu),
                        math.log(e.tok_s_per_user / user) if user and e.tok_s_per_user else None)
        pairs.append((s, theirs))
    return pairs


def print_side_by_side(pairs: Sequence[tuple[Scored, Scored]], skipped: dict[str, str], rows: bool,
                       missing: Sequence[str] = ()) -> None:
    def stats(scored: Sequence[Scored], attr: str) -> str:
        v = [abs(getattr(x, attr)) for x in scored if getattr(x, attr) is not None]
        return f"median {_ratio(statistics.median(v))}  worst {_ratio(max(v))} (n={len(v)})" if v else "n=0"

    print("\naiconfigurator 0.12 side by side, rows both tools run (ratio = max(pred/meas, meas/pred); topotune held "
          "out by source, aiconfigurator never fitted):")
    groups = (("vLLM rows", [p for p in pairs if p[0].row.is_vllm]),
              ("all scored rows", [p for p in pairs if p[0].row.scored]))
    for name, group in groups:
        for tool, idx in (("topotune", 0), ("aiconfigurator", 1)):
            scored = [p[idx] for p in group]
            print(f"  {name:<16} {tool:<15} tok/s/GPU {stats(scored, 'tput_log_ratio'):<34} | "
                  f"tok/s/user {stats(scored, 'user_log_ratio')}")
    print("  targets: topotune below aiconfigurator at the median and the worst row on both metrics; vLLM rows median "
          "within x1.10, worst within x1.30")
    if rows:
        print(f"\n  {'row':<36} {'tok/s/GPU meas':>14} {'topotune':>9} {'aic':>7} {'tok/s/user meas':>15} "
              f"{'topotune':>9} {'aic':>7}")
        for ours, theirs in pairs:
            r = ours.row
            user = f"{r.tok_s_per_user:15.1f} {_signed(ours.user_log_ratio):>9} {_signed(theirs.user_log_ratio):>7}" \
                if r.tok_s_per_user else f"{'-':>15} {'-':>9} {'-':>7}"
            print(f"  {r.id:<36} {r.tok_s_per_gpu:14,.0f} {_signed(ours.tput_log_ratio):>9} "
                  f"{_signed(theirs.tput_log_ratio):>7} {user}{'' if r.scored else '  (not scored)'}")
    if missing:
        print(f"\n  public rows with no stored aiconfigurator estimate ({len(missing)}; "
              f"benchmarks/aiconfigurator_runs.py --run --only ID... adds them): {', '.join(missing)}")
    if skipped:
        print(f"\n  rows aiconfigurator does not run ({len(skipped)}):")
        for why in sorted(set(skipped.values())):
            ids = [i for i, w in skipped.items() if w == why]
            print(f"    {', '.join(ids)}: {why}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, default=TABLE)
    parser.add_argument("--rows", action="store_true", help="print every held-out row")
    parser.add_argument("--peer", type=Path, default=PEER, help="aiconfigurator's stored estimates")
    args = parser.parse_args(argv)
    sources, rows = load_table(args.table)
    replayer = Replayer()
    vllm = [r for r in rows if r.is_vllm]
    gpus = sorted({r.gpu for r in vllm})
    models = sorted({r.checkpoint for r in vllm})
    print(f"{len(rows)} rows ({len(vllm)} vLLM) from {len(sources)} sources; GPUs {', '.join(gpus)}; "
          f"{len(models)} checkpoints: {', '.join(models)}")

    priors = score(replayer, vllm, {g: PRIORS[gpu_class(replayer.gpu(g))] for g in gpus})
    library = score(replayer, vllm, {g: default_calibration(g) for g in gpus})
    held, notes = leave_one_source_out(replayer, rows)
    classes = sorted({gpu_class(replayer.gpu(g)) for g in gpus})
    full = {}
    for cls in classes:
        members = [r for r in vllm if gpu_class(replayer.gpu(r.gpu)) == cls]
        fitted = fit_class(replayer, members, PRIORS[cls])
        full.update({r.gpu: fitted for r in members})
    wide = [r for r in rows if crosses_hosts(r, replayer.gpu(r.gpu))]
    others = [r for r in rows if r.engine != "vllm" and r not in wide]
    unscored = [r for r in rows if r.engine == "vllm" and not r.scored]
    for r in (*others, *unscored, *wide):
        full.setdefault(r.gpu, default_calibration(r.gpu))
    in_sample = score(replayer, vllm, full)

    print()
    print(summary("vLLM, physics priors (no fit)", priors))
    print(summary("vLLM, fitted on all (in-sample)", in_sample))
    print(summary("vLLM, library defaults (in-sample)", library))
    print(summary("vLLM, leave-one-source-out (held out)", held))
    if others:
        print(summary("SGLang/TRT-LLM (vLLM fit, not fitted)", score(replayer, others, full)))
    if unscored:
        print(summary("vLLM rows left out (vLLM fit)", score(replayer, unscored, full)))
    if wide:
        print(summary("multi-host wide EP (vLLM fit, not fitted)", score(replayer, wide, full)))
    for cls in classes:
        print(summary(f"  of which {cls} (held out)", [s for s in held if gpu_class(replayer.gpu(s.row.gpu)) == cls]))
    print("\ntargets, held-out vLLM rows: median <= 15% and worst <= 50% on both metrics; "
          "multi-host wide EP rows: median <= 20%, every row within x1.5")
    print("\nper source (held out):")
    for source, note in notes.items():
        print(f"  {summary(source, [s for s in held if s.row.source == source])}  [{note}]")
    print("\nfitted calibration per GPU class (all vLLM rows):")
    for g, cal in sorted(full.items()):
        print(f"  {g:<6} " + ", ".join(f"{n}={getattr(cal, n):.3g}" for n in FIT_FACTORS))
    if args.peer.exists():
        peer, skipped = load_peer(args.peer, rows)
        ours = [*held, *score(replayer, others, full)]
        missing = [r.id for r in rows if r.id not in peer and r.id not in skipped]
        print_side_by_side(side_by_side(ours, peer), skipped, args.rows, missing)
    if args.rows:
        print("\nheld-out rows:")
        print_rows(held)
        if others:
            print("\nother engines (vLLM fit):")
            print_rows(score(replayer, others, full))
        if wide:
            print("\nmulti-host wide EP, across hosts' RDMA network (vLLM fit, not fitted):")
            print_rows(score(replayer, wide, full))
        if unscored:
            print("\nleft out of the targets (vLLM fit):")
            print_rows(score(replayer, unscored, full))
            for r in unscored:
                print(f"  {r.id}: {r.why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
