"""Trials in threads of this process: the simplest executor, used by tests and `--executor local`."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

from tuner.backends import Backend, TrialRequest, TrialResult, TrialStatus
from tuner.errors import TopologyError
from tuner.executors._base import Executor, TrialHandle
from tuner.trial_logs import TRIAL_LOG


def _log_line(request: TrialRequest, line: str) -> None:
    """The runner's lines in the trial's trial.log, as the Ray executor writes them (threads share stdout, so the
    backend's own output is not captured here; the vLLM backend logs its processes into the same folder)."""
    if not request.artifacts_dir:
        return
    folder = Path(request.artifacts_dir)
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / TRIAL_LOG).open("a") as fh:
            fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")


class LocalExecutor(Executor):
    def __init__(self, backend: Backend, *, max_parallel: int = 1, num_gpus: int | None = None) -> None:
        self._backend = backend
        self._pool = cf.ThreadPoolExecutor(max_workers=max_parallel, thread_name_prefix="trial")
        self._max_parallel = max_parallel
        self._num_gpus = num_gpus
        self._futures: dict[TrialHandle, cf.Future] = {}

    def _gpus_in_use(self) -> int:
        return sum(h.request.deployment.num_gpus for h in self._futures)

    def check_placeable(self, request: TrialRequest) -> None:
        if self._num_gpus is not None and request.deployment.num_gpus > self._num_gpus:
            raise TopologyError(f"{request.deployment.name} needs {request.deployment.num_gpus} GPUs but the cluster "
                                f"has {self._num_gpus}", field="topology", fix="use a smaller topology")

    def at_capacity(self) -> bool:
        return len(self._futures) >= self._max_parallel

    def can_start(self, request: TrialRequest) -> bool:
        if len(self._futures) >= self._max_parallel:
            return False
        return self._num_gpus is None or self._gpus_in_use() + request.deployment.num_gpus <= self._num_gpus

    def _run(self, request: TrialRequest) -> TrialResult:
        _log_line(request, f"[topotune] trial {request.trial_id} started in thread {threading.current_thread().name}"
                           f" ({request.deployment.name})")
        try:
            result = self._backend.run(request)
        except Exception as exc:  # a backend bug must not kill the study: store it as a crash
            result = TrialResult.failed(TrialStatus.CRASHED, f"{type(exc).__name__}: {exc}\n"
                                        + "".join(traceback.format_exc(limit=3)))
        _log_line(request, f"[topotune] trial {request.trial_id} ended: {result.status.value} {result.reason[:200]}")
        return result

    def submit(self, request: TrialRequest) -> TrialHandle:
        handle = TrialHandle(request)
        self._futures[handle] = self._pool.submit(self._run, request)
        return handle

    def wait(self, handles: Sequence[TrialHandle], timeout_s: float) -> list[TrialHandle]:
        futures = {self._futures[h]: h for h in handles if h in self._futures}
        done, _ = cf.wait(futures, timeout=timeout_s, return_when=cf.FIRST_COMPLETED)
        finished = []
        for fut in done:
            handle = futures[fut]
            handle.result = fut.result()
            del self._futures[handle]
            finished.append(handle)
        return finished

    def cancel(self, handle: TrialHandle) -> None:
        fut = self._futures.pop(handle, None)
        if fut is None:  # finished: its result stands (as on Ray)
            handle.result = handle.result or TrialResult.failed(TrialStatus.CRASHED, "cancelled")
            return
        if not fut.cancel():  # already running: the backend stops its processes
            self._backend.cancel(handle.request.trial_id)
        handle.result = TrialResult.failed(TrialStatus.CRASHED, "cancelled")

    def shutdown(self) -> None:
        self._backend.close()  # first: a running trial's processes stop, so its thread returns
        self._pool.shutdown(wait=True, cancel_futures=True)
