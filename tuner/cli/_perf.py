"""`topotune simulate` (one instance, a concurrency sweep) and `topotune frontier` (the combined PD front)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from tuner.advise import TIE_MARGIN, Advice, AdviseRequest, ServeOptions, Sla, advise
from tuner.cli._app import (
    CalibrationOpt,
    HardwareFileOpt,
    HardwareOpt,
    JsonOpt,
    ModelArg,
    app,
    as_flags,
    calibration_for,
    console,
    err_console,
    print_json,
    write_script,
)
from tuner.cli._knobs import INSTANCE_FLAGS, KNOB_FLAGS, knob_options
from tuner.cli._traffic import ArrivalOpt, RequestRateOpt, WorkloadOpt, load_workload
from tuner.errors import ConfigError, TopotuneError, rename_refs
from tuner.frontier import AggregatedPoint
from tuner.hardware import get_gpu
from tuner.metrics import ServingMetrics
from tuner.models import load_model
from tuner.perf import RooflineModel, predict_traffic
from tuner.report import composed_front_figure, write_figures
from tuner.topology import Role, Topology


def _positive(**values: int | float | None) -> None:
    for name, value in values.items():
        if value is not None and value < 1:
            raise ConfigError(f"must be >= 1, got {value}", field=f"--{name.replace('_', '-')}",
                              fix="give a positive number")


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
@knob_options()
@as_flags(INSTANCE_FLAGS)
def simulate(
    model: ModelArg,
    hardware: HardwareOpt = "gb300",
    topology: Annotated[str, typer.Option(help="TP8, TEP8, DEP8, TP4DP4+EP, ...")] = "TEP8",
    role: Annotated[str, typer.Option(help="prefill, decode (PD roles) or aggregated (both on one instance, "
                                             "chunked prefill).")] = "decode",
    isl: Annotated[int, typer.Option(help="Input tokens per request.")] = 8192,
    osl: Annotated[int, typer.Option(help="Output tokens per request.")] = 1024,
    concurrency: Annotated[str, typer.Option(help="Comma-separated levels, e.g. 1,8,64,256.")] = "1,8,64,256",
    calibration: CalibrationOpt = None,
    hardware_file: HardwareFileOpt = None,
    workload: WorkloadOpt = None,
    request_rate: RequestRateOpt = None,
    arrival: ArrivalOpt = "poisson",
    json_out: JsonOpt = False,
    knobs: dict[str, Any] | None = None,
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
    topo = Topology.parse(topology, role=the_role, **knobs or {})
    topo.check(spec)
    perf = RooflineModel(spec, gpu, calibration_for(gpu.name, calibration))
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
                        f"{f' MTP{topo.mtp}' if topo.mtp else ''} {role_name}: {traffic.describe()}",
                  title_justify="left")
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


# The request fields `advise` names in its errors, as `frontier`'s flags: the one table an error goes through.
ADVISE_FLAGS: dict[str, str] = {
    "model": "MODEL", "workload": "--workload", "hardware": "--hardware", "hardware_file": "--hardware-file",
    "gpus": "--gpus", "request_rate": "--request-rate", "arrival": "--arrival", "weights": "--weights",
    "calibration": "--calibration", "sla.max_ttft_ms": "--max-ttft-ms", "sla.max_itl_ms": "--max-itl-ms",
    "sla.min_tok_s_user": "--min-tok-s-user", "sla.percentile": "--percentile", "serve.mode": "--mode",
    "serve.max_mtp": "--max-mtp", "serve.vllm_version": "--vllm-version", "replay_verify": "--replay-verify",
    **KNOB_FLAGS,
}


@contextmanager
def _as_flags() -> Iterator[None]:
    """An error of the library, its request fields named as this command's flags."""
    try:
        yield
    except TopotuneError as exc:
        raise exc.renamed(ADVISE_FLAGS) from None


@app.command(help="Sweep topologies as PD prefill/decode and as aggregated instances; print both "
                  "Pareto fronts and which mode wins where.")
@knob_options(exclude=("mtp",))  # --max-mtp sweeps it
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
    replay_verify: Annotated[bool | None, typer.Option(
        "--replay-verify/--no-replay-verify",
        help="Replay the best deployments request by request through vLLM's scheduler (`topotune replay`) and let "
             "the replay decide which one meets the SLA, the fewest GPUs for a rate and the knobs it searches "
             "(docs/workloads.md). Default: on whenever an SLA bound is given; --no-replay-verify answers from the "
             "steady-state model alone.")] = None,
    json_out: JsonOpt = False,
    out: Annotated[Path | None, typer.Option(help="Write the recommended script to this file.")] = None,
    knobs: dict[str, Any] | None = None,
) -> None:
    """Long only by its typer options (one per line with their help, as typer declares them); the body parses
    them into an AdviseRequest and renders the Advice. Its help text is the decorator's `help=`."""
    _positive(isl=isl, osl=osl)
    with _as_flags():
        serve = ServeOptions(mode=serving, max_mtp=max_mtp, vllm_version=vllm_version,  # type: ignore[arg-type]
                             knobs=knobs or {})
        sla = Sla(max_ttft_ms=max_ttft_ms, max_itl_ms=max_itl_ms, min_tok_s_user=min_tok_s_user,
                  percentile=percentile)  # type: ignore[arg-type]
        traffic = load_workload(workload, isl=isl, osl=osl, concurrency=(1,))
        request = AdviseRequest(model=model, workload=traffic, hardware=hardware, hardware_file=hardware_file,
                                gpus=gpus, request_rate=request_rate, arrival=arrival,  # type: ignore[arg-type]
                                sla=sla, serve=serve, calibration=calibration,
                                weights=weights, replay_verify=replay_verify)
        with _TopologyProgress(shown=not json_out and err_console.is_terminal) as progress:
            advice = advise(request, progress=progress)
    if html is not None:
        write_figures(html, advice.title, [composed_front_figure(advice.fronts.points, advice.fronts.front,
                                                                 advice.title, advice.fronts.aggregated)])
    if json_out:
        print_json(advice.as_json())
        if out is not None and advice.commands:
            write_script(advice.commands, out)
        return
    _print_fronts(advice, html)
    _print_recommendation(advice, out)


class _TopologyProgress:
    """The sweep's transient progress bar on a terminal; nothing (and no import of rich.progress) otherwise."""

    def __init__(self, *, shown: bool) -> None:
        self._progress: Any = None
        self._task: Any = None
        if shown:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                      TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(),
                                      console=err_console, transient=True)
            self._task = self._progress.add_task("predicting topologies", total=None)

    def __enter__(self) -> _TopologyProgress:
        if self._progress is not None:
            self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def start(self, total: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, total=total)

    def advance(self, topo: Topology) -> None:
        if self._progress is not None:
            self._progress.update(self._task, advance=1, description=f"predicting {topo.name:<12}")

    def restart(self) -> None:
        if self._progress is not None:
            self._progress.reset(self._task)


def _print_fronts(advice: Advice, html: Path | None) -> None:
    """The PD table, the aggregated table and which mode wins where."""
    fronts = advice.fronts
    if fronts.front:
        table = Table(title=advice.title, title_justify="left")
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
        _print_aggregated(fronts.aggregated, f"{advice.setting}: aggregated front (prefill + decode on every "
                                             "instance, chunked prefill)")
    for w in fronts.winners:
        console.print(f"{w.mode} wins from {w.from_tok_s_per_user:.1f} to {w.to_tok_s_per_user:.1f} tok/s/user "
                      f"(up to {w.best_tok_s_per_gpu:,.0f} tok/s/GPU)", highlight=False)
    console.print(f"{len(fronts.front)} PD and {len(fronts.aggregated)} aggregated deployments on the fronts; "
                  f"computed in {advice.elapsed_s:.2f} s" + (f"; chart: {html}" if html else ""), highlight=False)


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


def _print_recommendation(advice: Advice, out: Path | None = None) -> None:
    """The recommendation in words; its script on stdout after them, or in `out`."""
    pick, sla, offered_rps = advice.recommendation, advice.request.sla, advice.offered_rps
    console.print(f"\n[bold]Recommendation[/] for {advice.setting}; {sla.describe()} at {sla.percentile}:",
                  highlight=False)
    mode = advice.request.serve.mode
    for label, p in (("disaggregated", pick.disaggregated), ("aggregated", pick.aggregated)):
        if p is None:
            swept = mode == "both" or label.startswith(mode)
            console.print(f"  best {label}: " + ("none meets the limits" if swept else f"not swept (--mode {mode})"),
                          highlight=False)
            continue
        console.print(f"  best {label}: {p.name} on {p.num_gpus} GPUs: {p.total_tok_s_per_gpu:,.0f} tok/s/GPU total "
                      f"({p.output_tok_s_per_gpu:,.0f} output), "
                      f"{p.tok_s_per_user:.1f} tok/s/user, TTFT {p.ttft_ms:,.0f} ms, ITL {p.itl_ms:.2f} ms "
                      f"({sla.percentile})", highlight=False)
    winner = pick.winner
    if winner is None:
        if out is not None:
            err_console.print(f"no recommendation: nothing written to {out}", highlight=False)
        return
    if offered_rps is not None:  # one rate for every deployment: more tok/s/GPU is fewer GPUs
        margin = f" (the other mode needs x{pick.margin:.2f} its GPUs)" if pick.margin else ""
        fewest: object = winner.num_gpus
        if advice.verification is not None:
            fewest = (f"{advice.recommended_num_gpus or 'none the replay checked'} (decided by the replay; the "
                      f"steady-state model says {winner.num_gpus})")
        console.print(f"  fewest GPUs that carry {offered_rps:.4g} req/s under the limits: {fewest}", highlight=False)
    else:
        margin = f" by x{pick.margin:.2f} tok/s/GPU" if pick.margin else ""
    if mode != "both":
        console.print(f"  [bold]recommended[/] ({winner.mode} only: --mode {mode}): {winner.name}", highlight=False)
    elif pick.tie:
        deploys = ("the replay decides which to deploy (below)" if advice.verification is not None else
                   f"the commands below deploy {winner.name} ({winner.mode})")
        console.print(f"  [bold]a tie[/]: both modes are within {TIE_MARGIN - 1:.0%} of each other's tok/s/GPU; "
                      f"{deploys}", highlight=False)
    else:
        console.print(f"  [bold]{winner.mode} wins{margin}[/]: {winner.name}", highlight=False)
    console.print(f"  why: {advice.why}", highlight=False, soft_wrap=True)
    if advice.verification is not None:
        _print_verification(advice)
    elif advice.replay_skipped:  # an SLA the replay would decide by default, left to the steady-state model
        console.print(f"  decided by the {rename_refs(advice.decided_by, ADVISE_FLAGS)}", highlight=False,
                      soft_wrap=True)
    if out is None:
        print("\n" + (advice.commands or ""), end="")  # a script: never wrapped
    else:
        write_script(advice.commands or "", out)


def _print_verification(advice: Advice) -> None:
    """What the replay measured for each deployment it checked, and the one it keeps (the commands below)."""
    verified = advice.verification
    assert verified is not None
    pct = advice.request.sla.percentile
    table = Table(title=f"Replay verification (vLLM's scheduler, request by request; latencies at {pct})",
                  title_justify="left")
    closed = advice.offered_rps is None
    for col in ("deployment", "GPUs", *(("clients",) if closed else ()), "max-num-seqs", "knobs", "TTFT ms",
                "ITL ms", "within SLA", "verdict"):
        table.add_column(col, justify="left" if col in ("deployment", "knobs", "verdict") else "right")
    for v in verified.checked:
        r = v.report
        knobs = v.candidate.label.removeprefix("knob search: ") if v.candidate.label.startswith("knob") else ""
        table.add_row(r.deployment, str(r.num_gpus), *((str(v.candidate.concurrency),) if closed else ()),
                      "/".join(str(g.topology.max_num_seqs) for g in v.candidate.deployment.groups), knobs,
                      f"{r.ttft_ms.at(pct):,.0f}", f"{r.itl_ms.at(pct):.2f}", f"{r.sla_attainment:.1%}", v.reason)
    console.print(table)
    choice = verified.choice
    if choice is None:
        hint = (f"; it shows {verified.hint_deployment} on {verified.hint_gpus} GPUs carrying the rate within the "
                f"SLA (--gpus {verified.hint_gpus})" if verified.hint_gpus else "")
        console.print(f"  [bold]the replay finds no checked deployment within the SLA[/]: no commands{hint}",
                      highlight=False)
        return
    knobs = [g.topology.max_num_batched_tokens for g in choice.candidate.deployment.groups]
    clients = f" at {choice.candidate.concurrency} clients" if closed else ""
    console.print(f"  [bold]deploy (replay-verified)[/]: {choice.report.deployment} on {choice.report.num_gpus} GPUs"
                  f"{clients} (--max-num-batched-tokens {'/'.join(map(str, dict.fromkeys(knobs)))}, router "
                  f"{verified.router})", highlight=False)
    if verified.searched:
        console.print(f"  knobs searched by replay: {'; '.join(verified.searched)}", highlight=False,
                      soft_wrap=True)
