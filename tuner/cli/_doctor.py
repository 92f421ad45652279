"""`topotune doctor`: render the preflight (the checks live in tuner.doctor)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tuner.cli._app import app, print_json
from tuner.cli._doctor_report import render_report
from tuner.errors import ConfigError

DEFAULT_SPACE = Path(__file__).resolve().parents[2] / "search_spaces" / "cpu-tiny.yaml"


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
