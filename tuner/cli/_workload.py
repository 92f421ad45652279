"""`topotune workload FILE`: what a trace or a workload file holds, and the `--workload` option's loader."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.table import Table

from tuner._yaml import safe_load_bounded
from tuner.cli._app import app, console, print_json
from tuner.errors import ConfigError
from tuner.files import open_regular, read_text
from tuner.workload import MAX_LINE_CHARS, MAX_TRACE_BYTES, Workload, workload_error

WorkloadOpt = Annotated[Path | None, typer.Option(
    help="The traffic: a mooncake-format JSONL trace (timestamp, input_length, output_length, hash_ids), or a YAML "
         "workload block (isl/osl, input_tokens/output_tokens distributions, prefix, trace). Replaces --isl/--osl.")]
RequestRateOpt = Annotated[str | None, typer.Option(
    help="Open loop: comma-separated request rates (req/s), Poisson arrivals (or the trace's own with "
         "--arrival trace). Replaces --concurrency.")]
ArrivalOpt = Annotated[str, typer.Option(help="Open-loop arrivals: poisson, or trace (its timestamps, rescaled).")]

MAX_WORKLOAD_FILE_BYTES = 1_000_000  # a workload block is a few lines (the search space's own bound)
# Prefix-cache sizes `topotune workload` reports the hit share at (tokens: one GPU's KV cache is ~1-10 M).
_CACHE_TOKENS = (100_000, 1_000_000, 10_000_000, 100_000_000)


def _is_trace(path: Path) -> bool:
    """A JSONL trace by its suffix; otherwise by its first line being a JSON object (a YAML flow mapping such as
    `{isl: 100, osl: 10}` starts with a brace too, but is not JSON). Anything unreadable is left to the YAML
    reader, which names the problem."""
    if path.suffix in (".jsonl", ".ndjson"):
        return True
    if path.suffix in (".yaml", ".yml"):
        return False
    try:
        with open_regular(path, max_bytes=MAX_TRACE_BYTES, field="--workload", fix="", what="") as handle:
            first = handle.readline(MAX_LINE_CHARS + 1).strip()
        return first.startswith(b"{") and isinstance(json.loads(first), dict)
    except (ConfigError, ValueError, RecursionError):
        return False


def _rates(text: str) -> tuple[float, ...]:
    try:
        rates = tuple(sorted({float(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        rates = ()
    if rates and not all(math.isfinite(r) for r in rates):
        raise ConfigError(f"{text!r} is not a finite request rate", field="--request-rate",
                          fix="give finite requests/s, e.g. 0.5,1,2,4 (a closed loop: --concurrency instead)")
    if not rates or rates[0] <= 0:
        raise ConfigError(f"cannot read {text!r} as request rates", field="--request-rate",
                          fix="give comma-separated positive requests/s, e.g. 0.5,1,2,4")
    return rates


def load_workload(path: Path | None, *, isl: int, osl: int, concurrency: tuple[int, ...],
                  request_rate: str | None = None, arrival: str = "poisson") -> Workload:
    """The traffic a command predicts: --workload (a trace or a YAML block), else the fixed --isl/--osl."""
    load: dict[str, object] = {"concurrency": concurrency}
    if request_rate is not None:
        if arrival not in ("poisson", "trace"):
            raise ConfigError(f"unknown arrival {arrival!r}", field="--arrival", fix="use poisson or trace")
        load.update(arrival=arrival, request_rates=_rates(request_rate))
    try:
        if path is None:
            return Workload.model_validate({"isl": isl, "osl": osl, **load})
        if _is_trace(path):
            return Workload.from_trace(path, **load)
        return _from_yaml(path, load)
    except ValidationError as exc:
        raise workload_error(exc, "--workload") from None


def _from_yaml(path: Path, load: dict[str, object]) -> Workload:
    from tuner.space import WorkloadSpec  # the same block a search space holds

    text = read_text(path, max_bytes=MAX_WORKLOAD_FILE_BYTES, field="--workload",
                     fix="a workload file is a short YAML block; a trace is JSONL (.jsonl)",
                     what="a JSONL trace or a YAML workload block")
    data = safe_load_bounded(text, str(path), what="the workload file",
                             example="the workload block of search_spaces/gb300-nvl72-8k1k.yaml")
    if isinstance(data, dict) and "workload" in data:
        data = data["workload"]
    if not isinstance(data, dict):
        raise ConfigError("expected a workload mapping", field="--workload",
                          fix="e.g. input_tokens: {distribution: lognormal, mean: 2000, stddev: 1500}")
    try:
        spec = WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise workload_error(exc, "--workload") from None
    base = spec.resolve(path.resolve().parent)
    return Workload.model_validate({**base.model_dump(), **load})


@app.command("workload", help="Summarise a trace (JSONL) or a workload file: lengths, arrival rate, prefix reuse.")
def workload_command(
    path: Annotated[Path, typer.Argument(help="A mooncake-format JSONL trace or a YAML workload block.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    w = load_workload(path, isl=1, osl=1, concurrency=(1,))
    q = (0.5, 0.9, 0.99)
    summary = {
        "describe": w.describe(load=False),
        "input_tokens": {"mean": round(w.input_tokens.expected, 1), "longest": w.input_tokens.longest,
                         **{f"p{int(p * 100)}": round(w.input_tokens.quantile(p)) for p in q}},
        "output_tokens": {"mean": round(w.output_tokens.expected, 1), "longest": w.output_tokens.longest,
                          **{f"p{int(p * 100)}": round(w.output_tokens.quantile(p)) for p in q}},
        "max_model_len": w.max_model_len,
        "prefix_hit_share_by_cache_tokens": {str(c): round(w.prefix_hit_share(c), 4) for c in _CACHE_TOKENS},
    }
    if w.trace is not None:
        summary |= {"requests": w.trace.requests, "sha256": w.trace.sha256, "duration_s": w.trace.duration_s,
                    "arrival_rps": w.trace.arrival_rps, "prefix_reuse": round(w.trace.prefix_reuse, 4),
                    "block_tokens": w.trace.block_tokens}
    if json_out:
        print_json(summary)
        return
    console.print(f"{path}: {w.describe(load=False)}", highlight=False)
    table = Table(title_justify="left")
    for col in ("tokens", "mean", "p50", "p90", "p99", "longest"):
        table.add_column(col, justify="right")
    for name in ("input_tokens", "output_tokens"):
        s = summary[name]
        table.add_row(name.split("_")[0], f"{s['mean']:,.0f}", f"{s['p50']:,}", f"{s['p90']:,}", f"{s['p99']:,}",
                      f"{s['longest']:,}")
    console.print(table)
    if w.trace is not None:
        rate = f"{w.trace.arrival_rps:.3g} req/s over {w.trace.duration_s:,.0f} s" if w.trace.arrival_rps else \
            "no timestamps (closed loop only)"
        console.print(f"{w.trace.requests:,} requests; arrivals {rate}; prefix reuse {w.trace.prefix_reuse:.1%} of "
                      f"input tokens (an unbounded prefix cache)", highlight=False)
    hits = ", ".join(f"{c / 1e6:g} M tokens: {h:.1%}" for c, h in zip(
        _CACHE_TOKENS, summary["prefix_hit_share_by_cache_tokens"].values(), strict=True))
    console.print(f"prefix-cache hit share by cache size (one LRU cache): {hits}", highlight=False)
    console.print(f"served context for the longest request (--max-model-len): {w.max_model_len:,}", highlight=False)
