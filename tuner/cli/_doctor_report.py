"""The doctor's report as a table: what `topotune doctor` prints, and `tune` when its preflight fails."""

from __future__ import annotations

from rich.table import Table

from tuner.cli._app import console

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
