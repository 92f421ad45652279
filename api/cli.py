"""`topotune-api serve | migrate`: the service's command line (the `topotune` CLI never imports api/).

Settings come from TOPOTUNE_* env vars; the options here override the few one sets by hand.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from api.config import ApiSettings

app = typer.Typer(name="topotune-api", help="topotune as a service: REST API, pages, Optuna dashboard, runner.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False)


def _settings(**overrides: object) -> ApiSettings:
    try:
        return ApiSettings(**{k: v for k, v in overrides.items() if v is not None})  # type: ignore[arg-type]
    except ValidationError as exc:
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "settings"
            typer.echo(f"error: {field}: {err['msg']}", err=True)
        raise typer.Exit(2) from exc


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="bind address (env TOPOTUNE_HOST, default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="port (env TOPOTUNE_PORT, default 8470)")] = None,
    storage: Annotated[str | None, typer.Option(help="database URL (env TOPOTUNE_STORAGE; default SQLite in "
                                                     "the data dir)")] = None,
    executor: Annotated[str | None, typer.Option(help="ray (RAY_ADDRESS or a local Ray) | local")] = None,
    models_dir: Annotated[Path | None, typer.Option(help="watched model store (env TOPOTUNE_MODELS_DIR)")] = None,
    log_level: Annotated[str, typer.Option()] = "info",
) -> None:
    """Run the API, the pages, the Optuna dashboard and the background runner in one process."""
    import uvicorn

    from api.main import create_app

    settings = _settings(host=host, port=port, storage=storage, executor=executor, models_dir=models_dir)
    typer.echo(f"topotune-api on http://{settings.host}:{settings.port}  (database {settings.database_url}, "
               f"executor {settings.executor}, models {settings.model_store})", err=True)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=log_level,
                proxy_headers=False)


@app.command()
def migrate(storage: Annotated[str | None, typer.Option(help="database URL (env TOPOTUNE_STORAGE)")] = None) -> None:
    """Create or upgrade the service's tables (serve does this too, before it listens)."""
    from api.db import current_revision, make_engine, upgrade

    settings = _settings(storage=storage)
    engine = make_engine(settings.database_url)
    upgrade(engine)
    typer.echo(f"{settings.database_url}: schema {current_revision(engine)}")


def register(topotune_app: typer.Typer) -> None:
    """Plug-in hook of the `topotune` CLI (entry point group topotune.cli): adds `topotune serve`."""
    topotune_app.command("serve")(serve)


def main() -> None:
    sys.exit(app())
