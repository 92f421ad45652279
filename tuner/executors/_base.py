"""The plug-in point for where trials run: in this process (local) or on a Ray cluster."""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field

from tuner.backends import TrialRequest, TrialResult


@dataclass(eq=False)
class TrialHandle:
    """A submitted trial; `result` is set once it finished (the executor never raises for trial failures)."""

    request: TrialRequest
    result: TrialResult | None = None
    attempts: int = 1
    extra: dict = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.result is not None


class Executor(abc.ABC):
    """Runs TrialRequests on a Backend. Call order: submit ... wait ... (cancel) ... shutdown.

    Implementations must turn every failure of a trial (backend error, dead worker, timeout) into a
    TrialResult with a reason, and must never hand out more GPUs than the cluster has.
    """

    def check_placeable(self, request: TrialRequest) -> object:
        """Raise TopologyError when this cluster can never hold the request (checked before can_start)."""
        return None

    @abc.abstractmethod
    def can_start(self, request: TrialRequest) -> bool:
        """True when the cluster has room for this trial now."""

    def at_capacity(self) -> bool:
        """True when no trial can start before one finishes (its parallel limit is reached). The driver then waits
        before asking the sampler, so the next proposal sees the result that frees the slot."""
        return False

    @abc.abstractmethod
    def submit(self, request: TrialRequest) -> TrialHandle: ...

    @abc.abstractmethod
    def wait(self, handles: Sequence[TrialHandle], timeout_s: float) -> list[TrialHandle]:
        """Block up to timeout_s; return the handles that finished (their `result` set)."""

    @abc.abstractmethod
    def cancel(self, handle: TrialHandle) -> None: ...

    def shutdown(self) -> None:  # noqa: B027 - optional hook
        """Release workers and cluster resources."""
