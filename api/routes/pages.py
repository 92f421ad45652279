"""/ui pages: the list of studies, the start-a-study form, one study (Plotly front, front table with export links,
cancel, the trials in flight with their logs) and two studies' fronts on one chart.

Pages only read; every mutation is the page's JavaScript calling the REST API (`POST /v1/studies`,
`POST /v1/studies/{id}/cancel`) with the session cookie and its CSRF token, so the form and the API share one
validation path and a 422 names the form's field.

Constraints are shown from the stored constraint values (the embedded Optuna dashboard ignores Optuna 5
constraints and would show infeasible trials as feasible).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_args

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.templating import Jinja2Templates
from sqlalchemy import select

from api.advice import study_advice
from api.choices import model_choices, space_choices, trace_choices, trace_summary
from api.cluster_view import anchor_of, cluster_views
from api.deps import CacheDep, SessionDep, SettingsDep, StudyDep
from api.live import LiveView, live_view
from api.models import EventRecord, StudyRecord
from api.schemas import AdviceCreate, ReverifyCreate, StudyCreate
from api.views import Snapshot, dashboard_url, exportable, phase_progress, points_stored
from tuner.advise import Fronts, recommend
from tuner.cluster import ClusterKey
from tuner.errors import TopotuneError
from tuner.export import simulated_label
from tuner.frontier import ComposedPoint, binding_bound
from tuner.hardware import default_catalog, get_gpu
from tuner.space import WorkloadSpec
from tuner.study import PHASE_AXES, ReverifyReport, ReverifyRow, recipe_versions, stored_reports, version_fronts

router = APIRouter(prefix="/ui", tags=["pages"], include_in_schema=False)
TEMPLATES = Jinja2Templates(directory=str(Path(__file__).resolve().parents[1] / "templates"))


def _plotly_js() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def figures(record: StudyRecord, snap: Snapshot) -> list[dict[str, Any]]:
    """Plotly figures as JSON: the composed PD front (every xPyD deployment faint, the front bold), then each
    phase (feasible points faint, SLA-infeasible marked x, the feasible front bold)."""
    from tuner.report import campaign_figures

    if snap.result is None:
        return []
    figs = [json.loads(f.to_json()) for f in campaign_figures(snap.result, f"study {record.id}: composed PD front")]
    return figs + version_figures(snap)


REGRESSIONS = ("slower", "no longer starts")


def version_figures(snap: Snapshot) -> list[dict[str, Any]]:
    """Per phase with a history: the front each vLLM version (and model revision) measured, on one chart, and
    every config a re-verification found slower or no longer starting marked (a red x where it used to be)."""
    if snap.result is None:
        return []
    regressions = [(row.phase, r) for row in snap.rows if row.record.attrs.reverify
                   and (r := ReverifyRow.from_json(row.record.attrs.reverify)).verdict in REGRESSIONS]
    out = []
    for phase, pr in snap.result.phases.items():
        every = [*pr.points, *pr.superseded]
        fronts = version_fronts(every)
        verdicts = {id(p): r.verdict for p in every for ph, r in regressions if ph == phase and r.compared(p)}
        marked = [p for p in every if id(p) in verdicts]
        if len(fronts) < 2 and not marked:
            continue
        x_title, y_title = PHASE_AXES[phase]
        data: list[dict[str, Any]] = [
            {"type": "scatter", "mode": "lines+markers", "name": tag.label, "line": {"shape": "hv"},
             "x": [p.values[0] for p in sorted(pts, key=lambda p: p.values[0])],
             "y": [p.values[1] for p in sorted(pts, key=lambda p: p.values[0])],
             "text": [p.deployment.groups[0].topology.label() for p in sorted(pts, key=lambda p: p.values[0])]}
            for tag, pts in fronts.items()]
        if marked:
            data.append({"type": "scatter", "mode": "markers", "name": "regression (slower / no longer starts)",
                         "marker": {"symbol": "x", "size": 13, "color": "#c0392b"},
                         "x": [p.values[0] for p in marked], "y": [p.values[1] for p in marked],
                         "text": [f"trial {p.label} {p.deployment.groups[0].topology.label()}: "
                                  f"{verdicts[id(p)]}" for p in marked]})
        out.append({"data": data, "layout": {"title": {"text": f"{phase}: front per vLLM version"},
                                             "xaxis": {"title": {"text": x_title}},
                                             "yaxis": {"title": {"text": y_title}},
                                             "meta": {"kind": "version-history", "phase": phase}}})
    return out


def constraint_summary(snap: Snapshot) -> dict[str, dict[str, int]]:
    """Per phase: measured points violating each constraint (value > 0)."""
    out: dict[str, dict[str, int]] = {}
    if snap.result is None:
        return out
    for phase, pr in snap.result.phases.items():
        counts: dict[str, int] = {}
        for p in pr.points:
            for name, value in p.constraints.items():
                if value > 0:
                    counts[name] = counts.get(name, 0) + 1
        out[phase] = counts
    return out


@router.get("", response_class=HTMLResponse)
def studies_page(request: Request, session: SessionDep) -> HTMLResponse:
    rows = session.scalars(select(StudyRecord).order_by(StudyRecord.id.desc()).limit(500)).all()
    return TEMPLATES.TemplateResponse(request, "studies.html", {"studies": rows})


@router.get("/new", response_class=HTMLResponse)
def new_study_page(request: Request, session: SessionDep, settings: SettingsDep) -> HTMLResponse:
    """The form posts StudyCreate's JSON to /v1/studies; its defaults and bounds come from that schema."""
    fields = StudyCreate.model_fields
    return TEMPLATES.TemplateResponse(request, "new.html", {
        "models": model_choices(session, settings), "spaces": space_choices(settings),
        "traces": trace_choices(settings),
        "defaults": {name: f.default for name, f in fields.items()},
        "samplers": get_args(fields["sampler"].annotation), "backends": get_args(fields["backend"].annotation),
        "max_trials": next(m.le for m in fields["trials"].metadata if hasattr(m, "le"))})


@router.get("/advice", response_class=HTMLResponse)
def advice_page(request: Request, session: SessionDep, settings: SettingsDep) -> HTMLResponse:
    """"What should I deploy?": the form posts AdviceCreate's JSON to /v1/advice and draws the answer."""
    fields = AdviceCreate.model_fields
    return TEMPLATES.TemplateResponse(request, "advice.html", {
        "models": model_choices(session, settings), "traces": trace_choices(settings),
        "hardware": default_catalog().names(), "defaults": {name: f.default for name, f in fields.items()},
        "modes": get_args(fields["mode"].annotation)})


@router.get("/traces/summary")
def trace_summary_json(settings: SettingsDep, path: str) -> JSONResponse:
    """What a trace the forms' pickers offer holds: lengths, arrival rate, prefix reuse."""
    return JSONResponse(trace_summary(path, settings))


@router.get("/compare", response_class=HTMLResponse)
def compare_page(request: Request, session: SessionDep, a: int | None = None, b: int | None = None) -> HTMLResponse:
    """Two studies' fronts on one chart; the page reads each /v1/studies/{id}/pareto (the cached fronts)."""
    rows = session.scalars(select(StudyRecord).order_by(StudyRecord.id.desc()).limit(500)).all()
    ids = [r.id for r in rows]
    a = a if a in ids else (ids[1] if len(ids) > 1 else None)
    b = b if b in ids else (ids[0] if ids else None)
    # what each compared study measured under: fronts of different traffic or SLA are not comparable point by point
    asked = {r.id: {"traffic": _traffic(r.space), "sla": _sla_text(r.space.get("constraints", {}))}
             for r in rows if r.id in (a, b)}
    return TEMPLATES.TemplateResponse(request, "compare.html", {
        "studies": rows, "phase_axes": PHASE_AXES, "a": a, "b": b, "asked": asked})


def _load(p: ComposedPoint) -> str:
    """The load a front point holds at, per instance: its requests/s (open loop) or its clients (closed loop)."""
    if p.decode.offered_rps is not None and p.prefill.offered_rps is not None:
        return f"P {p.prefill.offered_rps:.3g}, D {p.decode.offered_rps:.3g} req/s"
    return f"P {p.prefill.concurrency}, D {p.decode.concurrency} clients"


def _sla_text(c: dict[str, Any]) -> str:
    bounds = [f"TTFT <= {c['max_ttft_ms']:g} ms" if c.get("max_ttft_ms") else "",
              f"ITL <= {c['max_itl_ms']:g} ms" if c.get("max_itl_ms") else ""]
    return (", ".join(b for b in bounds if b) or "no latency bound") + f" at {c.get('percentile') or 'p90'}"


@router.get("/clusters", response_class=HTMLResponse)
def clusters_page(request: Request, settings: SettingsDep, held_out: bool = False) -> HTMLResponse:
    """What every study taught each cluster (api/cluster_view.py); `?held_out=true` also scores the fit leaving
    each model out (one more fit per model: seconds, so only when asked)."""
    return TEMPLATES.TemplateResponse(request, "clusters.html", {
        "clusters": cluster_views(settings.database_url, held_out=held_out), "held_out": held_out})


def study_cluster(space: dict) -> tuple[str, str] | None:
    """The cluster a service study records into and learns from (the default name of its GPU and network), and
    its section on /ui/clusters."""
    try:
        cluster = space["cluster"]
        name = ClusterKey.of(get_gpu(cluster["gpu"]), cluster.get("vllm_version")).name
    except (KeyError, TypeError, TopotuneError):
        return None
    return name, anchor_of(name)


@router.get("/static/plotly.min.js")
def plotly_js() -> FileResponse:
    return FileResponse(_plotly_js(), media_type="application/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})


@router.get("/studies/{study_id}", response_class=HTMLResponse)
def study_page(request: Request, record: StudyDep, session: SessionDep, cache: CacheDep,
               settings: SettingsDep) -> HTMLResponse:
    snap = cache.snapshot(record, full=True)
    reports = _reports(record, settings.database_url)
    events = session.scalars(select(EventRecord).where(EventRecord.study_id == record.id)
                             .order_by(EventRecord.id.desc()).limit(15)).all()
    result = snap.result
    front = result.front_table() if result else []
    limits = record.space.get("constraints", {})
    # the measured recommendation: the library's pick over the composed front (every point of it meets the SLA)
    best = recommend(Fronts(result.composed, result.composed_front, [], [])).disaggregated if result else None
    recommended = result.composed_front.index(best) if result and best is not None else None
    top = front[recommended] if recommended is not None else None
    binding = binding_bound(top.ttft_ms, top.itl_ms, max_ttft_ms=limits.get("max_ttft_ms"),
                            max_itl_ms=limits.get("max_itl_ms")) if top else None
    return TEMPLATES.TemplateResponse(request, "study.html", {
        "study": record, "snap": snap, "result": result, "phases": phase_progress(record, snap),
        "constraints": record.space.get("constraints", {}), "violations": constraint_summary(snap),
        "points_stored": points_stored(snap),
        "front": front, "recommended": recommended, "binding": binding, "traffic": _traffic(record.space),
        "loads": [_load(p) for p in result.composed_front] if result else [],
        "phase_fronts": {ph: sorted(pr.front, key=lambda p: -p.values[0]) for ph, pr in result.phases.items()}
        if result else {},
        "exportable": len(exportable(result)) if result else 0, "events": events,
        "reverify": reports[-1] if reports else None, "reverify_count": len(reports),
        "reverify_form": reverify_form(),
        "verified_on": [simulated_label(v) if record.backend == "simulated" else v
                        for v in recipe_versions(result)] if result else [],
        "cluster": study_cluster(record.space),
        "dashboard": {ph: dashboard_url(sid) for ph, sid in snap.study_ids.items()}})


def _reports(record: StudyRecord, storage_url: str) -> list[ReverifyReport]:
    try:
        return stored_reports(storage_url, record.campaign)
    except TopotuneError:  # no trials yet
        return []


def reverify_form() -> dict[str, Any]:
    """The re-verify form's defaults and bounds, from the endpoint's schema (one validation path)."""
    fields = ReverifyCreate.model_fields

    def most(name: str) -> int:
        return next(m.le for m in fields[name].metadata if hasattr(m, "le"))

    return {"budget": fields["budget"].default, "budget_max": most("budget"), "repeats": fields["repeats"].default,
            "repeats_max": most("repeats"), "reopen": fields["reopen"].default}


def _traffic(space: dict) -> str:
    """The study's workload in words (a stored space was validated when the study was created)."""
    try:
        return WorkloadSpec.model_validate(space.get("workload", {})).describe()
    except (ValueError, TopotuneError) as exc:
        return f"unreadable workload block ({exc})"


@router.get("/studies/{study_id}/advice")
def study_advice_json(record: StudyDep, settings: SettingsDep) -> JSONResponse:
    """The advice for the study's traffic and SLA (POST /v1/advice's answer for what the study asks), or why there
    is none; the study page loads it after it renders (the first one takes about a second)."""
    answer = study_advice(record, settings)
    if isinstance(answer, str):
        return JSONResponse({"advice": None, "error": answer})
    return JSONResponse({"advice": answer.model_dump(), "error": None})


@router.get("/studies/{study_id}/live")
def study_live(record: StudyDep, session: SessionDep, settings: SettingsDep) -> LiveView:
    """What the page polls every 2 s while the study runs: status, trials in flight with their log tails, events.
    Never builds a front (the page fetches /figures only when an event says a trial finished)."""
    return live_view(session, record, settings.database_url, settings.artifacts_dir)


@router.get("/studies/{study_id}/figures")
def study_figures(record: StudyDep, cache: CacheDep) -> JSONResponse:
    """What the page polls while the study runs: status, stored trials, the figures."""
    snap = cache.snapshot(record, full=True)
    try:
        figs = snap.memo(f"figures/{record.status.value}", lambda: figures(record, snap))
    except TopotuneError as exc:
        figs, snap.error = [], exc.user_message()
    phases = {name: {"launched": p.launched, "budget": p.budget, "counts": p.counts}
              for name, p in phase_progress(record, snap).items()}
    return JSONResponse({"status": record.status.value, "trials_stored": snap.trials_stored,
                         "points_stored": points_stored(snap), "figures": figs,
                         "active": record.status.active, "phases": phases})


# -- deployment watches (#48) ----------------------------------------------------------------------------------------
@router.get("/watches", response_class=HTMLResponse)
def watches_page(request: Request, session: SessionDep) -> HTMLResponse:
    """Every deployment watch: what it watches, its baseline traffic, its last period and its latest advice."""
    from api.models import WatchRecord
    from api.routes.watches import public

    records = session.scalars(select(WatchRecord).order_by(WatchRecord.id)).all()
    return TEMPLATES.TemplateResponse(request, "watches.html", {"watches": [public(r, session) for r in records]})


@router.get("/watches/{watch_id}", response_class=HTMLResponse)
def watch_page(request: Request, watch_id: int, session: SessionDep) -> HTMLResponse:
    """One watch: its latest advice (the deployment, the expected gain, the commands: never run by topotune) and
    every period's decision."""
    from api.models import WatchEventRecord, WatchRecord
    from api.routes.watches import public

    record = session.get(WatchRecord, watch_id)
    if record is None:
        return HTMLResponse(f"<p>no watch {watch_id}</p>", status_code=404)
    events = session.scalars(select(WatchEventRecord).where(WatchEventRecord.watch_id == watch_id)
                             .order_by(WatchEventRecord.id.desc()).limit(200)).all()
    return TEMPLATES.TemplateResponse(request, "watch.html", {"watch": public(record, session), "events": events})
