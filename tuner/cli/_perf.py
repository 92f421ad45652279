"""`topotune simulate` (one instance, a concurrency sweep) and `topotune frontier` (the combined PD front)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import ValidationError
from rich.table import Table

from tuner.cli._app import HardwareFileOpt, HardwareOpt, ModelArg, app, console, err_console, print_json
from tuner.cli._workload import ArrivalOpt, RequestRateOpt, WorkloadOpt, load_workload
from tuner.deployment import Deployment
from tuner.errors import ConfigError, InfeasibleError
from tuner.export import RecipeContext, export_deployment
from tuner.frontier import (
    PERCENTILES,
    AggregatedPoint,
    ComposedPoint,
    Constraints,
    Winner,
    combined_front,
    compose_aggregated,
    compose_disaggregated,
    compose_rate_aggregated,
    compose_rate_disaggregated,
    pareto_front,
    which_wins,
)
from tuner.hardware import get_gpu
from tuner.metrics import ServingMetrics
from tuner.models import ModelSpec, load_model
from tuner.perf import (
    Calibration,
    Curves,
    LevelLimits,
    RateCurves,
    RooflineModel,
    candidate_topologies,
    default_calibration,
    predict_traffic,
    sweep_curves,
    sweep_rate_curves,
)
from tuner.report import composed_front_figure, write_figures
from tuner.topology import (
    DEFAULT_ALL2ALL_BACKEND,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    DEFAULT_MAX_NUM_SEQS,
    Role,
    Topology,
)
from tuner.workload import Workload

CalibrationOpt = Annotated[Path | None, typer.Option(
    help="YAML/JSON file of calibration factors overriding the GPU's defaults (see docs/perf-model.md).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
KvCacheDtypeOpt = Annotated[str, typer.Option(
    help="vLLM --kv-cache-dtype: auto, fp8 (fp8_e4m3, fp8_e5m2), fp8_per_token_head, nvfp4, ...")]
StreamIntervalOpt = Annotated[int, typer.Option(
    help="vLLM --stream-interval: tokens streamed per message (1 = every token; larger cuts host cost per step).")]
All2AllOpt = Annotated[str, typer.Option(
    help="vLLM --all2all-backend for EP over DP ranks: allgather_reducescatter (vLLM's default: every token to "
         "every EP rank), deepep_high_throughput, deepep_low_latency, flashinfer_nvlink_one_sided, "
         "flashinfer_nvlink_two_sided (routed: a token only to its experts' ranks).")]


def _positive(**values: int | float | None) -> None:
    for name, value in values.items():
        if value is not None and value < 1:
            raise ConfigError(f"must be >= 1, got {value}", field=f"--{name.replace('_', '-')}",
                              fix="give a positive number")


def _calibration(gpu_name: str, path: Path | None) -> Calibration:
    base = default_calibration(gpu_name)
    if path is None:
        return base
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}", field="--calibration",
                          fix="give a readable YAML or JSON file") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML/JSON: {exc}", field="--calibration", fix="fix the file's syntax") from exc
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping of factor: value", field="--calibration",
                          fix="write e.g. `hbm_efficiency: 0.8`")
    try:
        return Calibration.model_validate({**base.model_dump(), **data})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(f"{err['msg']} (got {err.get('input')!r})",
                          field=f"--calibration: {'.'.join(str(p) for p in err['loc'])}",
                          fix="see the factor list in docs/perf-model.md") from exc


def _levels(text: str) -> list[int]:
    try:
        levels = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError as exc:
        raise ConfigError(f"cannot read {text!r} as concurrency levels", field="--concurrency",
                          fix="give comma-separated positive integers, e.g. 1,8,64,256") from exc
    if not levels or levels[0] < 1:
        raise ConfigError(f"concurrency levels must be >= 1, got {text!r}", field="--concurrency",
                          fix="give comma-separated positive integers, e.g. 1,8,64,256")
    return levels


_ROLE_NAMES = {"prefill": Role.PREFILL, "decode": Role.DECODE, "aggregated": Role.BOTH, "agg": Role.BOTH,
               "both": Role.BOTH}


def _role(text: str) -> Role:
    key = text.strip().lower()
    if key not in _ROLE_NAMES:
        raise ConfigError(f"unknown role {text!r}", field="--role", fix="use prefill, decode or aggregated")
    return _ROLE_NAMES[key]


@dataclass(frozen=True)
class _StepParts:
    """Where one point's step time goes (an aggregated point: its mean step, prefill chunks included)."""

    step_ms: float
    memory_ms: float = 0.0
    compute_ms: float = 0.0
    comm_ms: float = 0.0
    overhead_ms: float = 0.0
    draft_ms: float = 0.0
    requests_ms: float = 0.0
    chunk_step_ms: float | None = None
    chunk_share: float | None = None
    chunk_tokens: float | None = None
    decode_requests_per_rank: float | None = None

    def as_json(self) -> dict[str, float]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def _breakdown(perf: RooflineModel, topo: Topology, role: Role, curve: list[ServingMetrics], *, isl: int,
               osl: int) -> list[_StepParts]:
    out = []
    for m in curve:
        running = int(m.running_requests)
        if role is Role.DECODE:
            s = perf.decode_step(topo, running, isl=isl, osl=osl)
            out.append(_StepParts(s.step_ms, s.memory_ms, s.compute_ms, s.comm_ms, s.overhead_ms, s.draft_ms,
                                  s.requests_ms))
        elif role is Role.PREFILL:
            p = perf.prefill_step(topo, running, isl=isl)
            out.append(_StepParts(p.step_ms, p.memory_ms, p.compute_ms, p.comm_ms, p.overhead_ms))
        else:
            point = perf.aggregated_point(topo, m.concurrency, isl=isl, osl=osl)
            out.append(_StepParts(point.mean_step_ms, chunk_step_ms=point.chunk_step_ms,
                                  chunk_share=point.chunk_share, chunk_tokens=point.chunk_tokens,
                                  decode_requests_per_rank=point.decode_requests))
    return out


def _metrics_row(m: ServingMetrics) -> dict[str, float | int]:
    return {"concurrency": m.concurrency, "running": m.running_requests, "total_tok_s": round(m.total_tok_s, 1),
            "total_tok_s_per_gpu": round(m.total_tok_s_per_gpu, 1),
            "output_tok_s_per_gpu": round(m.output_tok_s_per_gpu, 1), "tok_s_per_user": round(m.tok_s_per_user, 2),
            "ttft_ms": round(m.ttft_ms_mean, 2), "itl_ms": round(m.itl_ms_mean, 3),
            "request_rps": round(m.request_throughput_rps, 4), "max_concurrency": round(m.max_concurrency, 1)}


@app.command()
def simulate(
    model: ModelArg,
    hardware: HardwareOpt = "gb300",
    topology: Annotated[str, typer.Option(help="TP8, TEP8, DEP8, TP4DP4+EP, ...")] = "TEP8",
    role: Annotated[str, typer.Option(help="prefill, decode (PD roles) or aggregated (both on one instance, "
                                             "chunked prefill).")] = "decode",
    mtp: Annotated[int, typer.Option(help="MTP speculative tokens (0 = off).")] = 0,
    isl: Annotated[int, typer.Option(help="Input tokens per request.")] = 8192,
    osl: Annotated[int, typer.Option(help="Output tokens per request.")] = 1024,
    concurrency: Annotated[str, typer.Option(help="Comma-separated levels, e.g. 1,8,64,256.")] = "1,8,64,256",
    gpu_memory_utilization: Annotated[float, typer.Option()] = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_num_seqs: Annotated[int, typer.Option()] = DEFAULT_MAX_NUM_SEQS,
    max_num_batched_tokens: Annotated[int, typer.Option()] = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    kv_cache_dtype: KvCacheDtypeOpt = "auto",
    stream_interval: StreamIntervalOpt = 1,
    all2all_backend: All2AllOpt = DEFAULT_ALL2ALL_BACKEND,
    calibration: CalibrationOpt = None,
    hardware_file: HardwareFileOpt = None,
    workload: WorkloadOpt = None,
    request_rate: RequestRateOpt = None,
    arrival: ArrivalOpt = "poisson",
    json_out: JsonOpt = False,
) -> None:
    """Predict one vLLM instance in one role over a concurrency sweep (the simulated backend)."""
    _positive(isl=isl, osl=osl)
    levels = _levels(concurrency)
    traffic = load_workload(workload, isl=isl, osl=osl, concurrency=tuple(levels), request_rate=request_rate,
                            arrival=arrival)
    isl, osl = traffic.isl, traffic.osl
    the_role = _role(role)
    spec = load_model(model)
    gpu = get_gpu(hardware, hardware_file)
    topo = Topology.parse(topology, mtp=mtp, gpu_memory_utilization=gpu_memory_utilization,
                          max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, role=the_role,
                          kv_cache_dtype=kv_cache_dtype, stream_interval=stream_interval,
                          all2all_backend=all2all_backend)
    topo.check(spec)
    perf = RooflineModel(spec, gpu, _calibration(gpu.name, calibration))
    predicted = predict_traffic(perf, topo, the_role, traffic)
    curve = predicted.points
    breakdown = _breakdown(perf, topo, the_role, curve, isl=isl, osl=osl)
    role_name = "aggregated" if the_role is Role.BOTH else the_role.value
    if json_out:
        print_json({"model": spec.name, "gpu": gpu.name, "topology": topo.label(), "role": role_name,
                    "isl": isl, "osl": osl, "workload": traffic.describe(),
                    "calibration": perf.calibration.model_dump(),
                    "points": [{**m.model_dump(), "step": b.as_json()} for m, b in zip(curve, breakdown, strict=True)],
                    "saturated": [{"offered_rps": s.offered_rps, "capacity_rps": s.capacity_rps}
                                  for s in predicted.saturated]})
        return
    table = Table(title=f"{spec.name} on {topo.num_gpus} x {gpu.name}, {topo.name}"
                        f"{f' MTP{mtp}' if mtp else ''} {role_name}: {traffic.describe()}", title_justify="left")
    last = "chunk share / chunk tokens" if the_role is Role.BOTH else "mem/compute/comm/ovh/req ms"
    for col in ("req/s in" if traffic.open_loop else "conc", "running", "tok/s/GPU", "out tok/s/GPU", "tok/s/user",
                "TTFT ms p50/p90/p99", "ITL ms p50/p90/p99", "req/s", "step ms", last):
        table.add_column(col, justify="right")
    for m, b in zip(curve, breakdown, strict=True):
        queued = m.running_requests < m.concurrency
        detail = (f"{b.chunk_share:.2f} / {b.chunk_tokens:,.0f}" if the_role is Role.BOTH else
                  f"{b.memory_ms:.1f}/{b.compute_ms:.1f}/{b.comm_ms:.1f}/{b.overhead_ms + b.draft_ms:.1f}"
                  f"/{b.requests_ms:.1f}")
        load = f"{m.offered_rps:g}" if m.offered_rps is not None else str(m.concurrency)
        table.add_row(load, f"{m.running_requests:.0f}" + (" [yellow](queue)[/]" if queued else ""),
                      f"{m.total_tok_s_per_gpu:,.0f}", f"{m.output_tok_s_per_gpu:,.0f}", f"{m.tok_s_per_user:.1f}",
                      f"{m.ttft_ms_p50:,.0f}/{m.ttft_ms_at('p90'):,.0f}/{m.ttft_ms_p99:,.0f}",
                      f"{m.itl_ms_p50:.1f}/{m.itl_ms_at('p90'):.1f}/{m.itl_ms_p99:.1f}",
                      f"{m.request_throughput_rps:.2f}", f"{b.step_ms:.1f}", detail)
    console.print(table)
    for s in predicted.saturated:
        console.print(f"[yellow]saturated:[/] {s.describe()}", highlight=False)
    if curve and curve[0].prefix_hit_share:
        console.print(f"prefix cache serves {curve[0].prefix_hit_share:.1%} of input tokens", highlight=False)
    if not curve:
        return
    tokens = isl + (1 if the_role is Role.PREFILL else osl)
    console.print(f"KV cache holds {curve[0].max_concurrency:,.1f} requests of {tokens:,} tokens per instance; "
                  "past that, requests queue (TTFT grows, throughput stays).", highlight=False)


def _point_dict(p: ComposedPoint) -> dict[str, object]:
    return {"deployment": p.name, "num_gpus": p.num_gpus, "prefill_topology": p.prefill_topology.name,
            "num_prefill": p.num_prefill, "prefill_concurrency": p.prefill.concurrency,
            "decode_topology": p.decode_topology.name, "decode_mtp": p.decode_topology.mtp,
            "num_decode": p.num_decode, "decode_concurrency": p.decode.concurrency,
            "total_tok_s_per_gpu": round(p.total_tok_s_per_gpu, 1),
            "output_tok_s_per_gpu": round(p.output_tok_s_per_gpu, 1), "tok_s_per_user": round(p.tok_s_per_user, 2),
            "ttft_ms": round(p.ttft_ms, 1), "itl_ms": round(p.itl_ms, 3), **_rates_per_instance(
                prefill_rps_per_instance=p.prefill.offered_rps, decode_rps_per_instance=p.decode.offered_rps)}


def _rates_per_instance(**rates: float | None) -> dict[str, float]:
    """Open loop: the request rate each instance is offered (its side's share of the whole rate)."""
    return {k: round(v, 4) for k, v in rates.items() if v is not None}


def _write_html(path: Path, title: str, points: list[ComposedPoint], front: list[ComposedPoint],
                aggregated: list[AggregatedPoint]) -> None:
    write_figures(path, title, [composed_front_figure(points, front, title, aggregated)])


@app.command(help="Sweep topologies as PD prefill/decode and as aggregated instances; print both "
                  "Pareto fronts and which mode wins where.")
def frontier(
    model: ModelArg,
    hardware: HardwareOpt = "gb300",
    gpus: Annotated[int, typer.Option(help="GPU budget of the whole deployment (prefill + decode).")] = 72,
    isl: Annotated[int, typer.Option(help="Input tokens per request.")] = 8192,
    osl: Annotated[int, typer.Option(help="Output tokens per request.")] = 1024,
    workload: WorkloadOpt = None,
    max_ttft_ms: Annotated[float | None, typer.Option(help="SLA: TTFT limit (prefill + decode-side wait).")] = None,
    max_itl_ms: Annotated[float | None, typer.Option(help="SLA: inter-token latency limit.")] = None,
    min_tok_s_user: Annotated[float | None, typer.Option(
        "--min-tok-s-user", help="Per-user speed floor (tokens/s each user sees, at the percentile).")] = None,
    percentile: Annotated[str, typer.Option(help="Latency percentile the limits apply to: p50, p90 or p99.")]
    = "p90",
    weights: Annotated[str | None, typer.Option(
        help="Model path the recommended commands load (default: MODEL, the config used for modelling).")] = None,
    max_mtp: Annotated[int, typer.Option(help="Decode MTP depths 0..N are swept (models with MTP layers).")] = 3,
    vllm_version: Annotated[str | None, typer.Option(
        help="The vLLM whose NIXL pairing rules apply (TP divisibility, replicated KV heads, hybrid block sizes): "
             "pairs it refuses are not composed (default: the newest version topotune's table checks).")] = None,
    gpu_memory_utilization: Annotated[float, typer.Option()] = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_num_seqs: Annotated[int, typer.Option()] = DEFAULT_MAX_NUM_SEQS,
    max_num_batched_tokens: Annotated[int, typer.Option()] = DEFAULT_MAX_NUM_BATCHED_TOKENS,
    kv_cache_dtype: KvCacheDtypeOpt = "auto",
    stream_interval: StreamIntervalOpt = 1,
    all2all_backend: All2AllOpt = DEFAULT_ALL2ALL_BACKEND,
    calibration: CalibrationOpt = None,
    hardware_file: HardwareFileOpt = None,
    request_rate: Annotated[float | None, typer.Option(
        help="Open loop: the request rate (req/s) the deployment must carry, Poisson arrivals (or the trace's with "
             "--arrival trace); every instance of a side gets its share. Replaces the concurrency ladder.")] = None,
    arrival: Annotated[str | None, typer.Option(
        help="Open-loop arrivals: poisson, or trace (the trace's own timestamps; alone, at the trace's own rate).")]
    = None,
    serving: Annotated[str, typer.Option(
        "--mode", help="both (PD-disaggregated and aggregated fronts side by side), disagg or agg.")] = "both",
    html: Annotated[Path | None, typer.Option(help="Write an interactive Plotly chart here.")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Long only by its typer options (one per line with their help, as typer declares them); the body is
    short. Its help text is the decorator's `help=`."""
    _positive(gpus=gpus, isl=isl, osl=osl)
    if serving not in ("both", "disagg", "agg"):
        raise ConfigError(f"unknown mode {serving!r}", field="--mode", fix="use both, disagg or agg")
    if not 0 <= max_mtp <= 8:
        raise ConfigError(f"must be 0..8, got {max_mtp}", field="--max-mtp", fix="give 0 (off) to 8")
    if percentile not in PERCENTILES:
        raise ConfigError(f"unknown percentile {percentile!r}", field="--percentile", fix="use p50, p90 or p99")
    started = time.perf_counter()
    traffic = _frontier_traffic(workload, isl=isl, osl=osl, request_rate=request_rate, arrival=arrival)
    isl, osl = traffic.isl, traffic.osl
    spec = load_model(model)
    gpu = get_gpu(hardware, hardware_file)
    perf = RooflineModel(spec, gpu, _calibration(gpu.name, calibration))
    from tuner.backends.vllm import PairingContext, launch_rules, pairing_predicate

    rules = launch_rules(vllm_version)
    pairing = pairing_predicate(rules, PairingContext(model=spec, architecture=gpu.architecture))
    constraints = Constraints(max_gpus=gpus, max_ttft_ms=max_ttft_ms, max_itl_ms=max_itl_ms,
                              min_tok_s_per_user=min_tok_s_user, percentile=percentile,  # type: ignore[arg-type]
                              pairing=pairing)
    depths = tuple(range(max_mtp + 1)) if spec.num_mtp_layers else (0,)
    engine = {"gpu_memory_utilization": gpu_memory_utilization, "max_num_seqs": max_num_seqs,
              "max_num_batched_tokens": max_num_batched_tokens, "kv_cache_dtype": kv_cache_dtype,
              "stream_interval": stream_interval, "all2all_backend": all2all_backend}
    Topology.create(**engine)  # one clear message for bad engine flags
    topologies = candidate_topologies(perf, gpus, mtp_depths=depths, **engine)
    if not topologies:
        raise ConfigError(f"no topology of up to {gpus} GPUs is valid for {spec.name}", field="--gpus",
                          fix="allow more GPUs")
    with _TopologyProgress(len(topologies), shown=not json_out and err_console.is_terminal) as progress:
        if traffic.open_loop:
            curves, fronts = _rate_fronts(perf, topologies, traffic, constraints, serving, depths, progress.advance)
        else:
            curves, fronts = _closed_loop_fronts(perf, topologies, traffic, constraints, serving, depths,
                                                 progress.advance, progress.restart)
    pick = recommend(fronts)
    elapsed = time.perf_counter() - started
    rate = traffic.request_rates[0] if traffic.open_loop else None
    setting = f"{spec.name} on up to {gpus} x {gpu.name}, {traffic.describe(load=False)}" + (
        f", {rate:.4g} req/s offered ({traffic.arrival} arrivals)" if rate is not None else "")
    title = (f"{spec.name} on up to {gpus} x {gpu.name}, {isl}/{osl}"
             + (f" at {rate:.4g} req/s" if rate is not None else "") + ": combined PD Pareto front "
             f"({len(topologies)} topologies, {curves.num_points} instance points, {len(fronts.points)} deployments)")
    if html is not None:
        _write_html(html, title, fronts.points, fronts.front, fronts.aggregated)
    ctx = RecipeContext.for_traffic(  # what the recommendation deploys (#46: its operating point)
        traffic, model_path=weights or str(model), model_name=spec.name, gpu=gpu.name, gpus_per_host=gpu.gpus_per_host,
        model=spec if weights is None else None, vllm_version=str(rules.version),
        verified_on=f"simulated (vLLM {rules.version.major}.{rules.version.minor} rules)")
    if json_out:
        load: dict[str, object] = {}
        if rate is not None:
            load = {"offered_rps": rate, "arrival": traffic.arrival, "offered_tok_s": round(rate * (isl + osl), 1)}
        print_json({"model": spec.name, "gpu": gpu.name, "gpus": gpus, "isl": isl, "osl": osl, "mode": serving,
                    "workload": traffic.describe(), **load,
                    "constraints": {"max_ttft_ms": max_ttft_ms, "max_itl_ms": max_itl_ms, "percentile": percentile,
                                    "min_tok_s_per_user": min_tok_s_user,
                                    "pairing": f"vLLM {rules.version} NIXL rules"},
                    "recommendation": {**pick.as_json(), "why": why_it_wins(pick, constraints),
                                       "tie": pick.margin is not None and pick.margin < TIE_MARGIN,
                                       "operating_point": None if pick.winner is None else
                                       _operating_point(pick.winner, ctx, rate)},
                    "calibration": perf.calibration.model_dump(), "num_topologies": len(topologies),
                    "num_instance_points": curves.num_points, "num_deployments": len(fronts.points),
                    "elapsed_s": round(elapsed, 3),
                    "front": [{**_point_dict(p), "operating_point": _operating_point(p, ctx, rate)}
                              for p in reversed(fronts.front)],
                    "aggregated_front": [{**_agg_dict(p), "operating_point": _operating_point(p, ctx, rate)}
                                         for p in reversed(fronts.aggregated)],
                    "winners": [asdict(w) for w in fronts.winners]})
        return
    _print_fronts(fronts, title, setting, elapsed, html)
    _print_recommendation(pick, constraints, setting, ctx, offered_rps=rate, mode=serving)


class _TopologyProgress:
    """The sweep's transient progress bar on a terminal; nothing (and no import of rich.progress) otherwise."""

    def __init__(self, total: int, *, shown: bool) -> None:
        self._progress: Any = None
        self._task: Any = None
        if shown:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                      TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                                      console=err_console, transient=True)
            self._task = self._progress.add_task("predicting topologies", total=total)

    def __enter__(self) -> _TopologyProgress:
        if self._progress is not None:
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def advance(self, topo: Topology) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=1, description=f"predicting {topo.name:<12}")

    def restart(self) -> None:
        if self._progress is not None:
            self._progress.reset(self._task)


def _frontier_traffic(path: Path | None, *, isl: int, osl: int, request_rate: float | None,
                      arrival: str | None) -> Workload:
    """The workload `frontier` answers for: closed loop (its own ladder), or open loop at one rate: --request-rate,
    --arrival trace alone (the trace's own rate), or a workload file's one request rate."""
    if request_rate is not None and not request_rate > 0:
        raise ConfigError(f"must be positive, got {request_rate:g}", field="--request-rate",
                          fix="give the requests/s the deployment must carry, e.g. 2.5")
    if arrival is not None and arrival not in ("poisson", "trace"):
        raise ConfigError(f"unknown arrival {arrival!r}", field="--arrival", fix="use poisson or trace")
    if request_rate is not None:
        return load_workload(path, isl=isl, osl=osl, concurrency=(1,), request_rate=f"{request_rate!r}",
                             arrival=arrival or "poisson")
    traffic = load_workload(path, isl=isl, osl=osl, concurrency=(1,))
    if arrival == "trace":
        own = traffic.trace.arrival_rps if traffic.trace is not None else None
        if not own:
            raise ConfigError("--arrival trace needs a trace with timestamps (its own rate)", field="--arrival",
                              fix="give --workload a JSONL trace with timestamps, or a --request-rate")
        return traffic.model_copy(update={"arrival": "trace", "request_rates": (own,)})
    if arrival == "poisson":
        raise ConfigError("--arrival poisson needs a rate", field="--request-rate",
                          fix="give --request-rate R (requests/s)")
    if traffic.open_loop and len(traffic.request_rates) > 1:
        rates = ", ".join(f"{r:g}" for r in traffic.request_rates)
        raise ConfigError(f"the workload offers several request rates ({rates}); a frontier answers for one",
                          field="--request-rate", fix="give the one rate to carry with --request-rate")
    return traffic


def _swept_mtp_depths(spec: ModelSpec, serving: str, depths: tuple[int, ...]
                      ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prefill, aggregated) MTP depths a sweep predicts: a hybrid model's prefill at every depth, another's once at
    0 (_at_decode_depths relabels it); none for a mode left out by --mode."""
    prefill = (depths if spec.is_hybrid else (0,)) if serving != "agg" else ()
    return prefill, depths if serving != "disagg" else ()


def _at_decode_depths(prefill: list[tuple], depths: tuple[int, ...]) -> list[tuple]:
    """NIXL compares both sides' speculative config, so a prefill instance runs its decode's MTP depth: the
    point predicted at depth 0, once per depth (the first item of each entry is the topology)."""
    return [(t.model_copy(update={"mtp": d}), *rest) for t, *rest in prefill for d in depths]


def _closed_loop_fronts(perf: RooflineModel, topologies: list[Topology], traffic: Workload, constraints: Constraints,
                        serving: str, depths: tuple[int, ...], advance: Callable[[Topology], None],
                        restart: Callable[[], None]) -> tuple[Curves, _Fronts]:
    """The concurrency ladder of every topology, composed."""
    spec, c = perf.model, constraints

    prefill_depths, aggregated_depths = _swept_mtp_depths(spec, serving, depths)

    def sweep(limits: LevelLimits | None) -> Curves:
        curves = sweep_curves(perf, topologies, isl=traffic.isl, osl=traffic.osl, prefill_mtp_depths=prefill_depths,
                              aggregated_mtp_depths=aggregated_depths, on_topology=advance, workload=traffic,
                              limits=limits)
        return curves if spec.is_hybrid else replace(curves, prefill=_at_decode_depths(curves.prefill, depths))

    # Under an SLA each ladder stops at its first level past a bound (same fronts, a fraction of the points);
    # when nothing meets the SLA the full sweep runs again, so the error names what the full one would.
    limits = LevelLimits(max_ttft_ms=c.max_ttft_ms, max_itl_ms=c.max_itl_ms, min_tok_s_per_user=c.min_tok_s_per_user,
                         percentile=c.percentile)
    curves = sweep(limits)
    try:
        return curves, _fronts(curves, constraints, serving)
    except InfeasibleError:
        if not limits.active:
            raise
    restart()
    curves = sweep(None)
    return curves, _fronts(curves, constraints, serving)


def _rate_fronts(perf: RooflineModel, topologies: list[Topology], traffic: Workload, constraints: Constraints,
                 serving: str, depths: tuple[int, ...], advance: Callable[[Topology], None]
                 ) -> tuple[RateCurves, _Fronts]:
    """Open loop: every instance count of every topology that carries the rate, composed; when none does, an
    error that says how many GPUs would, and when none meets the SLA, the best latency that can be had."""
    spec, c = perf.model, constraints
    prefill_depths, aggregated_depths = _swept_mtp_depths(spec, serving, depths)
    curves = sweep_rate_curves(perf, topologies, traffic, max_gpus=c.max_gpus, prefill_mtp_depths=prefill_depths,
                               aggregated_mtp_depths=aggregated_depths, on_topology=advance)
    if not spec.is_hybrid:
        curves = replace(curves, prefill=_at_decode_depths(curves.prefill, depths))

    def compose(limits: Constraints) -> tuple[list[ComposedPoint], list[AggregatedPoint]]:
        rate = curves.offered_rps
        points = (compose_rate_disaggregated(curves.prefill, curves.decode, limits, offered_rps=rate)
                  if serving != "agg" else [])
        aggregated = (compose_rate_aggregated(curves.aggregated, limits, offered_rps=rate)
                      if serving != "disagg" else [])
        return points, aggregated

    points, aggregated = compose(c)
    if not points and not aggregated:
        raise _rate_failure(curves, c, serving, *compose(Constraints(max_gpus=c.max_gpus, percentile=c.percentile,
                                                                     pairing=c.pairing)))
    front = combined_front(points)
    agg_front = pareto_front(aggregated, x="total_tok_s_per_gpu", y="tok_s_per_user")
    return curves, _Fronts(points, front, agg_front, which_wins(front, agg_front))


def _rate_failure(curves: RateCurves, c: Constraints, serving: str, carried: list[ComposedPoint],
                  carried_agg: list[AggregatedPoint]) -> InfeasibleError:
    """Why nothing is left at the offered rate: no deployment carries it in the budget (and how many GPUs
    would), or every one that does breaks the SLA (and the best latency one reaches)."""
    rate = curves.offered_rps
    if not carried and not carried_agg:
        def fewest(role: Role) -> int | None:
            need = [t.num_gpus * n for (t, r), n in curves.instances_needed.items() if r is role]
            return min(need) if need else None

        options = []
        agg, prefill, decode = fewest(Role.BOTH), fewest(Role.PREFILL), fewest(Role.DECODE)
        if serving != "disagg" and agg is not None:
            options.append(agg)
        if serving != "agg" and prefill is not None and decode is not None:
            options.append(prefill + decode)
        needed = min(options) if options else None
        if needed is not None and needed > c.max_gpus:
            return InfeasibleError(
                f"no deployment of up to {c.max_gpus} GPUs carries {rate:g} req/s: every one saturates (its queue "
                f"and TTFT grow without bound); about {needed} GPUs would carry it", field="--gpus",
                fix=f"allow at least {needed} GPUs (--gpus {needed}) or offer a lower --request-rate")
        return InfeasibleError(f"no deployment of up to {c.max_gpus} GPUs carries {rate:g} req/s", field="--gpus",
                               fix="allow more GPUs (--gpus) or offer a lower --request-rate")
    pct = c.percentile
    every = [*carried, *carried_agg]
    best_ttft = min(p.ttft_ms for p in every)
    best_itl = min(p.itl_ms for p in every)
    where = f"at {rate:g} req/s within {c.max_gpus} GPUs"
    if c.max_ttft_ms is not None and best_ttft > c.max_ttft_ms:
        return InfeasibleError(f"no deployment meets TTFT <= {c.max_ttft_ms:g} ms ({pct}) {where}; the best TTFT is "
                               f"{best_ttft:,.0f} ms", field="--max-ttft-ms",
                               fix=f"raise the TTFT limit to at least {math.ceil(best_ttft)} ms, or allow more GPUs")
    bound = c.max_itl_for_users_ms
    if bound is not None and best_itl > bound:
        field = "--min-tok-s-user" if c.max_itl_ms is None or bound < c.max_itl_ms else "--max-itl-ms"
        return InfeasibleError(f"no deployment meets ITL <= {bound:g} ms ({pct}) {where}; the best ITL is "
                               f"{best_itl:.1f} ms ({1000 / best_itl:.1f} tok/s/user)", field=field,
                               fix=f"relax {field} (the best deployment gives {best_itl:.1f} ms)")
    return InfeasibleError(f"no deployment meets the TTFT and ITL limits together ({pct}) {where} (the best TTFT "
                           f"is {best_ttft:,.0f} ms, the best ITL {best_itl:.1f} ms, on different deployments)",
                           field="--max-ttft-ms", fix="relax --max-ttft-ms or --max-itl-ms, or allow more GPUs")


def _print_fronts(fronts: _Fronts, title: str, setting: str, elapsed: float, html: Path | None) -> None:
    """The PD table, the aggregated table and which mode wins where."""
    if fronts.front:
        table = Table(title=title, title_justify="left")
        rated = fronts.front[0].decode.offered_rps is not None
        for col in ("deployment (xPyD)", "GPUs", "tok/s/GPU", "out tok/s/GPU", "tok/s/user", "TTFT ms", "ITL ms",
                    *(("P req/s", "D req/s") if rated else ("P conc", "D conc"))):
            table.add_column(col, justify="left" if col.startswith("deployment") else "right")
        for p in reversed(fronts.front):  # throughput end first
            table.add_row(p.name, str(p.num_gpus), f"{p.total_tok_s_per_gpu:,.0f}", f"{p.output_tok_s_per_gpu:,.0f}",
                          f"{p.tok_s_per_user:.1f}",
                          f"{p.ttft_ms:,.0f}", f"{p.itl_ms:.2f}", _load(p.prefill), _load(p.decode))
        console.print(table)
    if fronts.aggregated:
        _print_aggregated(fronts.aggregated, f"{setting}: aggregated front (prefill + decode on every instance, "
                                             "chunked prefill)")
    for w in fronts.winners:
        console.print(f"{w.mode} wins from {w.from_tok_s_per_user:.1f} to {w.to_tok_s_per_user:.1f} tok/s/user "
                      f"(up to {w.best_tok_s_per_gpu:,.0f} tok/s/GPU)", highlight=False)
    console.print(f"{len(fronts.front)} PD and {len(fronts.aggregated)} aggregated deployments on the fronts; "
                  f"computed in {elapsed:.2f} s" + (f"; chart: {html}" if html else ""), highlight=False)


@dataclass(frozen=True)
class _Fronts:
    points: list[ComposedPoint]
    front: list[ComposedPoint]
    aggregated: list[AggregatedPoint]
    winners: list[Winner]


def _fronts(curves: Curves, constraints: Constraints, serving: str) -> _Fronts:
    """Both modes' fronts; a mode that nothing satisfies is left empty when the other one has points."""
    points: list[ComposedPoint] = []
    aggregated: list[AggregatedPoint] = []
    failure: InfeasibleError | None = None
    if serving in ("both", "disagg"):
        try:
            points = compose_disaggregated(curves.prefill, curves.decode, constraints)
        except InfeasibleError as exc:
            failure = exc
    if serving in ("both", "agg"):
        aggregated = compose_aggregated(curves.aggregated, constraints)
    if not points and not aggregated:
        raise failure or InfeasibleError("no aggregated deployment meets the limits", field="--max-itl-ms",
                                         fix="raise the TTFT/ITL limits or allow more GPUs")
    front = combined_front(points)
    agg_front = pareto_front(aggregated, x="total_tok_s_per_gpu", y="tok_s_per_user")
    return _Fronts(points, front, agg_front, which_wins(front, agg_front))


def _agg_dict(p: AggregatedPoint) -> dict[str, object]:
    return {"deployment": p.name, "num_gpus": p.num_gpus, "topology": p.topology.name, "mtp": p.topology.mtp,
            "num_instances": p.num_instances, "concurrency_per_instance": p.concurrency_per_instance,
            "total_tok_s_per_gpu": round(p.total_tok_s_per_gpu, 1),
            "output_tok_s_per_gpu": round(p.output_tok_s_per_gpu, 1), "tok_s_per_user": round(p.tok_s_per_user, 2),
            "ttft_ms": round(p.ttft_ms, 1), "itl_ms": round(p.itl_ms, 3),
            **_rates_per_instance(rps_per_instance=p.instance.offered_rps)}


def _load(m: ServingMetrics) -> str:
    """An instance's load: its offered requests/s (open loop) or its clients (closed loop)."""
    return f"{m.offered_rps:.3g}" if m.offered_rps is not None else str(m.concurrency)


def _print_aggregated(front: list[AggregatedPoint], title: str) -> None:
    table = Table(title=title, title_justify="left")
    rated = bool(front) and front[0].instance.offered_rps is not None
    for col in ("deployment (replicas)", "GPUs", "tok/s/GPU", "out tok/s/GPU", "tok/s/user", "TTFT ms", "ITL ms",
                "req/s/inst" if rated else "conc/inst"):
        table.add_column(col, justify="left" if col.startswith("deployment") else "right")
    for p in reversed(front):
        table.add_row(p.name, str(p.num_gpus), f"{p.total_tok_s_per_gpu:,.0f}", f"{p.output_tok_s_per_gpu:,.0f}",
                      f"{p.tok_s_per_user:.1f}",
                      f"{p.ttft_ms:,.0f}", f"{p.itl_ms:.2f}", _load(p.instance))
    console.print(table)


@dataclass(frozen=True)
class Recommendation:
    """The best deployment of each mode under the SLA (most total tok/s/GPU) and which one wins, by how much."""

    disaggregated: ComposedPoint | None
    aggregated: AggregatedPoint | None

    @property
    def winner(self) -> ComposedPoint | AggregatedPoint | None:
        candidates = [p for p in (self.disaggregated, self.aggregated) if p is not None]
        return max(candidates, key=lambda p: p.total_tok_s_per_gpu) if candidates else None

    @property
    def margin(self) -> float | None:
        """Winner's tok/s/GPU over the other mode's best (None when one mode has no point)."""
        if self.disaggregated is None or self.aggregated is None:
            return None
        a, b = self.disaggregated.total_tok_s_per_gpu, self.aggregated.total_tok_s_per_gpu
        return max(a, b) / min(a, b) if min(a, b) > 0 else None

    def as_json(self) -> dict[str, object]:
        w = self.winner
        return {"winner": None if w is None else w.mode, "winner_num_gpus": None if w is None else w.num_gpus,
                "margin": self.margin,
                "disaggregated": None if self.disaggregated is None else _point_dict(self.disaggregated),
                "aggregated": None if self.aggregated is None else _agg_dict(self.aggregated)}


def recommend(fronts: _Fronts) -> Recommendation:
    """Every front point already meets the SLA and the per-user floor: the most tok/s/GPU of each mode wins."""
    best_pd = max(fronts.front, key=lambda p: p.total_tok_s_per_gpu, default=None)
    best_agg = max(fronts.aggregated, key=lambda p: p.total_tok_s_per_gpu, default=None)
    return Recommendation(best_pd, best_agg)


def _operating_point(point: ComposedPoint | AggregatedPoint, ctx: RecipeContext, rate: float | None
                     ) -> dict[str, object]:
    """#46: what `plan --from` / `export --from` deploy for a front point; its benchmark runs the point's clients
    (closed loop; an open-loop point's load is its rate, in the JSON beside it)."""
    clients = point.num_decode * point.decode.concurrency if isinstance(point, ComposedPoint) else \
        point.num_instances * point.instance.concurrency
    return ctx.operating_point(operating_deployment(point), "frontier",
                               concurrency=() if rate is not None else (clients,)).as_json()


def operating_deployment(point: ComposedPoint | AggregatedPoint) -> Deployment:
    """The deployment with --max-num-seqs at the point's running requests per DP rank: vLLM then admits no more
    than the batch that holds the SLA (the rest wait in the router's and the server's queues)."""
    from tuner.operating_point import at_running_requests

    running = (point.instance if isinstance(point, AggregatedPoint) else point.decode).running_requests
    return at_running_requests(point.deployment, running)


# Two modes within 1% of each other's tok/s/GPU: a tie, not a win (the model's own error is larger).
TIE_MARGIN = 1.01


def why_it_wins(pick: Recommendation, c: Constraints) -> str:
    """Why the winner wins, in a platform engineer's words: which side of the work binds and what the winner does
    about it, with the figures the tables print."""
    w = pick.winner
    if w is None:
        return ""
    itl = f"ITL {w.itl_ms:.1f} ms ({c.percentile})"
    bound = c.max_itl_for_users_ms
    limit = f" under the {bound:g} ms limit" if bound else ""
    if isinstance(w, ComposedPoint):
        per_rank = w.decode.running_requests / max(1, w.decode_topology.dp)
        mtp = f" with MTP{w.decode_topology.mtp}" if w.decode_topology.mtp else ""
        text = (f"decode-bound: {itl}{limit} holds at {per_rank:.0f} running requests per decode rank only on a "
                f"dedicated decode {w.decode_topology.name}{mtp}; {w.num_prefill} prefill "
                f"{w.prefill_topology.name} instance(s) take the prompts, so no prompt stalls a decode step")
        other = pick.aggregated
        if other is not None:
            text += (f" (aggregated {other.name}, whose decode steps wait for chunked prompts, reaches "
                     f"{other.total_tok_s_per_gpu:,.0f} tok/s/GPU)")
        return text
    text = (f"every GPU serves prompts and answers: {w.num_instances} x {w.topology.name} replicas keep {itl}{limit} "
            f"with chunked prefill at {w.instance.concurrency} requests each, and no GPU waits for KV transfers")
    other = pick.disaggregated
    if other is not None:
        text += (f" (splitting prefill from decode, {other.name}, leaves one side's GPUs short of work: "
                 f"{other.total_tok_s_per_gpu:,.0f} tok/s/GPU)")
    return text


def _print_recommendation(pick: Recommendation, c: Constraints, setting: str, ctx: RecipeContext, *,
                          offered_rps: float | None = None, mode: str = "both") -> None:
    sla = ", ".join(part for part in (
        f"TTFT <= {c.max_ttft_ms:g} ms" if c.max_ttft_ms else "", f"ITL <= {c.max_itl_ms:g} ms" if c.max_itl_ms else "",
        f">= {c.min_tok_s_per_user:g} tok/s/user" if c.min_tok_s_per_user else "") if part) or "no SLA"
    console.print(f"\n[bold]Recommendation[/] for {setting}; {sla} at {c.percentile}:", highlight=False)
    for label, p in (("disaggregated", pick.disaggregated), ("aggregated", pick.aggregated)):
        if p is None:
            swept = mode == "both" or label.startswith(mode)
            console.print(f"  best {label}: " + ("none meets the limits" if swept else f"not swept (--mode {mode})"),
                          highlight=False)
            continue
        console.print(f"  best {label}: {p.name} on {p.num_gpus} GPUs: {p.total_tok_s_per_gpu:,.0f} tok/s/GPU total "
                      f"({p.output_tok_s_per_gpu:,.0f} output), "
                      f"{p.tok_s_per_user:.1f} tok/s/user, TTFT {p.ttft_ms:,.0f} ms, ITL {p.itl_ms:.2f} ms "
                      f"({c.percentile})", highlight=False)
    winner = pick.winner
    if winner is None:
        return
    if offered_rps is not None:  # one rate for every deployment: more tok/s/GPU is fewer GPUs
        margin = f" (the other mode needs x{pick.margin:.2f} its GPUs)" if pick.margin else ""
        console.print(f"  fewest GPUs that carry {offered_rps:.4g} req/s under the limits: {winner.num_gpus}",
                      highlight=False)
    else:
        margin = f" by x{pick.margin:.2f} tok/s/GPU" if pick.margin else ""
    if mode != "both":
        console.print(f"  [bold]recommended[/] ({winner.mode} only: --mode {mode}): {winner.name}", highlight=False)
    elif pick.margin is not None and pick.margin < TIE_MARGIN:
        console.print(f"  [bold]a tie[/]: both modes are within {TIE_MARGIN - 1:.0%} of each other's tok/s/GPU; the "
                      f"commands below deploy {winner.name} ({winner.mode})", highlight=False)
    else:
        console.print(f"  [bold]{winner.mode} wins{margin}[/]: {winner.name}", highlight=False)
    console.print(f"  why: {why_it_wins(pick, c)}", highlight=False, soft_wrap=True)
    print("\n" + export_deployment(operating_deployment(winner), "vllm", ctx), end="")  # a script: never wrapped
