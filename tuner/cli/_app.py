from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.console import Console

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


@app.callback()
def _root() -> None:
    """Find the best way to serve a large model with vLLM on a GPU cluster."""
