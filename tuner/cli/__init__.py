"""The `topotune` command line: thin Typer commands over the library, rendered with Rich.

Each command group lives in its own module and registers on `app` when imported; what several commands share lives
in the shared modules (_app, _knobs, _traffic, _doctor_report), so no command's module imports another's. A run
imports only the module of the command it names (`topotune frontier` never loads the study, the doctor or the
vLLM backend's planner), and the plug-ins only when the command is none of topotune's own (or for help); heavy
imports (ray, optuna, plotly) happen inside the commands too.
"""

from __future__ import annotations

import gc
import importlib
import sys
from typing import Any

from tuner.cli._app import console, err_console
from tuner.errors import TopotuneError

__all__ = ["app", "console", "err_console", "main", "register_commands"]

# Command name -> the module that registers it (tests/cli/test_cli_commands.py keeps this in step with `app`).
COMMAND_MODULES: dict[str, str] = {
    "doctor": "_doctor", "logs": "_logs", "memory": "_memory", "simulate": "_perf", "frontier": "_perf",
    "reverify": "_reverify", "tune": "_tune", "studies": "_tune", "show": "_tune", "export": "_tune",
    "calibrate": "_tune", "setup-cpu-vllm": "_vllm", "tiny-model": "_vllm", "plan": "_vllm", "workload": "_workload",
    "live-check": "_live", "replay": "_replay",
}
_registered: set[str] = set()
_everything = False


def register_commands(command: str | None = None) -> Any:
    """Register `command`'s module on the app, or (None) every command and the plug-ins; returns the app."""
    global _everything
    from tuner.cli._app import app

    modules = [COMMAND_MODULES[command]] if command in COMMAND_MODULES else sorted(set(COMMAND_MODULES.values()))
    for module in modules:
        if module not in _registered:
            importlib.import_module(f"tuner.cli.{module}")
            _registered.add(module)
    if command not in COMMAND_MODULES and not _everything:
        _everything = True
        _load_plugins(app)
    return app


def __getattr__(name: str) -> Any:
    """`tuner.cli.app`: the whole app, every command and plug-in registered."""
    if name == "app":
        return register_commands()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _load_plugins(app: Any) -> None:
    """Subcommands other packages register under the `topotune.cli` entry-point group (e.g. `serve`)."""
    from importlib.metadata import entry_points

    for entry in entry_points(group="topotune.cli"):
        try:
            entry.load()(app)
        except Exception as exc:  # a broken plug-in must not take the core commands down
            err_console.print(f"warning: topotune plug-in {entry.name!r} not loaded: {exc}", highlight=False)


def _command_of(argv: list[str]) -> str | None:
    """The subcommand a command line names: its first word. None when it starts with an option (the root's only
    one is --help, which lists every command)."""
    return argv[0] if argv and not argv[0].startswith("-") else None


# Short commands that only compute and print: their process ends with the command, so the cyclic garbage collector
# may run rarely (a sweep allocates ~10^5 short-lived objects; collecting every 700 of them cost ~0.1 s of the
# frontier's second).
_ONE_SHOT = frozenset({"frontier", "simulate", "memory", "workload", "plan", "replay"})


def main(argv: list[str] | None = None, *, process: bool = False) -> int:
    """Entry point: every TopotuneError becomes one line on stderr and exit code 2, never a traceback.

    `process`: this call is the whole process (the console script): what the imports built lives until exit, so
    it is frozen out of the garbage collector's passes (gc.freeze), and a short command collects rarely."""
    args = sys.argv[1:] if argv is None else argv
    try:
        command = _command_of(args)
        if process and command in _ONE_SHOT:
            gc.set_threshold(100_000, 50, 100)  # from before the command's imports on
        app = register_commands(command)
        if process:
            gc.freeze()
        app(args=args, prog_name="topotune")
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
    raise SystemExit(main(process=True))
