"""The deployment question for the service: an AdviceCreate body as the library's AdviseRequest (paths confined,
the workload block resolved like a space's), and the library's errors as 422s naming the body's fields."""

from __future__ import annotations

from pydantic import ValidationError

from api.config import ApiSettings
from api.errors import FieldError
from api.paths import confine
from api.schemas import AdviceCreate, AdvicePublic
from api.service import resolve_model
from tuner.advise import Advice, AdviseRequest, ServeOptions, Sla, advise
from tuner.errors import TopotuneError
from tuner.space import WorkloadSpec
from tuner.workload import Workload, workload_error

# The library request's fields under AdviceCreate's names (a 422's loc and text).
ADVICE_FIELDS = {"model": "model_path", "serve.mode": "mode", "serve.max_mtp": "max_mtp", "hardware_file": "hardware"}


def advice_workload(block: dict[str, object] | None, settings: ApiSettings) -> Workload:
    """A space's workload block as the traffic (a trace only under an allowed root, read now); none: 8192/1024."""
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
            raise FieldError(("body", "workload", "trace"), f"no such trace file: {spec.trace}")
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
            model=model, weights=str(model_path), workload=advice_workload(body.workload, settings),
            hardware=body.hardware, gpus=body.gpus, request_rate=body.request_rate, arrival=body.arrival,
            sla=Sla(max_ttft_ms=body.sla.max_ttft_ms, max_itl_ms=body.sla.max_itl_ms,
                    min_tok_s_user=body.sla.min_tok_s_user, percentile=body.sla.percentile),
            serve=ServeOptions(mode=body.mode, max_mtp=body.max_mtp))
    except TopotuneError as exc:
        raise _field_error(exc) from None


def answer(body: AdviceCreate, settings: ApiSettings) -> tuple[Advice, AdvicePublic]:
    """The library's advice for the body, and its public shape. Raises FieldError (422) naming the field."""
    request = advice_request(body, settings)
    try:
        advice = advise(request)
        commands = advice.commands
    except TopotuneError as exc:
        raise _field_error(exc) from None
    deployment = advice.operating_deployment
    return advice, AdvicePublic.model_validate({
        **advice.as_json(), "reason": advice.reason, "setting": advice.setting, "commands": commands,
        "operating_deployment": deployment.name if deployment is not None else None})


def _field_error(exc: TopotuneError) -> FieldError:
    named = exc.renamed(ADVICE_FIELDS)
    loc = tuple((named.field or "body").replace(": ", ".").split("."))
    return FieldError(("body", *loc), named.user_message())
