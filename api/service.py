"""What the routes, the runner and the watcher share: build a study request, register a model.

Everything here goes through the tuner's public API (load_model, parse_space, sweep_topologies, Campaign); the
routes only translate HTTP to these calls.
"""

from __future__ import annotations

import json
import stat
import threading
import uuid
from functools import lru_cache
from pathlib import Path

import yaml
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from api.config import ApiSettings
from api.errors import FieldError
from api.models import EventRecord, ModelRecord, ModelStatus, StudyRecord, StudyStatus
from api.paths import confine, no_such_trace
from api.schemas import StudyCreate
from tuner.backends import backend_config
from tuner.errors import ConfigError, TopotuneError, UnsupportedModelError
from tuner.hardware import get_gpu
from tuner.memory import MemoryInputs, sweep_topologies
from tuner.models import ModelSpec, load_model
from tuner.space import SearchSpace, WorkloadSpec, load_space, parse_space, read_space_file
from tuner.study import campaign_name
from tuner.tune import SlaOverride, TuneRequest
from tuner.workload import workload_error

MAX_CONFIG_BYTES = 16 * 1024 * 1024


def request_campaign(model_name: str, gpu: str, space: SearchSpace, study_id: int) -> str:
    """The request's own campaign name: two requests for the same model and space are two independent studies
    (the library's default name is per model, GPU and workload only); the runner hands it to Campaign."""
    return f"{campaign_name(model_name, gpu, space.isl, space.osl)}/r{study_id}"


# -- model configs: JSON only, regular files only, bounded size --------------------------------------------------
class ConfigNotReady(Exception):
    """config.json is missing or not (yet) complete JSON: a writer may still be at it (the watcher retries)."""


class ConfigRejected(ConfigNotReady):
    """config.json can never be read as a model: not a regular file, too large, or not a JSON object."""


def config_file(model_path: Path) -> Path:
    return model_path / "config.json" if model_path.is_dir() else model_path


def check_config_ready(model_path: Path) -> None:
    """Parse config.json as JSON (never as code) before the library reads it: a truncated file is retried."""
    path = config_file(model_path)
    try:
        st = path.stat()
    except OSError as exc:
        raise ConfigNotReady(f"no readable config.json at {path} ({exc.strerror}) (fix: give a model folder that "
                             "holds config.json, or the file itself: relative to the models dir, or an absolute path "
                             "under TOPOTUNE_ALLOWED_ROOTS)") from exc
    if not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
        raise ConfigRejected(f"{path} is not a regular file")
    if st.st_size > MAX_CONFIG_BYTES:
        raise ConfigRejected(f"{path} is larger than {MAX_CONFIG_BYTES // 2**20} MiB; a model config is a few KiB")
    try:
        data = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigNotReady(f"{path} is not complete JSON yet ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigRejected(f"{path} must hold a JSON object")


@lru_cache(maxsize=256)
def _load_model_cached(path: str, mtime_ns: int, size: int) -> ModelSpec:
    return load_model(path)


def read_model(model_path: Path) -> ModelSpec:
    """load_model, cached per (path, mtime, size) so repeated requests for one checkpoint cost nothing."""
    check_config_ready(model_path)
    st = config_file(model_path).stat()
    return _load_model_cached(str(model_path), st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=256)
def _check_space_fits(space_json: str, model_path: str, mtime_ns: int, size: int, phases: tuple[str, ...]) -> None:
    space = SearchSpace.model_validate_json(space_json)
    model = _load_model_cached(model_path, mtime_ns, size)
    for phase in phases:
        if phase in space.phases:
            space.expand(phase, model)  # type: ignore[arg-type]


def check_space(space: SearchSpace, model_path: Path, phases: tuple[str, ...]) -> None:
    """Fail at request time when a phase has no valid configuration (what Campaign would raise later)."""
    st = config_file(model_path).stat()
    _check_space_fits(space.model_dump_json(), str(model_path), st.st_mtime_ns, st.st_size, phases)


# -- study requests -------------------------------------------------------------------------------------------------
def resolve_space(body: StudyCreate, settings: ApiSettings) -> SearchSpace:
    try:
        if body.space_path is not None:
            path = confine(body.space_path, settings.space_roots, base=settings.default_space.parent,
                           loc=("body", "space_path"))
            if not path.exists():
                raise FieldError(("body", "space_path"), "no such space file")
            # read_space_file refuses what is not a regular file and does not read the space's trace: that
            # path is confined by _with_trace before anything opens it
            return _with_trace(read_space_file(path), path.parent, settings, ("body", "space_path"))
        if isinstance(body.space, dict):
            space = parse_space(yaml.safe_dump(body.space), "space")
        elif isinstance(body.space, str):
            space = parse_space(body.space, "space")
        else:
            return load_space(settings.default_space)
        return _with_trace(space, settings.default_space.parent, settings, ("body", "space", "workload", "trace"))
    except TopotuneError as exc:
        loc = ("body", "space_path") if body.space_path is not None else ("body", "space")
        raise FieldError.of(loc, exc) from exc
    except (ValueError, TypeError, RecursionError) as exc:  # yaml oddities the space loader does not wrap
        raise FieldError(("body", "space"), f"not a valid search space: {exc}") from exc


def _with_trace(space: SearchSpace, base: Path, settings: ApiSettings, loc: tuple[str, ...]) -> SearchSpace:
    """A trace the space names is read only under an allowed root (like a model path), and read now: a bad
    line is the request's 422, not a study that fails later."""
    trace = space.workload.trace
    if trace is None:
        return space
    path = confine(trace, settings.allowed_roots, base=base, loc=loc)  # before anything opens or stats it
    if not path.exists():
        raise no_such_trace(trace, base, loc)
    confined = space.model_copy(update={"workload": space.workload.model_copy(update={"trace": str(path)})})
    confined.with_base_dir(base)
    confined.traffic  # noqa: B018 - reads and summarises the trace (errors name its line and field)
    return confined


def with_workload(space: SearchSpace, body: StudyCreate, settings: ApiSettings) -> SearchSpace:
    """The space with the request's workload block in place of its own (a trace confined and read now)."""
    if body.workload is None:
        return space
    loc = ("body", "workload")
    try:
        block = WorkloadSpec.model_validate(body.workload)
        changed = SearchSpace.model_validate({**json.loads(space.model_dump_json()),
                                              "workload": block.model_dump(mode="json", exclude_none=True)})
    except ValidationError as exc:
        error = workload_error(exc, "workload")
        raise FieldError.of(("body", *(error.field or "workload").split(".")), error) from None
    if block.trace is None:
        return changed.with_base_dir(settings.default_space.parent)
    return _with_trace(changed, settings.default_space.parent, settings, (*loc, "trace"))


def confine_model_path(raw: str | Path, settings: ApiSettings, loc: tuple[str, ...]) -> Path:
    """THE check of every model path the service acts on, whoever found it (a request, the watcher, the runner):
    resolved with symlinks followed, it must lie under an allowed root."""
    return confine(str(raw), settings.allowed_roots, base=settings.model_store, loc=loc)


def resolve_model(raw: str, settings: ApiSettings, loc: tuple[str, ...]) -> tuple[Path, ModelSpec]:
    path = confine_model_path(raw, settings, loc)
    try:
        return path, read_model(path)
    except ConfigNotReady as exc:
        raise FieldError(loc, str(exc)) from exc
    except TopotuneError as exc:
        raise FieldError.of(loc, exc) from exc


def new_study(session: Session, *, model_path: Path, model: ModelSpec, request: TuneRequest) -> StudyRecord:
    """Insert a queued study request (the runner picks it up after commit); the record stores `request` itself."""
    space = request.constrained_space
    chosen = tuple(p for p in (request.phases or tuple(space.phases)) if p in space.phases)
    if not chosen:
        raise FieldError(("body", "phases"), f"the space has only {', '.join(space.phases)}")
    request = request.model_copy(update={"phases": chosen})
    try:
        gpu = get_gpu(space.cluster.gpu)
        check_space(space, model_path, chosen)
    except TopotuneError as exc:
        raise FieldError.of(("body", "space"), exc) from exc
    record = StudyRecord(campaign=f"pending-{uuid.uuid4().hex}", model_name=model.name,
                         model_path=str(model_path), space=json.loads(space.model_dump_json()), space_name=space.name,
                         backend=request.backend.kind, request_json=json.loads(request.model_dump_json()),
                         trials_per_phase=request.trials, sampler=request.sampler, seed=request.seed,
                         warm_start=request.warm_start, status=StudyStatus.QUEUED, resumes=0)
    session.add(record)
    session.flush()
    record.campaign = request_campaign(model.name, gpu.name, space, record.id)
    session.add(EventRecord(study_id=record.id, kind="queued",
                            message=f"{request.trials} trials per phase, {request.backend.kind}"))
    return record


def sla_override(body: StudyCreate) -> SlaOverride:
    """The request's constraint fields (only those it gave) as the override of the space's own."""
    if body.constraints is None:
        return SlaOverride()
    return SlaOverride.model_validate(body.constraints.model_dump(exclude_unset=True))


def tune_request(settings: ApiSettings, body: StudyCreate, model_path: Path, space: SearchSpace) -> TuneRequest:
    """The body as the library's request: one backend builder for the service and the CLI (a CPU cluster's vllm
    backend plans vllm-cpu)."""
    try:
        backend = backend_config(body.backend, gpu=space.cluster.gpu, noise=body.noise, delay_s=body.trial_delay_s)
        return TuneRequest.create(model_path=str(model_path), space=space, backend=backend, sla=sla_override(body),
                                  trials=body.trials, sampler=body.sampler, seed=body.seed,
                                  warm_start=body.warm_start, phases=tuple(body.phases) if body.phases else None,
                                  retry_risks=body.retry_risks)
    except TopotuneError as exc:
        named = exc.renamed(STUDY_FIELDS)
        raise FieldError.of(("body", *(named.field or "backend").split(".")), named) from exc


# The library request's fields under their StudyCreate body names (an error's loc and text).
STUDY_FIELDS = {"backend.kind": "backend", "backend.noise": "noise", "backend.delay_s": "trial_delay_s",
                "sla": "constraints", **{f"sla.{name}": f"constraints.{name}" for name in SlaOverride.model_fields}}


def create_study(session: Session, settings: ApiSettings, body: StudyCreate) -> StudyRecord:
    model_path, model = resolve_model(body.model_path, settings, ("body", "model_path"))
    request = tune_request(settings, body, model_path, with_workload(resolve_space(body, settings), body, settings))
    record = new_study(session, model_path=model_path, model=model, request=request)
    session.commit()
    return record


# -- models ---------------------------------------------------------------------------------------------------------
_REGISTER_LOCK = threading.Lock()


def screen_model(model: ModelSpec, space: SearchSpace) -> str | None:
    """None when some layout of the configured cluster holds the model and one request, else why not."""
    gpu = get_gpu(space.cluster.gpu)
    rows = sweep_topologies(model, gpu, space.cluster.num_gpus,
                            MemoryInputs(isl=space.isl, osl=space.osl))
    if any(r.memory.fits for r in rows):
        return None
    if not rows:
        return f"no parallel layout of {model.name} is valid on {space.cluster.num_gpus} x {gpu.name}"
    best = min(rows, key=lambda r: r.memory.shortfall_gib)
    return (f"cannot fit anywhere on {space.cluster.num_gpus} x {gpu.name}: the closest layout "
            f"({best.topology.name}) {best.memory.verdict()}")


def register_model(session: Session, settings: ApiSettings, raw_path: str | Path, *, source: str,
                   auto_tune: bool = True, loc: tuple[str, ...] = ("body", "path"),
                   unreadable: str | None = None) -> tuple[ModelRecord, bool]:
    """(record, created). The same resolved path is registered once and starts at most one study.

    The path goes through confine_model_path (FieldError on `loc` when it leads outside the allowed roots).
    Raises ConfigNotReady while config.json is missing or incomplete (the watcher retries; the API answers 422).
    `unreadable` registers the model as unsupported with that reason without reading it (the watcher's verdict
    on a config that never became JSON).
    """
    path = confine_model_path(raw_path, settings, loc)
    existing = session.scalar(select(ModelRecord).where(ModelRecord.path == str(path)))
    if existing is not None:
        return existing, False
    if unreadable is None:
        check_config_ready(path)
    with _REGISTER_LOCK:  # one registration at a time in this process; the unique index guards across processes
        existing = session.scalar(select(ModelRecord).where(ModelRecord.path == str(path)))
        if existing is not None:
            return existing, False
        status, reason, model = ModelStatus.REGISTERED, None, None
        try:
            if unreadable is not None:
                status, reason = ModelStatus.UNSUPPORTED, unreadable
            else:
                model = read_model(path)
        except (UnsupportedModelError, ConfigError) as exc:
            status, reason = ModelStatus.UNSUPPORTED, exc.user_message()
        record = ModelRecord(path=str(path), name=model.name if model else path.name, source=source,
                             status=status, reason=reason)
        try:
            session.add(record)
            if model is not None:
                _screen_and_queue(session, settings, record, model, path, auto_tune=auto_tune)
            session.commit()
        except IntegrityError:  # another process registered it first: its study is the one
            session.rollback()
            other = session.scalar(select(ModelRecord).where(ModelRecord.path == str(path)))
            assert other is not None
            return other, False
        return record, True


def _screen_and_queue(session: Session, settings: ApiSettings, record: ModelRecord, model: ModelSpec, path: Path,
                      *, auto_tune: bool) -> None:
    """Screen with the memory model, then queue a study, in the same transaction as the model row."""
    try:
        space = load_space(settings.default_space)
        reason = screen_model(model, space)
        if reason is not None:
            record.status, record.reason = ModelStatus.DOES_NOT_FIT, reason
        elif auto_tune:
            request = TuneRequest(model_path=str(path), space=space, trials=settings.default_trials,
                                  sampler=settings.default_sampler,
                                  backend=backend_config(settings.default_backend, gpu=space.cluster.gpu))
            study = new_study(session, model_path=path, model=model, request=request)
            record.status, record.study_id = ModelStatus.TUNING, study.id
    except FieldError as exc:
        record.status, record.reason = ModelStatus.UNSUPPORTED, exc.message
    except TopotuneError as exc:
        record.status, record.reason = ModelStatus.UNSUPPORTED, exc.user_message()
