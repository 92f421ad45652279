"""What every Backend and every Executor promises, as checks a test runs on the implementation under test (like
optuna.testing's storage and sampler suites): a new backend or executor is held to the same rules as the others.

A backend: declares its name and needs; `run` returns a TrialResult and never raises for a trial that failed on its
own terms; a measured result has one point per load level, in the workload's order, for the deployment's GPUs; a
result survives JSON (executors carry it between processes); cancel and close are harmless. An executor: every
submitted trial comes back with a result on its handle, whatever happened; waiting on nothing returns nothing;
cancelling a finished trial and shutting down twice are harmless.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tuner.backends import Backend, ExecutorNeeds, TrialRequest, TrialResult, TrialStatus
from tuner.executors import Executor, TrialHandle


class ConformanceError(AssertionError):
    """A backend or an executor broke one of the promises above (the message says which)."""


def _require(ok: bool, what: str) -> None:
    if not ok:
        raise ConformanceError(what)


def check_result(result: object, request: TrialRequest, who: str) -> TrialResult:
    """A TrialResult; measured: a point per level in the workload's order, each on the deployment's GPUs; failed:
    a reason and no points; the same after a JSON round trip."""
    _require(isinstance(result, TrialResult), f"{who} returned {type(result).__name__}, not a TrialResult")
    assert isinstance(result, TrialResult)
    if result.status.ok and result.points:
        levels = request.workload.levels
        _require(len(result.points) == len(levels), f"{who}: {len(result.points)} points for {len(levels)} levels")
        gpus = request.deployment.num_gpus
        _require(all(p.num_gpus == gpus for p in result.points), f"{who}: a point not on the deployment's {gpus} GPUs")
        _require(all(p.total_tok_s > 0 and p.ttft_ms_mean > 0 for p in result.points),
                 f"{who}: a measured point without throughput or latency")
        if not request.workload.open_loop:
            _require([p.concurrency for p in result.points] == list(request.workload.concurrency),
                     f"{who}: points not at the workload's concurrency levels, in order")
    elif not result.status.ok:
        _require(bool(result.reason), f"{who}: failed ({result.status.value}) without a reason")
        _require(not result.points, f"{who}: failed ({result.status.value}) but reports points")
    _require(TrialResult.model_validate_json(result.model_dump_json()) == result,
             f"{who}: the result does not survive JSON (executors carry it between processes)")
    return result


def check_backend(backend: Backend, request: TrialRequest, *, failing: TrialRequest | None = None,
                  expect: TrialStatus = TrialStatus.OK) -> TrialResult:
    """Run `request` (it must end with `expect`) and, when given, `failing` (a trial the backend must fail on its
    own terms: a failed status with its reason, no exception); then cancel an unknown trial and close."""
    who = type(backend).__name__
    _require(isinstance(getattr(backend, "name", None), str) and bool(backend.name), f"{who} has no name")
    _require(isinstance(backend.needs, ExecutorNeeds), f"{who}.needs is not an ExecutorNeeds")
    result = check_result(backend.run(request), request, who)
    _require(result.status is expect, f"{who}: {result.status.value} ({result.reason}), expected {expect.value}")
    if failing is not None:
        try:
            failed = backend.run(failing)
        except Exception as exc:  # the promise: a trial that fails returns its status, it never raises
            raise ConformanceError(f"{who} raised {type(exc).__name__} for a failing trial: {exc}") from exc
        check_result(failed, failing, who)
        _require(not failed.status.ok, f"{who}: the failing request succeeded")
    backend.cancel("no-such-trial")
    backend.close()
    return result


def check_executor(executor: Executor, requests: Sequence[TrialRequest], *, timeout_s: float = 600.0
                   ) -> list[TrialHandle]:
    """Submit every request as room allows and wait: each handle ends with a checked result for its own request;
    `wait([])` returns nothing; cancelling a finished trial and shutting down twice are harmless."""
    who = type(executor).__name__
    _require(executor.wait([], 0.0) == [], f"{who}: waiting on nothing returned something")
    pending = list(requests)
    handles: list[TrialHandle] = []
    deadline = time.monotonic() + timeout_s
    while pending or not all(h.done for h in handles):
        _require(time.monotonic() < deadline, f"{who}: trials still running after {timeout_s:g} s")
        while pending and executor.can_start(pending[0]):
            handles.append(executor.submit(pending.pop(0)))
        running = [h for h in handles if not h.done]
        if running:
            executor.wait(running, 1.0)
        elif pending:
            _require(executor.can_start(pending[0]), f"{who}: nothing runs, yet the next trial cannot start")
    for handle, request in zip(handles, requests, strict=True):
        _require(handle.request.trial_id == request.trial_id, f"{who}: a handle for another trial")
        check_result(handle.result, request, f"{who} ({request.trial_id})")
    if handles:
        kept = handles[0].result
        executor.cancel(handles[0])
        _require(handles[0].result == kept, f"{who}: cancelling a finished trial changed its result")
    executor.shutdown()
    executor.shutdown()
    return handles
