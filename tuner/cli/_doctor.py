"""`topotune doctor`: render the preflight (the checks live in tuner.doctor)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from tuner.cli._app import app, console, print_json
from tuner.errors import ConfigError

DEFAULT_SPACE = Path(__file__).resolve().parents[2] / "search_spaces" / "cpu-tiny.yaml"
_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red"}


def render_report(report) -> None:  # type: ignore[no-untyped-def]
    """The checks as a table (failed ones with their fix), then the first trial's commands."""
    table = Table(title=f"topotune doctor: {report.space} on {report.cluster}", title_justify="left")
    for col in ("node", "check", "result", "detail / fix"):
        table.add_column(col, overflow="fold")
    for c in report.checks:
        text = c.detail + (f"\n[bold]fix:[/] {c.fix}" if c.fix else "")
        table.add_row(c.node, c.check, f"[{_STYLE[c.status.value]}]{c.status.value}[/]", text)
    console.print(table)
    if report.first_trial is not None:
        t = report.first_trial
        console.print(f"\n# first trial ({t.phase}): {t.deployment}; endpoint {t.endpoint}", highlight=False)
        for p in t.processes:
            console.print(f"# {p.name} on {p.host}", highlight=False)
            print(p.command)
    else:
        console.print(f"\n[yellow]first trial not planned:[/] {report.first_trial_error}", highlight=False)
    failed = report.failed
    verdict = (f"[bold red]{len(failed)} check(s) failed: a campaign would fail[/]" if failed
               else "[green]ready: every check passed[/]")
    console.print(f"\n{verdict}")


@app.command()
def doctor(
    space: Annotated[Path | None, typer.Option(help="search-space YAML (default: search_spaces/cpu-tiny.yaml)")]
    = None,
    model: Annotated[Path | None, typer.Option(help="model folder as every node loads it")] = None,
    executor: Annotated[str, typer.Option(help="ray (local Ray, or RAY_ADDRESS) | local (this machine)")] = "ray",
    json_out: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Preflight the cluster a real campaign will use: GPUs, model, vllm/aiperf/vllm-router, NIXL/UCX, ports,
    IMEX; exit 2 when a campaign would fail."""
    from tuner.doctor import run_doctor
    from tuner.settings import TunerSettings
    from tuner.space import load_space

    if executor not in ("ray", "local"):
        raise ConfigError(f"unknown executor {executor!r}", field="--executor", fix="use ray or local")
    space_path = space or DEFAULT_SPACE
    if not space_path.exists():
        raise ConfigError(f"{space_path} not found", field="--space", fix="give a search-space YAML")
    settings = TunerSettings()
    report = run_doctor(load_space(space_path), model, space_name=str(space_path), executor=executor,
                        ray_address=settings.ray_address, ray_port=settings.ray_port)
    if json_out:
        print_json({**report.model_dump(mode="json"), "ok": report.ok, "exit_code": report.exit_code})
    else:
        render_report(report)
    if not report.ok:
        raise typer.Exit(report.exit_code)
