"""The replay for the service: a ReplayCreate body as the library's ReplayRequest (paths confined, the workload
resolved as /v1/advice resolves it), and the library's errors as 422s naming the body's fields."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from api.advice import advice_workload
from api.config import ApiSettings
from api.errors import FieldError
from api.schemas import MAX_SERVICE_REPLAY_REQUESTS, ReplayCreate
from api.service import resolve_model
from tuner.errors import TopotuneError
from tuner.replay import ReplayRequest, replay_stream
from tuner.topology import KNOBS

# The library request's fields under ReplayCreate's names (a 422's loc and text): a knob as its errors name it
# (`max-num-seqs`) is the body's `knobs.max_num_seqs`.
REPLAY_FIELDS = {"model": "model_path", "hardware_file": "hardware", "topology": "deployment",
                 **{name.replace("_", "-"): f"knobs.{name}" for name in KNOBS}}


def replay_answer(body: ReplayCreate, settings: ApiSettings) -> dict[str, Any]:
    """What `topotune replay --json` prints for the same inputs. Raises FieldError (422) naming the field."""
    _, model = resolve_model(body.model_path, settings, ("body", "model_path"))
    workload = advice_workload(body.workload, settings, body.trace_jsonl)
    try:
        request = ReplayRequest(
            model=model, workload=workload, deployment=body.deployment, hardware=body.hardware,
            calibration=body.calibration, knobs=body.knobs, request_rate=body.request_rate,
            concurrency=body.concurrency, arrival=body.arrival, burstiness_cv=body.burstiness_cv, router=body.router,
            turns=body.turns, think_ms=body.think_ms,
            # a trace replays its first N: at most the service's bound (a distribution: the library's 1,000)
            num_requests=body.num_requests or (MAX_SERVICE_REPLAY_REQUESTS if workload.trace is not None else None),
            warmup_share=body.warmup_share, max_ttft_ms=body.max_ttft_ms, max_itl_ms=body.max_itl_ms,
            long_prefill_token_threshold=body.long_prefill_token_threshold, max_horizon_s=body.max_horizon_s,
            seed=body.seed)
        return replay_stream(request).as_json()
    except TopotuneError as exc:
        raise FieldError.in_body(exc, REPLAY_FIELDS, unnamed="deployment") from None
    finally:
        if body.trace_jsonl is not None and workload.trace is not None:
            Path(workload.trace.path).unlink(missing_ok=True)  # the uploaded trace's private copy
