"""Plotly views of results: the composed PD front, a phase's trials, hypervolume history, and one HTML report.

Plotly is imported inside the functions: `topotune memory` and the API's JSON routes never pay for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tuner.errors import ConfigError
from tuner.frontier import AggregatedPoint, ComposedPoint, family_fronts

if TYPE_CHECKING:
    import plotly.graph_objects as go

    from tuner.replay import ReplayReport
    from tuner.study import CampaignResult, PhaseResult

FAINT_LINE = {"width": 1, "color": "rgba(120,120,120,0.25)"}
FAINT_MARKER = {"size": 3, "color": "rgba(120,120,120,0.35)"}
FRONT_LINE = {"width": 3, "color": "#d62728"}


def composed_front_figure(points: list[ComposedPoint], front: list[ComposedPoint], title: str,
                          aggregated: Sequence[AggregatedPoint] = (), *, numbered: bool = False) -> go.Figure:
    """Every deployment family's curve faint, the combined front bold, the aggregated front (replicas serving
    prefill and decode together) beside it, the deployment on hover. `numbered`: each front point labelled #i, its
    index in `front` (the `point` of a study's front table and of /export)."""
    import plotly.graph_objects as go

    xs: list[float | None] = []
    ys: list[float | None] = []
    texts: list[str | None] = []
    for family, curve in sorted(family_fronts(points).items()):
        for p in curve:
            xs.append(p.tok_s_per_user)
            ys.append(p.total_tok_s_per_gpu)
            texts.append(f"{p.name}<br>{family}<br>TTFT {p.ttft_ms:,.0f} ms, ITL {p.itl_ms:.1f} ms")
        xs.append(None)
        ys.append(None)
        texts.append(None)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=xs, y=ys, text=texts, hoverinfo="text", mode="lines+markers", name="every deployment",
                             line=FAINT_LINE, marker=FAINT_MARKER))
    fig.add_trace(go.Scatter(
        x=[p.tok_s_per_user for p in front], y=[p.total_tok_s_per_gpu for p in front], hoverinfo="text",
        hovertext=[f"<b>{f'#{i} ' if numbered else ''}{p.name}</b><br>{p.total_tok_s_per_gpu:,.0f} tok/s/GPU, "
                   f"{p.tok_s_per_user:.1f} tok/s/user<br>{p.num_gpus} GPUs, TTFT {p.ttft_ms:,.0f} ms, "
                   f"ITL {p.itl_ms:.1f} ms" for i, p in enumerate(front)],
        text=[f"#{i}" for i in range(len(front))] if numbered else None, textposition="top right",
        mode="lines+markers+text" if numbered else "lines+markers", name="combined Pareto front", line=FRONT_LINE,
        marker={"size": 8}))
    if aggregated:
        fig.add_trace(go.Scatter(
            x=[p.tok_s_per_user for p in aggregated], y=[p.total_tok_s_per_gpu for p in aggregated],
            hoverinfo="text", mode="lines+markers", name="aggregated front", line={"dash": "dash"},
            text=[f"<b>{p.name}</b> (aggregated)<br>{p.total_tok_s_per_gpu:,.0f} tok/s/GPU, "
                  f"{p.tok_s_per_user:.1f} tok/s/user<br>TTFT {p.ttft_ms:,.0f} ms, ITL {p.itl_ms:.1f} ms"
                  for p in aggregated]))
    fig.update_layout(title=title, xaxis_title="generated tokens/s per user", template="plotly_white",
                      yaxis_title="total tokens/s per GPU (prefill + decode GPUs)", hovermode="closest")
    return fig


def phase_figure(result: PhaseResult, axis_titles: tuple[str, str]) -> go.Figure:
    """A phase study: every measured point faint (infeasible ones marked), its feasible front bold."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for feasible, name, marker in ((True, "feasible points", FAINT_MARKER),
                                   (False, "infeasible (SLA)", {"size": 4, "color": "rgba(255,127,14,0.4)",
                                                                "symbol": "x"})):
        pts = [p for p in result.points if p.feasible == feasible]
        fig.add_trace(go.Scatter(
            x=[p.values[1] for p in pts], y=[p.values[0] for p in pts], mode="markers", name=name, marker=marker,
            hoverinfo="text", text=[f"trial {p.label}: {p.deployment.name}" for p in pts]))
    front = sorted(result.front, key=lambda p: p.values[1])
    fig.add_trace(go.Scatter(
        x=[p.values[1] for p in front], y=[p.values[0] for p in front], mode="lines+markers", name="front",
        line=FRONT_LINE, marker={"size": 8}, hoverinfo="text",
        text=[f"<b>trial {p.label}</b>: {p.deployment.name} seqs={p.params.get('max_num_seqs')}" for p in front]))
    fig.update_layout(title=f"{result.phase}: {result.launched} launched trials, {len(result.points)} measured points",
                      template="plotly_white",
                      xaxis_title=axis_titles[1], yaxis_title=axis_titles[0])
    return fig


def hypervolume_figure(result: PhaseResult) -> go.Figure:
    import plotly.graph_objects as go

    history = result.hypervolume_history
    fig = go.Figure(go.Scatter(x=list(range(1, len(history) + 1)), y=history, mode="lines+markers"))
    fig.update_layout(title=f"{result.phase}: hypervolume after each launched trial", template="plotly_white",
                      xaxis_title="launched trials", yaxis_title="hypervolume (ref 0, 0)")
    return fig


def write_figures(path: Path, title: str, figures: list[go.Figure], field: str = "--html") -> Path:
    """One self-contained HTML file (plotly.js inlined once)."""
    parts = [f"<html><head><meta charset='utf-8'><title>{title}</title></head><body><h1>{title}</h1>"]
    for i, fig in enumerate(figures):
        parts.append(fig.to_html(full_html=False, include_plotlyjs=(i == 0)))
    parts.append("</body></html>")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(parts))
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror}", field=field, fix="give a writable path") from exc
    return path


def campaign_figures(result: CampaignResult, composed_title: str, *, hypervolume: bool = False) -> list[go.Figure]:
    """The composed PD front (when there is one), then each phase (and its hypervolume history): what the HTML
    report and the study page show, with the same axis labels."""
    from tuner.study import PHASE_AXES

    figures = []
    if result.composed_front:
        figures.append(composed_front_figure(result.composed, result.composed_front, composed_title, numbered=True))
    for phase, pr in result.phases.items():
        figures.append(phase_figure(pr, PHASE_AXES[phase]))
        if hypervolume:
            figures.append(hypervolume_figure(pr))
    return figures


def write_campaign_report(result: CampaignResult, path: Path) -> Path:
    figures = campaign_figures(result, f"{result.name}: composed PD front (measured curves)", hypervolume=True)
    return write_figures(path, f"topotune: {result.name}", figures, field="report")


def replay_figures(report: ReplayReport) -> list[go.Figure]:
    """A replay's TTFT CDF (every measured request) and its queue, running batch and KV use over time."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    ttft = sorted(r.ttft_ms for r in report.requests)
    n = len(ttft)
    cdf = go.Figure(go.Scatter(x=ttft, y=[(i + 1) / n for i in range(n)], mode="lines", line=FRONT_LINE,
                               name="TTFT"))
    cdf.update_layout(title=f"TTFT CDF: p50 {report.ttft_ms.p50:,.0f} ms, p90 {report.ttft_ms.p90:,.0f} ms, "
                            f"p99 {report.ttft_ms.p99:,.0f} ms", xaxis_title="TTFT (ms)",
                      yaxis_title="share of requests")
    t = [p.t_s for p in report.timeline]
    line = make_subplots(specs=[[{"secondary_y": True}]])
    line.add_trace(go.Scatter(x=t, y=[p.waiting for p in report.timeline], name="waiting"), secondary_y=False)
    line.add_trace(go.Scatter(x=t, y=[p.running for p in report.timeline], name="running"), secondary_y=False)
    line.add_trace(go.Scatter(x=t, y=[p.kv_used for p in report.timeline], name="KV used (share)",
                              line={"dash": "dot"}), secondary_y=True)
    line.update_layout(title=f"Queue and KV over time: {report.queue.describe()}", xaxis_title="time (s)")
    line.update_yaxes(title_text="requests", secondary_y=False)
    line.update_yaxes(title_text="KV blocks held (share)", range=[0, 1], secondary_y=True)
    return [cdf, line]
