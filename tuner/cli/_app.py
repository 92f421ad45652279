from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from tuner.errors import ConfigError, TopotuneError

if TYPE_CHECKING:
    from tuner.perf import Calibration

# Options shared by several commands, declared once.
ModelArg = Annotated[Path, typer.Argument(help="config.json or a model folder (safetensors headers are read).")]
HardwareOpt = Annotated[str, typer.Option("--hardware", "-g", help="GPU from the catalog: gb300, gb200, b200, ...")]
HardwareFileOpt = Annotated[Path | None, typer.Option(help="YAML file adding GPUs to the catalog.")]
CalibrationOpt = Annotated[Path | None, typer.Option(
    help="YAML/JSON file of calibration factors overriding the GPU's defaults (see docs/perf-model.md).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
StorageOpt = Annotated[str | None, typer.Option(help="SQLAlchemy URL (default: SQLite in the data dir; "
                                                     "env TOPOTUNE_STORAGE).")]

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


# The request fields `tune` and `reverify` name in their errors, as the commands' flags.
TUNE_FLAGS: dict[str, str] = {
    "trials": "--trials", "sampler": "--sampler", "seed": "--seed", "phases": "--phase",
    "sla.max_ttft_ms": "--max-ttft-ms", "sla.max_itl_ms": "--max-itl-ms", "sla.percentile": "--percentile",
    "backend.kind": "--backend", "backend.noise": "--noise", "backend.vllm_version": "--emulate-vllm",
    "noise": "--noise", "emulate_vllm": "--emulate-vllm", "reopen": "--reopen",
    "study": "STUDY", "storage": "--storage", "budget": "--budget", "repeats": "--repeats",
    "noise_floor": "--noise-floor", "alpha": "--alpha",
}


@contextmanager
def as_flags(names: dict[str, str]) -> Iterator[None]:
    """An error of the library, its request fields named as the command's flags."""
    try:
        yield
    except TopotuneError as exc:
        raise exc.renamed(names) from None


def calibration_for(gpu_name: str, path: Path | None) -> Calibration:
    """The GPU's default calibration with --calibration's factors over it (the file read by the library's guarded
    reader, tuner.perf.calibrated)."""
    from tuner.perf import calibrated

    try:
        return calibrated(gpu_name, path)
    except TopotuneError as exc:
        raise exc.renamed({"calibration": "--calibration"}) from None


@app.callback()
def _root() -> None:
    """Find the best way to serve a large model with vLLM on a GPU cluster."""
