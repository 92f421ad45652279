"""The `topotune` command line: thin Typer commands over the library, rendered with Rich.

Each command group lives in its own module and registers on `app`; heavy imports (ray, optuna, plotly)
happen inside the commands so `topotune memory` starts fast.
"""

from __future__ import annotations

# Importing the command modules registers their commands on `app`.
import tuner.cli._doctor
import tuner.cli._logs
import tuner.cli._vllm  # noqa: F401
from tuner.cli import _memory, _perf, _reverify, _tune, _workload  # noqa: F401
from tuner.cli._app import app, console, err_console
from tuner.errors import TopotuneError

__all__ = ["app", "console", "err_console", "main"]


def _load_plugins() -> None:
    """Subcommands other packages register under the `topotune.cli` entry-point group (e.g. `serve`)."""
    from importlib.metadata import entry_points

    for entry in entry_points(group="topotune.cli"):
        try:
            entry.load()(app)
        except Exception as exc:  # a broken plug-in must not take the core commands down
            err_console.print(f"warning: topotune plug-in {entry.name!r} not loaded: {exc}", highlight=False)


_load_plugins()


def main(argv: list[str] | None = None) -> int:
    """Entry point: every TopotuneError becomes one line on stderr and exit code 2, never a traceback."""
    try:
        app(args=argv, prog_name="topotune")
    except TopotuneError as exc:
        err_console.print(f"[bold red]error:[/] {exc.user_message()}", highlight=False, soft_wrap=True)
        return 2
    except SystemExit as exc:  # click's own exit (usage errors exit 2, --help 0)
        return int(exc.code or 0)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
    return 0


def run() -> None:
    """Console-script wrapper: exit with main()'s code."""
    raise SystemExit(main())
