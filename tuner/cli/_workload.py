"""`topotune workload FILE`: what a trace or a workload file holds; `topotune workload --from-metrics /
--from-prometheus`: the workload a running vLLM serves (the options' readers: tuner.cli._traffic)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.table import Table

from tuner.cli._app import app, console, print_json
from tuner.cli._traffic import live_window, load_workload
from tuner.errors import ConfigError
from tuner.workload import LiveTraffic, Workload

# Prefix-cache sizes `topotune workload` reports the hit share at (tokens: one GPU's KV cache is ~1-10 M).
_CACHE_TOKENS = (100_000, 1_000_000, 10_000_000, 100_000_000)


def _summary(w: Workload) -> dict[str, object]:
    """What `topotune workload --json` prints for any workload (a trace adds its own keys, a live window its own)."""
    q = (0.5, 0.9, 0.99)
    return {
        "describe": w.describe(load=False),
        "input_tokens": {"mean": round(w.input_tokens.expected, 1), "longest": w.input_tokens.longest,
                         **{f"p{int(p * 100)}": round(w.input_tokens.quantile(p)) for p in q}},
        "output_tokens": {"mean": round(w.output_tokens.expected, 1), "longest": w.output_tokens.longest,
                          **{f"p{int(p * 100)}": round(w.output_tokens.quantile(p)) for p in q}},
        "max_model_len": w.max_model_len,
        "prefix_hit_share_by_cache_tokens": {str(c): round(w.prefix_hit_share(c), 4) for c in _CACHE_TOKENS},
    }


def write_workload_file(path: Path, live: LiveTraffic) -> None:
    """The window's workload as a YAML workload block every --workload option (and a space) reads; what was
    measured goes in comments (a workload file holds the traffic, not the latencies)."""
    w = live.workload
    block: dict[str, object] = {
        "input_tokens": w.input_tokens.model_dump(mode="json"),
        "output_tokens": w.output_tokens.model_dump(mode="json"),
        **({"prefix": w.prefix.model_dump(mode="json")} if w.prefix is not None else {}),
        "arrival": w.arrival, "request_rates": list(w.request_rates)}
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    head = [f"# measured by topotune from {', '.join(live.sources)} at {when}",
            f"# {live.requests:,.0f} requests in {live.window_s:,.0f} s ({live.arrival_rps:.4g} req/s), prefix-cache "
            f"hits {live.prefix_hit_share:.1%} of prompt tokens",
            f"# TTFT ms mean/p50/p90/p99: {live.ttft.mean_ms:.1f}/{live.ttft.p50_ms:.1f}/{live.ttft.p90_ms:.1f}/"
            f"{live.ttft.p99_ms:.1f}; ITL ms: {live.itl.mean_ms:.2f}/{live.itl.p50_ms:.2f}/{live.itl.p90_ms:.2f}/"
            f"{live.itl.p99_ms:.2f}",
            "# lengths at the histogram buckets' resolution; see docs/workloads.md (traffic from /metrics)"]
    text = "\n".join(head) + "\n" + yaml.safe_dump({"workload": block}, sort_keys=False)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror}", field="--out", fix="give a writable path") from exc


@app.command("workload", help="Summarise a trace (JSONL) or a workload file: lengths, arrival rate, prefix reuse; or "
                              "build the workload a running vLLM serves from its /metrics (--from-metrics) or from "
                              "Prometheus (--from-prometheus).")
def workload_command(
    paths: Annotated[list[str] | None, typer.Argument(
        help="A mooncake-format JSONL trace or a YAML workload block; with --from-metrics, more server URLs.")]
    = None,
    from_metrics: Annotated[str | None, typer.Option(
        "--from-metrics", help="A vLLM server's metrics URL (http://host:8000/metrics); more URLs may follow "
                               "(servers of one deployment: their traffic adds up).")] = None,
    window: Annotated[str, typer.Option(help="--from-metrics: the time between the two scrapes (90s, 10m, 1h).")]
    = "10m",
    from_prometheus: Annotated[str | None, typer.Option(
        "--from-prometheus", help="Prometheus's base URL (http://prometheus:9090): increase() of vLLM's series.")]
    = None,
    query: Annotated[str, typer.Option(
        help="--from-prometheus: label matchers selecting the deployment's servers, e.g. '{job=\"vllm\"}'.")] = "",
    range_: Annotated[str, typer.Option("--range", help="--from-prometheus: the window, back from now (1h).")]
    = "1h",
    out: Annotated[Path | None, typer.Option(help="Write the live workload as a workload file (--workload FILE).")]
    = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    live: LiveTraffic | None = None
    if from_metrics is not None or from_prometheus is not None:
        live = live_window(from_metrics, paths or [], window, from_prometheus, query, range_)
        w, label = live.workload, ", ".join(live.sources)
        if out is not None:
            write_workload_file(out, live)
    else:
        if not paths or len(paths) != 1:
            raise ConfigError("give one trace or workload file", field="PATH",
                              fix="topotune workload FILE, or --from-metrics URL / --from-prometheus URL")
        if out is not None:
            raise ConfigError("--out writes a live workload", field="--out",
                              fix="use it with --from-metrics or --from-prometheus")
        label = paths[0]
        w = load_workload(Path(paths[0]), isl=1, osl=1, concurrency=(1,))
    summary = _summary(w)
    if w.trace is not None:
        summary |= {"requests": w.trace.requests, "sha256": w.trace.sha256, "duration_s": w.trace.duration_s,
                    "arrival_rps": w.trace.arrival_rps, "prefix_reuse": round(w.trace.prefix_reuse, 4),
                    "block_tokens": w.trace.block_tokens}
    if live is not None:
        summary |= live.summary_json()
    if json_out:
        print_json(summary)
        return
    console.print(f"{label}: {w.describe(load=False)}", highlight=False)
    table = Table(title_justify="left")
    for col in ("tokens", "mean", "p50", "p90", "p99", "longest"):
        table.add_column(col, justify="right")
    for name in ("input_tokens", "output_tokens"):
        s = summary[name]
        assert isinstance(s, dict)
        table.add_row(name.split("_")[0], f"{s['mean']:,.0f}", f"{s['p50']:,}", f"{s['p90']:,}", f"{s['p99']:,}",
                      f"{s['longest']:,}")
    console.print(table)
    if live is not None:
        _print_live(live, out)
        return
    if w.trace is not None:
        rate = f"{w.trace.arrival_rps:.3g} req/s over {w.trace.duration_s:,.0f} s" if w.trace.arrival_rps else \
            "no timestamps (closed loop only)"
        console.print(f"{w.trace.requests:,} requests; arrivals {rate}; prefix reuse {w.trace.prefix_reuse:.1%} of "
                      f"input tokens (an unbounded prefix cache)", highlight=False)
    hits = ", ".join(f"{c / 1e6:g} M tokens: {h:.1%}" for c, h in zip(
        _CACHE_TOKENS, summary["prefix_hit_share_by_cache_tokens"].values(), strict=True))  # type: ignore[attr-defined]
    console.print(f"prefix-cache hit share by cache size (one LRU cache): {hits}", highlight=False)
    console.print(f"served context for the longest request (--max-model-len): {w.max_model_len:,}", highlight=False)


def _print_live(live: LiveTraffic, out: Path | None) -> None:
    buckets = ", ".join(f"{b:g}" for b in live.bucket_resolution.get("input", []))
    console.print(f"{live.requests:,.0f} requests finished in {live.window_s:,.1f} s: {live.arrival_rps:.4g} req/s"
                  f"{f' ({live.failed:,.0f} aborted or errored)' if live.failed else ''}; prefix-cache hits "
                  f"{live.prefix_hit_share:.1%} of prompt tokens; {live.preemptions:,.0f} preemptions",
                  highlight=False)
    table = Table(title="measured in the window (ms; percentiles at the buckets' resolution, means exact)",
                  title_justify="left")
    for col in ("latency", "mean", "p50", "p90", "p99", "samples"):
        table.add_column(col, justify="right")
    rows = [("TTFT", live.ttft), ("ITL (every token)", live.itl)]
    if live.request_itl is not None:
        rows.append(("ITL (per request)", live.request_itl))
    for name, s in rows:
        table.add_row(name, f"{s.mean_ms:,.2f}", f"{s.p50_ms:,.2f}", f"{s.p90_ms:,.2f}", f"{s.p99_ms:,.2f}",
                      f"{s.samples:,.0f}")
    console.print(table)
    console.print(f"length buckets (tokens): {buckets}; set --custom-histogram-buckets on vllm serve for finer ones",
                  highlight=False)
    if out is not None:
        console.print(f"workload written to {out} (give it as --workload)", highlight=False)
