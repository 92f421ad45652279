from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from tuner.errors import ConfigError

# Options shared by several commands, declared once.
ModelArg = Annotated[Path, typer.Argument(help="config.json or a model folder (safetensors headers are read).")]
HardwareOpt = Annotated[str, typer.Option("--hardware", "-g", help="GPU from the catalog: gb300, gb200, b200, ...")]
HardwareFileOpt = Annotated[Path | None, typer.Option(help="YAML file adding GPUs to the catalog.")]

app = typer.Typer(
    name="topotune",
    help="Find the best way to serve a large model with vLLM on a GPU cluster.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Piped output (CI logs, README captures) gets a wide console instead of Rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 150)
err_console = Console(stderr=True, width=None if sys.stderr.isatty() else 150)


def print_json(data: Any) -> None:
    """Plain JSON on stdout (no Rich markup), so it can be piped into jq."""
    print(json.dumps(data, indent=2, default=str))


def write_script(text: str, out: Path | None, what: str = "script") -> None:
    """Machine output (a script, YAML, JSON) goes to stdout raw (never through rich, whatever COLUMNS says), or to
    `out`."""
    if out is None:
        sys.stdout.write(text)
        return
    try:
        out.write_text(text)
    except OSError as exc:
        raise ConfigError(f"cannot write {out}: {exc.strerror}", field="--out", fix="give a writable path") from exc
    err_console.print(f"{what} written to {out}", highlight=False)


@app.callback()
def _root() -> None:
    """Find the best way to serve a large model with vLLM on a GPU cluster."""
