"""`topotune replay`: a request stream replayed through a deployment, event by event (tuner/replay)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from tuner.cli._app import (
    CalibrationOpt,
    HardwareFileOpt,
    HardwareOpt,
    JsonOpt,
    ModelArg,
    app,
    as_flags,
    console,
    print_json,
)
from tuner.cli._knobs import DEPLOYMENT_FLAGS, knob_options
from tuner.cli._traffic import WorkloadOpt, load_workload
from tuner.replay import ReplayRequest, replay_stream

# The replay request's fields as this command's flags (its errors go through them).
REPLAY_FLAGS: dict[str, str] = {**DEPLOYMENT_FLAGS, **{name: "--" + name.replace("_", "-") for name in (
    "request_rate", "concurrency", "arrival", "burstiness_cv", "router", "turns", "think_ms", "num_requests",
    "max_ttft_ms", "max_itl_ms", "long_prefill_token_threshold", "max_horizon_s", "seed", "workload")},
    "warmup_share": "--warmup"}


@app.command(name="replay")
@knob_options()
@as_flags(REPLAY_FLAGS)
def replay_command(
    model: ModelArg,
    hardware: HardwareOpt = "gb300",
    deployment: Annotated[str, typer.Option(help='"2P:TP4,1D:TP8" (PD) or "2x:TP8" (replicas), "TP8" (one).')]
    = "TP8",
    workload: WorkloadOpt = None,
    isl: Annotated[int, typer.Option(help="Input tokens per request (without --workload).")] = 8192,
    osl: Annotated[int, typer.Option(help="Output tokens per request (without --workload).")] = 1024,
    request_rate: Annotated[float | None, typer.Option(help="Open loop: requests/s for the whole deployment.")]
    = None,
    concurrency: Annotated[int | None, typer.Option(help="Closed loop: clients, each sending its next request "
                                                          "when its answer ends.")] = None,
    arrival: Annotated[str | None, typer.Option(
        help="Open-loop arrivals: poisson, gamma (bursty, --burstiness-cv) or trace (its timestamps, rescaled to "
             "--request-rate).")] = None,
    burstiness_cv: Annotated[float, typer.Option(help="Gamma arrivals: inter-arrival CV (1 = Poisson).")] = 1.0,
    router: Annotated[str, typer.Option(help="cache_aware or round_robin (vllm-router's --policy names), or "
                                             "least_loaded (fewest in flight).")] = "cache_aware",
    turns: Annotated[int | None, typer.Option(help="Multi-turn sessions of a distribution: turns each.")] = None,
    think_ms: Annotated[float, typer.Option(help="Sessions: pause between an answer and the next turn.")] = 1000.0,
    num_requests: Annotated[int | None, typer.Option(help="Requests replayed (a trace: its first N; a distribution: "
                                                           "1,000 by default).")] = None,
    warmup: Annotated[float, typer.Option(help="Share of the requests replayed before measuring (warm server).")]
    = 0.0,
    max_ttft_ms: Annotated[float | None, typer.Option(help="SLA: TTFT bound for goodput.")] = None,
    max_itl_ms: Annotated[float | None, typer.Option(help="SLA: ITL bound for goodput.")] = None,
    long_prefill_token_threshold: Annotated[int, typer.Option(help="vLLM --long-prefill-token-threshold.")] = 0,
    max_horizon_s: Annotated[float | None, typer.Option(
        help="Stop the replay past this simulated time (default: 10 x the sending window + 600 s).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of sampled lengths and arrivals.")] = 0,
    calibration: CalibrationOpt = None,
    hardware_file: HardwareFileOpt = None,
    html: Annotated[Path | None, typer.Option(help="Write the TTFT CDF and the queue/KV timeline here.")] = None,
    json_out: JsonOpt = False,
    knobs: dict[str, Any] | None = None,
) -> None:
    """Replay a request stream through a deployment as vLLM's scheduler runs it: per-request TTFT and ITL."""
    traffic = load_workload(workload, isl=isl, osl=osl, concurrency=(1,))
    answer = replay_stream(ReplayRequest(
        model=model, workload=traffic, deployment=deployment, hardware=hardware, hardware_file=hardware_file,
        calibration=calibration, knobs=knobs or {}, request_rate=request_rate, concurrency=concurrency,
        arrival=arrival, burstiness_cv=burstiness_cv, router=router, turns=turns,  # type: ignore[arg-type]
        think_ms=think_ms, num_requests=num_requests, warmup_share=warmup, max_ttft_ms=max_ttft_ms,
        max_itl_ms=max_itl_ms, long_prefill_token_threshold=long_prefill_token_threshold,
        max_horizon_s=max_horizon_s, seed=seed))
    report = answer.report
    if html is not None:
        from tuner.report import replay_figures, write_figures

        write_figures(html, f"{answer.model}: {report.deployment}, {report.arrival}", replay_figures(report))
    if json_out:
        print_json(answer.as_json())
        return
    table = Table(title=f"{answer.model} on {report.num_gpus} x {answer.gpu}, {report.deployment}: "
                        f"{answer.workload}; {report.arrival}", title_justify="left")
    for col in ("", "mean", "p50", "p90", "p99"):
        table.add_column(col, justify="right")
    for name, p in (("TTFT ms", report.ttft_ms), ("ITL ms", report.itl_ms), ("token gap ms", report.token_gap_ms),
                    ("E2E ms", report.e2e_ms)):
        table.add_row(name, f"{p.mean:,.1f}", f"{p.p50:,.1f}", f"{p.p90:,.1f}", f"{p.p99:,.1f}")
    console.print(table)
    console.print(
        f"{len(report.requests):,} requests measured ({report.warmup_requests:,} warm-up) over "
        f"{report.duration_s:,.1f} s: {report.request_rps:.2f} req/s, {report.total_tok_s_per_gpu:,.0f} tok/s/GPU "
        f"({report.output_tok_s:,.0f} output tok/s); prefix cache served {report.prefix_hit_share:.1%} of input "
        f"tokens; {report.preemptions:,} preemptions", highlight=False)
    if max_ttft_ms is not None or max_itl_ms is not None:
        console.print(f"SLA met by {report.sla_attainment:.1%} of requests: goodput {report.goodput_rps:.2f} req/s",
                      highlight=False)
    console.print(report.queue.describe(), highlight=False)
