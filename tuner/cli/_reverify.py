"""`topotune reverify`: re-measure a study's front on what the cluster runs now, and say what changed."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from tuner.cli._app import TUNE_FLAGS, StorageOpt, app, as_flags, console, print_json
from tuner.errors import ConfigError
from tuner.settings import TunerSettings

_STYLE = {"unchanged": "", "faster": "green", "slower": "red", "no longer starts": "bold red"}


def _figure(front: float | None, tested: float | None) -> str:
    """The front's own figure (goodput tok/s/GPU) when the row has it; else the tested runs' (older reports)."""
    value = front if front is not None else tested
    return f"{value:,.0f}" if value is not None else ""


def report_table(report) -> Table:  # type: ignore[no-untyped-def]
    """One row per re-measured config: the stored and the new throughput per GPU, the test and the verdict."""
    table = Table(title=f"{report.campaign}: re-verified on {report.to_version or 'an unknown version'} "
                        f"({report.repeats} runs per config, noise floor {report.noise_floor:.0%}, "
                        f"alpha {report.alpha:g})", title_justify="left")
    for col in ("phase", "point", "config", "why", "stored on", "tok/s/GPU before", "after", "ratio", "p",
                "verdict", "new trial"):
        table.add_column(col, justify="left" if col in ("phase", "config", "why", "stored on", "verdict") else "right")
    for r in report.rows:
        c = r.comparison
        style = _STYLE.get(r.verdict, "")
        sla = " (SLA now missed)" if r.meets_sla_before and r.meets_sla_after is False and c else ""
        table.add_row(r.phase, r.label, r.config, r.why, r.from_version.split(" · ")[0],
                      _figure(r.front_before, c and c["old_tok_s"]), _figure(r.front_after, c and c["new_tok_s"]),
                      f"{c['ratio']:.3f}" if c else "", f"{c['p_value']:.2g}" if c else "",
                      f"[{style}]{r.verdict}{sla}[/]" if style else r.verdict + sla,
                      str(r.new_trial) if r.new_trial is not None else "")
    return table


@app.command(help="Re-measure a study's front (the exported recipes' configs first) on what the cluster runs now, "
                  "compare each config with its stored measurement under a noise test, report unchanged / faster / "
                  "slower / no longer starts, store the new runs tagged with their vLLM version, and re-open the "
                  "search around the configs that changed (docs/reverify.md).")
def reverify(
    study: Annotated[str, typer.Argument(help="name from `topotune studies`")],
    storage: StorageOpt = None,
    budget: Annotated[int, typer.Option(help="configs re-measured (each --repeats times): recipe configs first, "
                                             "then the front, then neighbours of changed configs")] = 8,
    repeats: Annotated[int, typer.Option(help="runs per config (the noise test's sample)")] = 3,
    emulate_vllm: Annotated[str | None, typer.Option(help="simulated backend: answer as this vLLM version (an "
                                                          "emulated upgrade: seeded per-layout speed changes, "
                                                          "configs that stop starting)")] = None,
    noise: Annotated[float, typer.Option(help="simulated backend: seeded run-to-run noise (log-sd)")] = 0.0,
    noise_floor: Annotated[float, typer.Option(help="least log-sd of one run's throughput the test assumes")]
    = 0.03,
    alpha: Annotated[float, typer.Option(help="two-sided significance of a reported change")] = 0.01,
    reopen: Annotated[bool, typer.Option(help="re-measure / enqueue neighbours of changed configs")] = True,
    executor: Annotated[str, typer.Option(help="local (threads) | ray")] = "local",
    parallel: Annotated[int, typer.Option(help="runs in flight at once")] = 1,
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    from tuner.reverify import ReverifyRequest, reverify

    if parallel < 1:
        raise ConfigError(f"must be >= 1, got {parallel}", field="--parallel", fix="give a positive count")
    settings = TunerSettings(**({"storage": storage} if storage else {}))
    with as_flags(TUNE_FLAGS):
        request = ReverifyRequest.create(study=study, budget=budget, repeats=repeats, reopen=reopen,
                                         noise_floor=noise_floor, alpha=alpha, emulate_vllm=emulate_vllm, noise=noise)
        report = reverify(request, settings, executor=executor, max_parallel=parallel)
    if json_out:
        print_json(report.as_json())
        return
    console.print(report_table(report))
    counts = ", ".join(f"{n} {v}" for v, n in report.counts().items())
    console.print(f"{len(report.rows)} configs re-measured: {counts}", highlight=False)
    if report.enqueued:
        console.print(f"search re-opened: {len(report.enqueued)} unmeasured neighbours of changed configs enqueued; "
                      "resume the study with a larger --trials to run them on this version", highlight=False)
    console.print(f"stored in {settings.storage_url} (study {study}); the front now uses the new measurements",
                  highlight=False)
