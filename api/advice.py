"""The deployment question for the service: an AdviceCreate body as the library's AdviseRequest (paths confined,
the workload block resolved like a space's), and the library's errors as 422s naming the body's fields."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

from pydantic import ValidationError

from api.config import ApiSettings
from api.errors import FieldError
from api.models import StudyRecord
from api.paths import confine, no_such_trace
from api.schemas import AdviceCreate, AdvicePublic
from api.service import resolve_model
from tuner.advise import MAX_MTP_DEPTH, Advice, AdviseRequest, ServeOptions, Sla, advise
from tuner.errors import TopotuneError
from tuner.space import WorkloadSpec
from tuner.workload import Workload, workload_error

# The library request's fields under AdviceCreate's names (a 422's loc and text).
ADVICE_FIELDS = {"model": "model_path", "serve.mode": "mode", "serve.max_mtp": "max_mtp", "hardware_file": "hardware"}


def uploaded_trace(text: str, block: dict[str, object] | None, settings: ApiSettings) -> Workload:
    """An uploaded mooncake trace, read by the same streaming reader (and its limits) as a trace file, from a
    private temporary file (the replay reads it again: `answer` removes it, a bad upload is removed at once); a bad
    line is a 422 naming `trace_jsonl` and the line."""
    if block is not None and any(k in block for k in ("trace", "isl", "osl", "input_tokens", "output_tokens")):
        raise FieldError(("body", "trace_jsonl"), "an uploaded trace gives the lengths: drop the workload's "
                         "trace, isl/osl and input_tokens/output_tokens")
    uploads = settings.data_dir / "uploads"
    uploads.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", dir=uploads, delete=False, encoding="utf-8") as handle:
        handle.write(text)
        path = Path(handle.name)
    try:
        trace = Workload.from_trace(path, concurrency=(1,))
        load = WorkloadSpec.model_validate({"isl": 1, "osl": 1, **(block or {})}).load()
        return Workload.model_validate({**trace.model_dump(), **load}) if load else trace
    except TopotuneError as exc:
        path.unlink(missing_ok=True)
        where = f"{exc.field or ''}".replace(path.name, "").strip() or None
        raise FieldError(("body", "trace_jsonl"), (f"{where}: " if where else "") + exc.message.replace(
            str(path), "the uploaded trace") + (f" (fix: {exc.fix})" if exc.fix else "")) from None
    except ValidationError as exc:
        path.unlink(missing_ok=True)
        raise _field_error(workload_error(exc)) from None


def advice_workload(block: dict[str, object] | None, settings: ApiSettings, trace_jsonl: str | None = None
                    ) -> Workload:
    """A space's workload block as the traffic (a trace only under an allowed root, read now), or an uploaded
    trace (with the block's open-loop load, if any); neither: 8192/1024."""
    if trace_jsonl is not None:
        return uploaded_trace(trace_jsonl, block, settings)
    if block is None:
        return Workload.fixed(8192, 1024, concurrency=(1,))
    try:
        spec = WorkloadSpec.model_validate(block)
    except ValidationError as exc:
        raise _field_error(workload_error(exc)) from None
    base = settings.default_space.parent
    if spec.trace is not None:
        path = confine(spec.trace, settings.allowed_roots, base=base, loc=("body", "workload", "trace"))
        if not path.is_file():
            raise no_such_trace(spec.trace, base, ("body", "workload", "trace"))
        spec = spec.model_copy(update={"trace": str(path)})
    try:
        resolved = spec.resolve(base)
        return Workload.model_validate({**resolved.model_dump(), "concurrency": (1,)})
    except TopotuneError as exc:
        raise _field_error(exc) from None
    except ValidationError as exc:
        raise _field_error(workload_error(exc)) from None


def advice_request(body: AdviceCreate, settings: ApiSettings) -> AdviseRequest:
    """The body as the library's request: the model read (and cached) as every route reads one."""
    model_path, model = resolve_model(body.model_path, settings, ("body", "model_path"))
    try:
        return AdviseRequest(
            model=model, weights=str(model_path), workload=advice_workload(body.workload, settings, body.trace_jsonl),
            hardware=body.hardware, gpus=body.gpus, request_rate=body.request_rate, arrival=body.arrival,
            sla=Sla(max_ttft_ms=body.sla.max_ttft_ms, max_itl_ms=body.sla.max_itl_ms,
                    min_tok_s_user=body.sla.min_tok_s_user, percentile=body.sla.percentile),
            serve=ServeOptions(mode=body.mode, max_mtp=body.max_mtp), replay_verify=body.replay_verify,
            calibration=body.calibration)  # a mapping only (the schema): the service never reads a path named here
    except TopotuneError as exc:
        raise _field_error(exc) from None


def answer(body: AdviceCreate, settings: ApiSettings) -> tuple[Advice, AdvicePublic]:
    """The library's advice for the body, and its public shape. Raises FieldError (422) naming the field."""
    request = advice_request(body, settings)
    trace = request.workload.trace
    try:
        advice = advise(request)
        commands = advice.commands
    except TopotuneError as exc:
        raise _field_error(exc) from None
    finally:
        if body.trace_jsonl is not None and trace is not None:
            Path(trace.path).unlink(missing_ok=True)  # the uploaded trace's private copy
    deployment = advice.operating_deployment
    return advice, AdvicePublic.model_validate({
        **advice.as_json(), "reason": advice.reason, "setting": advice.setting, "commands": commands,
        "operating_deployment": deployment.name if deployment is not None else None})


def _field_error(exc: TopotuneError) -> FieldError:
    return FieldError.in_body(exc, ADVICE_FIELDS)


def study_request(record: StudyRecord, settings: ApiSettings) -> AdviseRequest:
    """What the study asks, as an advice request: its model, its cluster's GPUs as the budget, its traffic's lengths
    (closed loop: a study's open-loop rates are per instance, not the deployment's), its SLA and the serving modes
    its phases measure."""
    model_path, model = resolve_model(record.model_path, settings, ("study", "model_path"))
    space = record.tune_request.constrained_space
    space.with_base_dir(settings.default_space.parent)
    traffic = space.traffic
    c = space.constraints
    phases = set(space.phases)
    mode = "both" if "aggregated" in phases and {"prefill", "decode"} <= phases else \
        "agg" if "aggregated" in phases else "disagg"
    depths = [d for name, phase in space.phases.items() if name != "prefill" for d in phase.mtp]
    return AdviseRequest(
        model=model, weights=str(model_path), hardware=space.cluster.gpu, gpus=space.cluster.num_gpus,
        workload=Workload.model_validate({**traffic.model_dump(), "concurrency": (1,), "arrival": "closed",
                                          "request_rates": ()}),
        sla=Sla(max_ttft_ms=c.max_ttft_ms, max_itl_ms=c.max_itl_ms, min_tok_s_user=c.min_tok_s_per_user,
                percentile=c.percentile),
        serve=ServeOptions(mode=mode, max_mtp=min(max(depths, default=0), MAX_MTP_DEPTH)))  # type: ignore[arg-type]


_STUDY_ADVICE: dict[int, tuple[str, AdvicePublic | str]] = {}
_STUDY_ADVICE_LOCK = threading.Lock()


def study_advice(record: StudyRecord, settings: ApiSettings) -> AdvicePublic | str:
    """The advice for a study's traffic and SLA (the library's `advise`, as POST /v1/advice), or why there is none;
    computed once per study (what it asks never changes)."""
    with _STUDY_ADVICE_LOCK:
        cached = _STUDY_ADVICE.get(record.id)
    if cached is not None and cached[0] == record.campaign:
        return cached[1]
    try:
        advice = advise(study_request(record, settings))
        deployment = advice.operating_deployment
        answer: AdvicePublic | str = AdvicePublic.model_validate({
            **advice.as_json(), "reason": advice.reason, "setting": advice.setting, "commands": advice.commands,
            "operating_deployment": deployment.name if deployment is not None else None})
    except TopotuneError as exc:
        answer = exc.user_message()
    except FieldError as exc:
        answer = f"{'.'.join(str(p) for p in exc.loc)}: {exc.message}"
    with _STUDY_ADVICE_LOCK:
        _STUDY_ADVICE[record.id] = (record.campaign, answer)
    return answer
