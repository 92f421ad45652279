"""What a cluster teaches across models: a calibration store in the study database, and what is learnt from it."""

from tuner.cluster._crosscheck import PartCheck, cross_check, pretrial_knowledge
from tuner.cluster._fit import KERNEL_DEPENDENCE, ROLE_FACTORS, FitSample, SharedFit, fit_shared, prediction_error
from tuner.cluster._guard import GUARD_TRIALS, GuardCheck, GuardVerdict, guard
from tuner.cluster._key import ClusterKey
from tuner.cluster._knowledge import (
    MAX_OFFSET,
    ClusterKnowledge,
    FactorEvidence,
    HeldOut,
    KernelFactor,
    KnownRisk,
    LayoutOffset,
    RiskMatch,
    learn,
    load_knowledge,
    planned_risks,
    risk_key,
)
from tuner.cluster._recorder import ClusterRecorder
from tuner.cluster._store import (
    DEFAULT_PREFIX,
    ClusterStore,
    StoredFailure,
    StoredRun,
    cluster_metadata,
    create_cluster_tables,
)

__all__ = [
    "DEFAULT_PREFIX",
    "GUARD_TRIALS",
    "KERNEL_DEPENDENCE",
    "MAX_OFFSET",
    "ROLE_FACTORS",
    "ClusterKey",
    "ClusterKnowledge",
    "ClusterRecorder",
    "ClusterStore",
    "FactorEvidence",
    "FitSample",
    "GuardCheck",
    "GuardVerdict",
    "HeldOut",
    "KernelFactor",
    "KnownRisk",
    "LayoutOffset",
    "PartCheck",
    "RiskMatch",
    "SharedFit",
    "StoredFailure",
    "StoredRun",
    "cluster_metadata",
    "create_cluster_tables",
    "cross_check",
    "fit_shared",
    "guard",
    "learn",
    "load_knowledge",
    "planned_risks",
    "prediction_error",
    "pretrial_knowledge",
    "risk_key",
]
