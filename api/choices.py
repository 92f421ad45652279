"""What the start-a-study form offers: the models the service knows and the search spaces on its disk.

Only offers: the form posts the same JSON as `POST /v1/studies`, so every value is checked there (paths confined
to the allowed roots, the space parsed and bounded), one validation path for the page and the API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.config import ApiSettings
from api.errors import FieldError
from api.models import ModelRecord, ModelStatus
from api.paths import confine
from tuner.errors import TopotuneError
from tuner.space import read_space_file
from tuner.workload import Workload

MAX_CHOICES = 200
MAX_SPACE_FILE_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ModelChoice:
    value: str  # what goes into model_path: relative to the model store when under it
    name: str
    note: str  # registered status, or "in the model store"
    usable: bool


@dataclass(frozen=True)
class SpaceChoice:
    value: str  # what goes into space_path
    name: str
    phases: list[str]
    constraints: dict[str, Any] = field(default_factory=dict)
    is_default: bool = False


def _relative(path: Path, store: Path) -> str:
    try:
        return str(path.relative_to(store.resolve()))
    except ValueError:
        return str(path)


def model_choices(session: Session, settings: ApiSettings) -> list[ModelChoice]:
    """Registered models (newest first), then folders with a config.json in the model store not yet registered."""
    store = settings.model_store
    out: list[ModelChoice] = []
    seen: set[str] = set()
    for r in session.scalars(select(ModelRecord).order_by(ModelRecord.id.desc()).limit(MAX_CHOICES)):
        seen.add(r.path)
        usable = r.status in (ModelStatus.TUNING, ModelStatus.REGISTERED)
        out.append(ModelChoice(_relative(Path(r.path), store), r.name, f"registered, {r.status.value}"
                               + (f": {r.reason[:120]}" if r.reason and not usable else ""), usable))
    try:
        folders = sorted(p for p in store.iterdir() if (p / "config.json").is_file())[:MAX_CHOICES]
    except OSError:
        folders = []
    for folder in folders:
        resolved = folder.resolve()
        if str(resolved) not in seen:
            out.append(ModelChoice(_relative(resolved, store), folder.name, "in the model store", True))
    return out


def space_choices(settings: ApiSettings) -> list[SpaceChoice]:
    """The YAML spaces next to the default space (the service's own folder of spaces), each parsed once here so
    the form can show its phases and constraints; a file that does not parse is left out."""
    folder = settings.default_space.parent
    out = []
    try:
        files = sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())[:MAX_CHOICES]
    except OSError:
        return []
    for path in files:
        if path.stat().st_size > MAX_SPACE_FILE_BYTES:
            continue
        try:
            space = read_space_file(path)  # the form shows phases and constraints: its trace is not read
        except (TopotuneError, ValueError):
            continue
        out.append(SpaceChoice(path.name, space.name, list(space.phases),
                               space.constraints.model_dump(), path.resolve() == settings.default_space.resolve()))
    return sorted(out, key=lambda c: not c.is_default)


MAX_TRACE_DEPTH = 3  # folders below an allowed root searched for traces


def trace_choices(settings: ApiSettings) -> list[str]:
    """Mooncake traces (*.jsonl) under the allowed roots, a few folders deep, for the advice page's picker (only an
    offer: POST /v1/advice confines and reads the path itself)."""
    out: list[str] = []
    for root in settings.allowed_roots:
        pending = [(root, 0)]
        while pending and len(out) < MAX_CHOICES:
            folder, depth = pending.pop()
            try:
                entries = sorted(folder.iterdir())
            except OSError:
                continue
            for entry in entries:
                if entry.is_symlink():
                    continue
                if entry.suffix == ".jsonl" and entry.is_file():
                    out.append(str(entry.resolve()))
                elif depth < MAX_TRACE_DEPTH and entry.is_dir() and not entry.name.startswith("."):
                    pending.append((entry, depth + 1))
    return sorted(set(out))[:MAX_CHOICES]


@lru_cache(maxsize=64)
def _summary(path: str, mtime_ns: int, size: int) -> dict[str, Any]:
    w = Workload.from_trace(path, concurrency=(1,))
    trace = w.trace
    assert trace is not None
    return {"describe": w.describe(load=False), "requests": trace.requests,
            "arrival_rps": None if trace.arrival_rps is None else round(trace.arrival_rps, 3),
            "prefix_reuse": round(trace.prefix_reuse, 4), "input_mean": round(w.input_tokens.expected, 1),
            "output_mean": round(w.output_tokens.expected, 1)}


def trace_summary(raw: str, settings: ApiSettings) -> dict[str, Any]:
    """What a trace the forms offer holds (its lengths, rate and prefix reuse), read once per file version; the
    path is confined to the allowed roots like every client path."""
    path = confine(raw, settings.allowed_roots, base=settings.default_space.parent, loc=("query", "path"))
    try:
        st = path.stat()
    except OSError as exc:
        raise FieldError(("query", "path"), f"cannot read the trace: {exc.strerror}") from exc
    if not path.is_file():
        raise FieldError(("query", "path"), "not a trace file")
    try:
        return _summary(str(path), st.st_mtime_ns, st.st_size)
    except TopotuneError as exc:
        raise FieldError.of(("query", "path"), exc) from exc
