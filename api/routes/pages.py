"""/ui pages: the list of studies and one study (Plotly front, front table with export links, live refresh).

Constraints are shown from the stored constraint values (the embedded Optuna dashboard ignores Optuna 5
constraints and would show infeasible trials as feasible).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse
from fastapi.templating import Jinja2Templates
from sqlalchemy import select

from api.deps import CacheDep, SessionDep, StudyDep
from api.models import EventRecord, StudyRecord
from api.views import Snapshot, dashboard_url, exportable, phase_progress
from tuner.errors import TopotuneError

router = APIRouter(prefix="/ui", tags=["pages"], include_in_schema=False)
TEMPLATES = Jinja2Templates(directory=str(Path(__file__).resolve().parents[1] / "templates"))
AXES = {"prefill": ("total tokens/s per GPU", "prompt tokens/s per user"),
        "decode": ("total tokens/s per GPU", "generated tokens/s per user")}


def _plotly_js() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def figures(record: StudyRecord, snap: Snapshot) -> list[dict[str, Any]]:
    """Plotly figures as JSON: the composed PD front (every xPyD deployment faint, the front bold), then each
    phase (feasible points faint, SLA-infeasible marked x, the feasible front bold)."""
    from tuner.report import composed_front_figure, phase_figure

    result = snap.result
    if result is None:
        return []
    figs = []
    if result.composed_front:
        figs.append(composed_front_figure(result.composed, result.composed_front,
                                          f"study {record.id}: composed PD front"))
    for phase, pr in result.phases.items():
        figs.append(phase_figure(pr, AXES[phase]))
    return [json.loads(f.to_json()) for f in figs]


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


@router.get("/static/plotly.min.js")
def plotly_js() -> FileResponse:
    return FileResponse(_plotly_js(), media_type="application/javascript",
                        headers={"Cache-Control": "public, max-age=86400"})


@router.get("/studies/{study_id}", response_class=HTMLResponse)
def study_page(request: Request, record: StudyDep, session: SessionDep, cache: CacheDep) -> HTMLResponse:
    snap = cache.snapshot(record, full=True)
    events = session.scalars(select(EventRecord).where(EventRecord.study_id == record.id)
                             .order_by(EventRecord.id.desc()).limit(15)).all()
    result = snap.result
    return TEMPLATES.TemplateResponse(request, "study.html", {
        "study": record, "snap": snap, "result": result, "phases": phase_progress(record, snap),
        "constraints": record.space.get("constraints", {}), "violations": constraint_summary(snap),
        "front": result.front_table() if result else [],
        "phase_fronts": {ph: sorted(pr.front, key=lambda p: -p.values[0]) for ph, pr in result.phases.items()}
        if result else {},
        "exportable": len(exportable(result)) if result else 0, "events": events,
        "dashboard": {ph: dashboard_url(sid) for ph, sid in snap.study_ids.items()}})


@router.get("/studies/{study_id}/figures")
def study_figures(record: StudyDep, cache: CacheDep) -> JSONResponse:
    """What the page polls while the study runs: status, stored trials, the figures."""
    snap = cache.snapshot(record, full=True)
    try:
        figs = snap.memo(f"figures/{record.status.value}", lambda: figures(record, snap))
    except TopotuneError as exc:
        figs, snap.error = [], exc.user_message()
    return JSONResponse({"status": record.status.value, "trials_stored": snap.trials_stored, "figures": figs,
                         "active": record.status.active})
