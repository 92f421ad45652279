"""Where trials run: one Executor base; LocalExecutor (threads) and RayExecutor (placement groups).

RayExecutor is imported on first use: importing ray costs about a second and `topotune memory` never needs it.
"""

from typing import TYPE_CHECKING, Any

from tuner.executors._base import Executor, TrialHandle
from tuner.executors._factory import make_executor
from tuner.executors._local import LocalExecutor

if TYPE_CHECKING:
    from tuner.executors._host import RUNNER_PID, BackendSpec
    from tuner.executors._ray import RayExecutor
    from tuner.executors._session import current_session, ensure_ray, forget_ray_session, shutdown_ray

__all__ = ["RUNNER_PID", "BackendSpec", "Executor", "LocalExecutor", "RayExecutor", "TrialHandle", "current_session",
           "ensure_ray", "forget_ray_session", "make_executor", "shutdown_ray"]

_LAZY = {"RayExecutor": "tuner.executors._ray", "BackendSpec": "tuner.executors._host",
         "RUNNER_PID": "tuner.executors._host", "shutdown_ray": "tuner.executors._session",
         "ensure_ray": "tuner.executors._session", "forget_ray_session": "tuner.executors._session",
         "current_session": "tuner.executors._session"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
