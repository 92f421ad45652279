"""`topotune live-check`: a running deployment's measured latencies against topotune's prediction for it."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.table import Table

from tuner.cli._app import (
    CalibrationOpt,
    HardwareFileOpt,
    HardwareOpt,
    ModelArg,
    app,
    as_flags,
    calibration_for,
    console,
    print_json,
)
from tuner.cli._knobs import DEPLOYMENT_FLAGS
from tuner.cli._traffic import live_window
from tuner.cluster import ClusterKey, ClusterStore
from tuner.hardware import get_gpu
from tuner.live import check_deployment, engine_from_flags, record_window
from tuner.models import load_model
from tuner.perf import RooflineModel


@app.command("live-check", help="Compare a running deployment's measured TTFT/ITL over a window of its /metrics "
                                "with what topotune predicts for that deployment at that traffic; print the "
                                "factor; --record stores the window in the cluster store as a measured run.")
@as_flags(DEPLOYMENT_FLAGS)
def live_check(
    model: ModelArg,
    deployment: Annotated[str, typer.Option(help="What runs: TP8, 2x:TP4, 1P:TP4,1D:TEP8 or as frontier prints "
                                                 "it ('2P(TP4) 1D(TEP8 MTP3)').")],
    serve_flags: Annotated[str, typer.Option(help="The vllm serve flags it runs with ('--max-num-seqs 128 "
                                                  "--gpu-memory-utilization 0.9'); flags the model does not read "
                                                  "are listed and ignored.")] = "",
    hardware: HardwareOpt = "gb300",
    hardware_file: HardwareFileOpt = None,
    calibration: CalibrationOpt = None,
    from_metrics: Annotated[list[str] | None, typer.Option(
        "--from-metrics", help="A server's /metrics URL (repeat, or comma-separate, for every server).")] = None,
    window: Annotated[str, typer.Option(help="--from-metrics: time between the two scrapes.")] = "10m",
    from_prometheus: Annotated[str | None, typer.Option("--from-prometheus", help="Prometheus's base URL.")] = None,
    query: Annotated[str, typer.Option(help="--from-prometheus: label matchers of the deployment's series.")] = "",
    range_: Annotated[str, typer.Option("--range", help="--from-prometheus: the window back from now.")] = "1h",
    record: Annotated[bool, typer.Option(help="Store the window as a measured run in the cluster store.")] = False,
    storage: Annotated[str, typer.Option(help="--record: the study database URL (its cluster store).")]
    = "sqlite:///topotune.db",
    cluster: Annotated[str | None, typer.Option(help="--record: the cluster's name (default from the GPU).")] = None,
    vllm_version: Annotated[str | None, typer.Option(help="--record: the vLLM version the servers run.")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    from tuner.deployment import parse_deployment

    engine, ignored = engine_from_flags(serve_flags)
    plan = parse_deployment(deployment, **engine)
    spec = load_model(model)
    gpu = get_gpu(hardware, hardware_file)
    for g in plan.groups:
        g.topology.check(spec)
    urls = [u for part in (from_metrics or []) for u in part.split(",") if u.strip()]
    live = live_window(urls[0] if urls else None, urls[1:], window, from_prometheus, query, range_)
    perf = RooflineModel(spec, gpu, calibration_for(gpu.name, calibration))
    check = check_deployment(perf, plan, live)
    stored = None
    if record:
        key = ClusterKey.of(gpu, vllm_version, cluster)
        stored = record_window(check, ClusterStore(storage), key, model_name=spec.name, model_path=str(model),
                               label=f"{plan.name} {' '.join(live.sources)}", at_s=time.time())
    if json_out:
        print_json({**check.as_json(), "model": spec.name, "gpu": gpu.name, "ignored_flags": ignored,
                    "recorded": None if stored is None else {"study": stored.study, "trial": stored.trial,
                                                             "storage": storage}})
        return
    console.print(f"{plan.name} on {plan.num_gpus} x {gpu.name}, {spec.name}: {live.requests:,.0f} requests in "
                  f"{live.window_s:,.0f} s ({live.arrival_rps:.4g} req/s), {live.workload.describe(load=False)}",
                  highlight=False)
    if check.prediction.saturated:
        console.print(f"[yellow]the model says this deployment cannot carry the window's rate:[/] "
                      f"{check.prediction.saturated}", highlight=False)
    table = Table(title="measured / predicted (ms; factor = measured / predicted)", title_justify="left")
    for col in ("", "measured mean", "predicted mean", "factor", "p50 m/p", "p90 m/p", "p99 m/p"):
        table.add_column(col, justify="right")
    for label, which, measured, predicted in (("TTFT", "ttft", check.measured_ttft, check.prediction.ttft),
                                              ("ITL", "itl", check.measured_itl, check.prediction.itl)):
        factor = check.factor(which)
        table.add_row(label, f"{measured.mean_ms:,.2f}", "-" if predicted is None else f"{predicted.mean_ms:,.2f}",
                      "-" if factor is None else f"{factor:.3g}x",
                      *(f"{measured.at(p):,.1f}/" + ("-" if predicted is None else f"{predicted.at(p):,.1f}")
                        for p in ("p50", "p90", "p99")))
    console.print(table)
    console.print(f"ITL measured from {check.itl_source}; percentiles at the histogram buckets' resolution, means "
                  "exact", highlight=False)
    if ignored:
        console.print(f"flags the model does not read: {' '.join(ignored)}", highlight=False)
    if stored is not None:
        console.print(f"recorded in {storage} as {stored.study} (trial {stored.trial})", highlight=False)
