"""The traffic options several commands read, declared once: --workload (a trace or a YAML workload block) with
--request-rate and --arrival, and a running deployment's window (--from-metrics / --from-prometheus)."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from tuner._yaml import safe_load_bounded
from tuner.cli._app import err_console
from tuner.errors import ConfigError
from tuner.files import open_regular, read_text
from tuner.workload import (
    MAX_LINE_CHARS,
    MAX_TRACE_BYTES,
    LiveTraffic,
    Workload,
    parse_duration,
    traffic_from_prometheus,
    traffic_from_servers,
    workload_error,
)

WorkloadOpt = Annotated[Path | None, typer.Option(
    help="The traffic: a mooncake-format JSONL trace (timestamp, input_length, output_length, hash_ids), or a YAML "
         "workload block (isl/osl, input_tokens/output_tokens distributions, prefix, trace). Replaces --isl/--osl.")]
RequestRateOpt = Annotated[str | None, typer.Option(
    help="Open loop: comma-separated request rates (req/s), Poisson arrivals (or the trace's own with "
         "--arrival trace). Replaces --concurrency.")]
ArrivalOpt = Annotated[str, typer.Option(help="Open-loop arrivals: poisson, or trace (its timestamps, rescaled).")]

MAX_WORKLOAD_FILE_BYTES = 1_000_000  # a workload block is a few lines (the search space's own bound)


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
        raise workload_error(exc).renamed({"workload": "--workload"}) from None


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
        raise workload_error(exc).renamed({"workload": "--workload"}) from None
    base = spec.resolve(path.resolve().parent)
    return Workload.model_validate({**base.model_dump(), **load})


def live_window(from_metrics: str | None, more_urls: list[str], window: str, from_prometheus: str | None,
                query: str, range_: str) -> LiveTraffic:
    """The traffic of a running deployment: two scrapes of its servers (--from-metrics URL [URL ...] --window) or
    Prometheus's increase() over --range (--from-prometheus URL --query MATCHERS)."""
    if (from_metrics is None) == (from_prometheus is None):
        raise ConfigError("give one source", field="--from-metrics / --from-prometheus",
                          fix="--from-metrics URL [URL ...] --window 10m, or --from-prometheus URL --query "
                              "'{job=\"vllm\"}' --range 1h")
    if from_prometheus is not None:
        if more_urls:
            raise ConfigError(f"unexpected arguments {' '.join(more_urls)}", field="--from-prometheus",
                              fix="give one Prometheus URL; select servers with --query")
        return traffic_from_prometheus(from_prometheus, query, parse_duration(range_, "--range"))
    urls = [u for part in (from_metrics or "", *more_urls) for u in part.split(",") if u.strip()]

    def wait(seconds: float) -> None:
        err_console.print(f"scraped {len(urls)} server(s); the window ends in {seconds:g} s", highlight=False)
        time.sleep(seconds)

    return traffic_from_servers(urls, parse_duration(window, "--window"), sleep=wait)
