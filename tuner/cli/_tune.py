"""`topotune tune | studies | show | export`: run a campaign, list and inspect them, export a winner."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Group
from rich.live import Live
from rich.table import Table

from tuner.cli._app import TUNE_FLAGS, StorageOpt, app, as_flags, console, print_json, write_script
from tuner.errors import ConfigError, TopotuneError
from tuner.settings import TunerSettings


class _Progress:
    """A Rich live view fed by the driver's trial events: counts, the last events, the best points."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.counts: dict[str, dict[str, int]] = {}
        self.best: dict[str, tuple[float, float]] = {}
        self.recent: list[str] = []

    def __call__(self, event) -> None:  # type: ignore[no-untyped-def]
        c = self.counts.setdefault(event.phase, {"launched": 0, "done": 0, "failed": 0, "screened": 0})
        if event.kind in c:
            c[event.kind] += 1
        if event.kind == "failed":
            c["done"] += 1
        if event.values:
            x, y = event.values
            bx, by = self.best.get(event.phase, (0.0, 0.0))
            self.best[event.phase] = (max(bx, x), max(by, y))
        style = {"failed": "red", "screened": "dim", "done": "green"}.get(event.kind, "")
        text = f"{event.phase} #{event.number} {event.kind}: {event.label} {event.detail[:90]}"
        self.recent = [*self.recent[-7:], f"[{style}]{text}[/]" if style else text]

    def __rich__(self) -> Group:
        table = Table(title="topotune tune", title_justify="left")
        for col in ("phase", "done / budget", "failed", "screened out", "best tok/s/GPU", "best per-user"):
            table.add_column(col, justify="right" if col != "phase" else "left")
        for phase, c in self.counts.items():
            bx, by = self.best.get(phase, (0.0, 0.0))
            table.add_row(phase, f"{c['done']} / {self.budget}", str(c["failed"]), str(c["screened"]),
                          f"{bx:,.0f}", f"{by:,.1f}")
        return Group(table, *self.recent)


def _front_table(result) -> Table:  # type: ignore[no-untyped-def]
    table = Table(title=f"{result.name}: composed PD front from measured curves", title_justify="left")
    for col in ("point", "deployment", "GPUs", "tok/s/GPU", "out tok/s/GPU", "tok/s/user", "TTFT ms", "ITL ms"):
        table.add_column(col, justify="left" if col == "deployment" else "right")
    for row in result.front_table():
        table.add_row(str(row.point), row.deployment, str(row.gpus), f"{row.total_tok_s_per_gpu:,.0f}",
                      f"{row.output_tok_s_per_gpu:,.0f}", f"{row.tok_s_per_user:.1f}", f"{row.ttft_ms:,.0f}",
                      f"{row.itl_ms:.2f}")
    return table


def _phase_table(pr) -> Table:  # type: ignore[no-untyped-def]
    from tuner.study import PHASE_METRICS

    x, y = PHASE_METRICS[pr.phase]
    table = Table(title=f"{pr.phase} front ({pr.study_name}): {pr.launched} launched, {len(pr.points)} measured "
                        "points (a trial measures its config at several loads), "
                        + ", ".join(f"{k} {v}" for k, v in sorted(pr.counts.items())), title_justify="left")
    hits = any(p.metrics.prefix_hit_share for p in pr.front)  # a workload with shared prefixes
    for col in ("trial", "config", "load", x, y, "TTFT ms p50/p90", "ITL ms p50/p90",
                *(("prefix hits",) if hits else ())):
        table.add_column(col, justify="left" if col == "config" else "right")
    for p in sorted(pr.front, key=lambda p: -p.values[0]):
        topo = p.deployment.groups[0].topology
        m = p.metrics
        table.add_row(str(p.trial), topo.label(), p.level, f"{p.values[0]:,.0f}",
                      f"{p.values[1]:,.1f}", f"{m.ttft_ms_p50:,.0f}/{m.ttft_ms_at('p90'):,.0f}",
                      f"{m.itl_ms_p50:.2f}/{m.itl_ms_at('p90'):.2f}",
                      *((f"{m.prefix_hit_share:.0%}",) if hits else ()))
    return table


def _result_json(result, report: Path | None) -> dict:  # type: ignore[no-untyped-def]
    return {
        "name": result.name, "model": result.model, "gpu": result.gpu, "isl": result.isl, "osl": result.osl,
        "report": str(report) if report else None, "composition_error": result.composition_error,
        "phases": {phase: {"study": pr.study_name, "launched": pr.launched, "counts": pr.counts,
                           "failures": [f.as_json() for f in pr.failures[:50]],
                           "front": [{"trial": p.trial, "level": p.level, "stored_as": p.stored_as,
                                      "topology": p.deployment.groups[0].topology.label(),
                                      "params": p.params, "values": list(p.values),
                                      "metrics": p.metrics.model_dump()} for p in pr.front]}
                   for phase, pr in result.phases.items()},
        "composed_front": [row.as_json() for row in result.front_table()],
    }


def _preflight(the_space, model: Path, space: Path, executor: str, settings: TunerSettings,  # type: ignore[no-untyped-def]
               json_out: bool) -> None:
    """`topotune doctor` on the cluster the campaign will use; a failed check stops it before any trial."""
    from tuner.cli._doctor_report import render_report
    from tuner.doctor import run_doctor

    report = run_doctor(the_space, model, space_name=str(space), executor=executor,
                        ray_address=settings.ray_address, ray_port=settings.ray_port)
    if not report.ok:
        if json_out:
            print_json({"doctor": {**report.model_dump(mode="json"), "ok": False}})
        else:
            render_report(report)
        raise typer.Exit(report.exit_code)
    if not json_out:
        console.print(f"doctor: {len(report.checks)} checks passed on {len(report.nodes)} node(s)", highlight=False)


@app.command(help="Run (or resume) the campaign: one Optuna study per phase, then the composed PD front.")
def tune(
    model: Annotated[Path, typer.Argument(help="config.json or model folder")],
    space: Annotated[Path, typer.Option(help="search-space YAML (see search_spaces/)")],
    backend: Annotated[str, typer.Option(help="simulated | vllm")] = "simulated",
    trials: Annotated[int, typer.Option(help="launched trials per phase (screened-out configs are free)")] = 40,
    sampler: Annotated[str, typer.Option(help="auto (= guided: the simulator's prediction corrected by a residual "
                                              "learnt from the trials) | guided | gp | tpe | nsga2 | random")] = "auto",
    seed: Annotated[int, typer.Option()] = 0,
    storage: StorageOpt = None,
    parallel: Annotated[int, typer.Option(help="trials in flight at once (limited by free GPUs)")] = 1,
    executor: Annotated[str, typer.Option(help="ray (local Ray, or RAY_ADDRESS) | local (threads)")] = "ray",
    warm_start: Annotated[bool, typer.Option(help="enqueue the simulator's predicted front first")] = True,
    retry_risks: Annotated[bool, typer.Option(help="launch configs that crashed on this cluster for another model "
                                                   "(known risks: by default no sampler launches them)")] = False,
    noise: Annotated[float, typer.Option(help="simulated backend: seeded relative noise per trial")] = 0.0,
    emulate_vllm: Annotated[str | None, typer.Option(help="simulated backend: answer as this vLLM version (an "
                                                          "emulated upgrade, see `topotune reverify`)")] = None,
    phase: Annotated[list[str] | None, typer.Option(help="run only this phase (repeatable)")] = None,
    json_out: Annotated[bool, typer.Option("--json")] = False,
    doctor: Annotated[bool, typer.Option(help="vllm backend: run `topotune doctor` first, stop if it fails")]
    = True,
    max_ttft_ms: Annotated[float | None, typer.Option(help="SLA: TTFT bound (overrides the space's; 0 lifts it)")]
    = None,
    max_itl_ms: Annotated[float | None, typer.Option(help="SLA: ITL bound (overrides the space's; 0 lifts it)")]
    = None,
    percentile: Annotated[str | None, typer.Option(help="SLA percentile: p50, p90 or p99 (default: the space's)")]
    = None,
) -> None:
    """Long only by its typer options (one per line with their help, as typer declares them); the body is
    short. Its help text is the decorator's `help=`."""
    from tuner.backends import backend_config
    from tuner.report import write_campaign_report
    from tuner.space import load_space
    from tuner.study import StopSignal, open_storage
    from tuner.tune import TuneRequest, tune

    _check_tune_options(trials=trials, parallel=parallel, sampler=sampler, noise=noise, phases=phase or [])
    settings = TunerSettings(**({"storage": storage} if storage else {}))
    the_space = load_space(space)
    with as_flags(TUNE_FLAGS):
        request = TuneRequest.create(
            model_path=str(model), space=the_space, sla=sla_override(max_ttft_ms, max_itl_ms, percentile),
            backend=backend_config(backend, gpu=the_space.cluster.gpu, noise=noise, emulate_vllm=emulate_vllm),
            trials=trials, sampler=sampler, seed=seed, warm_start=warm_start,
            phases=tuple(phase) if phase else None, retry_risks=retry_risks)
    the_space = request.constrained_space
    open_storage(settings.storage_url)  # a bad URL fails here, before Ray starts
    if backend == "vllm" and doctor:
        _preflight(the_space, model, space, executor, settings, json_out)
    progress = _Progress(trials)
    stop = StopSignal()
    try:
        if json_out:
            result = tune(request, settings, executor=executor, max_parallel=parallel, on_event=progress, stop=stop)
        else:
            from tuner.hardware import get_gpu
            from tuner.models import load_model
            from tuner.study import cluster_notes

            for line in cluster_notes(settings.storage_url, the_space, load_model(model),
                                      get_gpu(the_space.cluster.gpu), retry_risks=retry_risks):
                console.print(line, highlight=False)
            with Live(progress, console=console, refresh_per_second=4, transient=False):
                result = tune(request, settings, executor=executor, max_parallel=parallel, on_event=progress,
                              stop=stop)
    except KeyboardInterrupt:
        stop.interrupt()  # the driver already re-enqueued its in-flight trials: `tune` again resumes them
        raise
    except TopotuneError as exc:  # the campaign's errors name the request's fields (a resume's SLA) as flags
        raise exc.renamed(TUNE_FLAGS) from None
    report = write_campaign_report(result, settings.reports_dir / f"{result.name.replace('/', '_')}.html")
    if json_out:
        print_json(_result_json(result, report))
        return
    _print_campaign(result, failures=0)
    console.print(f"SLA: {sla_text(the_space)}", highlight=False)
    console.print(f"report: {report}\nstorage: {settings.storage_url}\nstudy: {result.name}", highlight=False)


def sla_override(max_ttft_ms: float | None, max_itl_ms: float | None, percentile: str | None):  # type: ignore[no-untyped-def]
    """The SLA flags as the request's override of the space's constraints (0 lifts a bound)."""
    from tuner.tune import SlaOverride

    given: dict[str, object] = {}
    for name, value in (("max_ttft_ms", max_ttft_ms), ("max_itl_ms", max_itl_ms)):
        if value is not None:
            if value < 0:
                raise ConfigError(f"must be >= 0, got {value:g}", field=f"--{name.replace('_', '-')}",
                                  fix="give a bound in milliseconds, or 0 to lift it")
            given[name] = value or None
    if percentile is not None:
        given["percentile"] = percentile
    try:
        return SlaOverride(**given)  # type: ignore[arg-type]
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ConfigError(err["msg"], field=f"--{str(err['loc'][0]).replace('_', '-')}",
                          fix="percentile is p50, p90 or p99; bounds are milliseconds") from None


def sla_text(space) -> str:  # type: ignore[no-untyped-def]
    c = space.constraints
    bounds = [f"TTFT <= {c.max_ttft_ms:g} ms" if c.max_ttft_ms else "", f"ITL <= {c.max_itl_ms:g} ms" if
              c.max_itl_ms else ""]
    text = " and ".join(b for b in bounds if b)
    return f"{text} at {c.percentile} (every front point meets it)" if text else "none (lift/set it with " \
        "--max-ttft-ms / --max-itl-ms or the space's constraints)"


def _check_tune_options(*, trials: int, parallel: int, sampler: str, noise: float, phases: list[str]) -> None:
    from tuner.space import ALL_PHASES
    from tuner.study import SAMPLERS

    if trials < 1:
        raise ConfigError(f"must be >= 1, got {trials}", field="--trials", fix="give a positive trial budget")
    if parallel < 1:
        raise ConfigError(f"must be >= 1, got {parallel}", field="--parallel", fix="give a positive count")
    if sampler not in SAMPLERS:
        raise ConfigError(f"unknown sampler {sampler!r}", field="--sampler", fix=f"use one of {', '.join(SAMPLERS)}")
    if not 0 <= noise < 1:
        raise ConfigError(f"must be in [0, 1), got {noise}", field="--noise", fix="e.g. 0.05 for 5%")
    for p in phases:
        if p not in ALL_PHASES:
            raise ConfigError(f"unknown phase {p!r}", field="--phase", fix="use prefill, decode or aggregated")


def _print_campaign(result, *, failures: int) -> None:  # type: ignore[no-untyped-def]
    """Each phase's front (with its first `failures` failures), then the composed PD front or why there is none."""
    for pr in result.phases.values():
        console.print(_phase_table(pr))
        for f in pr.failures[:failures]:
            console.print(f"  [red]{f.status}[/] trial {f.trial_number}: {f.reason[:140]}", highlight=False)
    if result.composed_front:
        console.print(_front_table(result))
    elif result.composition_error:
        console.print(f"[yellow]no composed PD front:[/] {result.composition_error}")


@app.command()
def studies(storage: StorageOpt = None, json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """List the campaigns (phase studies grouped) in a storage."""
    from tuner.study import list_campaigns

    settings = TunerSettings(**({"storage": storage} if storage else {}))
    rows = list_campaigns(settings.storage_url)
    if json_out:
        print_json([r.__dict__ for r in rows])
        return
    table = Table(title=f"studies in {settings.storage_url}", title_justify="left")
    for col in ("study", "model", "gpu", "phases", "launched / budget", "running", "backend"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.name, r.model, r.gpu, ",".join(r.phases), f"{r.launched} / {r.budget}", str(r.running),
                      r.backend)
    console.print(table)


@app.command()
def show(study: Annotated[str, typer.Argument(help="name from `topotune studies` (optionally /phase)")],
         storage: StorageOpt = None, json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Print a campaign: counts, failures with reasons, each phase's front and the composed PD front."""
    from tuner.study import load_campaign

    settings = TunerSettings(**({"storage": storage} if storage else {}))
    result, _, _ = load_campaign(settings.storage_url, study)
    if json_out:
        print_json(_result_json(result, None))
        return
    _print_campaign(result, failures=5)


@app.command()
def export(study: Annotated[str | None, typer.Argument(help="a study (see `topotune studies`), or --from")] = None,
           from_file: Annotated[Path | None, typer.Option(
               "--from", help="a `topotune frontier --json` file: export its recommendation's operating point")]
           = None,
           point: Annotated[int | None, typer.Option(
               help="row of the composed front (see `topotune show`), or with --from of the file's fronts (the PD "
                    "front, then the aggregated one); default: 0, or the recommendation")] = None,
           fmt: Annotated[str, typer.Option("--format", help="vllm | compose | kubernetes | dynamo | srt-slurm")]
           = "vllm",
           output: Annotated[Path | None, typer.Option("--output", "--out", help="write here instead of stdout")]
           = None,
           storage: StorageOpt = None) -> None:
    """Write a ready-to-run recipe for one operating point: of a study's front, or of a frontier's answer."""
    from tuner.export import FORMATS, export_point

    if fmt not in FORMATS:
        raise ConfigError(f"unknown format {fmt!r}", field="--format", fix=f"use one of {', '.join(FORMATS)}")
    if from_file is not None:
        if study is not None:
            raise ConfigError("give a study or --from, not both", field="STUDY", fix="drop one of them")
        from tuner.operating_point import read_operating_point

        write_script(export_point(read_operating_point(from_file, point), fmt), output, fmt)
        return
    if study is None:
        raise ConfigError("nothing to export", field="STUDY", fix="name a study or give --from FRONTIER.json")
    from tuner.export import study_operating_point

    settings = TunerSettings(**({"storage": storage} if storage else {}))
    with as_flags(EXPORT_FLAGS):
        operating = study_operating_point(settings.storage_url, study, point or 0)
    write_script(export_point(operating, fmt), output, fmt)


# The fields `export`'s library errors name, as its arguments.
EXPORT_FLAGS = {"point": "--point", "study": "STUDY"}


@app.command()
def calibrate(study: Annotated[str | None, typer.Argument(
                  help="a campaign with measured (real) trials; none: what the cluster store learnt")] = None,
              storage: StorageOpt = None,
              cluster: Annotated[str | None, typer.Option(help="without STUDY: only this cluster of the store")]
              = None,
              output: Annotated[Path | None, typer.Option(help="write the fitted factors here (YAML) for "
                                                                "`topotune frontier --calibration`")] = None,
              factors: Annotated[str | None, typer.Option(
                  help="comma-separated factors to fit (default: hbm_efficiency, prefill_flop_efficiency, "
                       "kernel_latency_us, mtp_acceptance); any of docs/perf-model.md's fittable factors, "
                       "e.g. attention_flop_efficiency for long-prompt prefill")] = None,
              json_out: Annotated[bool, typer.Option("--json")] = False) -> None:
    """Fit the simulator's calibration factors to a study's measured points; report the error before and after.
    Without STUDY: what every study taught the cluster store (factors, trials, held-out error, known risks)."""
    import yaml

    if study is None:
        from tuner.cli._cluster import show_cluster_knowledge

        settings = TunerSettings(**({"storage": storage} if storage else {}))
        show_cluster_knowledge(settings.storage_url, cluster, json_out)
        return

    from tuner.hardware import get_gpu
    from tuner.models import load_model
    from tuner.perf import DEFAULT_FIT_FACTORS, MeasuredPoint, fit_calibration
    from tuner.space import phase_role
    from tuner.study import load_campaign

    settings = TunerSettings(**({"storage": storage} if storage else {}))
    result, space, meta = load_campaign(settings.storage_url, study)
    points = [MeasuredPoint(topology=p.deployment.groups[0].topology, role=phase_role(phase), metrics=p.metrics)
              for phase, pr in result.phases.items() for p in pr.points if p.feasible]
    if not points:
        raise ConfigError(f"{study} has no measured point to fit", field="STUDY",
                          fix="run real trials first (topotune tune --backend vllm)")
    chosen = DEFAULT_FIT_FACTORS if factors is None else tuple(f.strip() for f in factors.split(",") if f.strip())
    try:
        fit = fit_calibration(load_model(meta.model_path), get_gpu(space.cluster.gpu), points, factors=chosen)
    except ConfigError as exc:
        if exc.field != "factors":
            raise
        raise ConfigError(exc.message, field="--factors", fix=exc.fix) from exc
    factors = {name: getattr(fit.calibration, name) for name in fit.factors}
    if output is not None:
        try:
            output.write_text(yaml.safe_dump(fit.calibration.model_dump(), sort_keys=False))
        except OSError as exc:
            raise ConfigError(f"cannot write {output}: {exc.strerror}", field="--output",
                              fix="give a writable path") from exc
    if json_out:
        print_json({"points": fit.num_points, "error_before": fit.error_before, "error_after": fit.error_after,
                    "converged": fit.converged, "factors": factors, "output": str(output) if output else None})
        return
    console.print(f"{fit.num_points} measured points of {study}: mean relative error "
                  f"{fit.error_before:.1%} before, {fit.error_after:.1%} after the fit", highlight=False)
    for name, value in factors.items():
        console.print(f"  {name} = {value:.4g}", highlight=False)
