"""Where trials run: one Executor base; LocalExecutor (threads) and RayExecutor (placement groups)."""

from tuner.executors._base import Executor, TrialHandle
from tuner.executors._local import LocalExecutor

__all__ = ["Executor", "LocalExecutor", "TrialHandle"]
