"""Trial backends: one base class, one result schema, implementations in their own modules."""

from tuner.backends._base import Backend, HostAssignment, TrialRequest, TrialResult, TrialStatus

__all__ = ["Backend", "HostAssignment", "TrialRequest", "TrialResult", "TrialStatus"]
