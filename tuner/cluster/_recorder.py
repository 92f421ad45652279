"""Every finished trial of a study goes into its cluster's store: measured runs, and launches that crashed."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.backends import TrialRequest, TrialResult
from tuner.cluster._key import ClusterKey
from tuner.cluster._store import ClusterStore, StoredFailure, StoredRun
from tuner.trial_status import TrialStatus

#: Outcomes that are not the cluster's doing (screened by the tuner, or a verdict on the model's accuracy).
_NOT_RECORDED = frozenset({TrialStatus.INFEASIBLE, TrialStatus.ACCURACY, TrialStatus.UNSUPPORTED})


@dataclass(frozen=True)
class ClusterRecorder:
    store: ClusterStore
    key: ClusterKey
    model_name: str
    model_path: str

    def record(self, study: str, trial: int, request: TrialRequest, result: TrialResult) -> None:
        if len(request.deployment.groups) != 1:
            return  # a composed deployment's points are not one instance's: its phases were recorded already
        group = request.deployment.groups[0]
        if result.status.ok and result.points:
            self.store.record_run(self.key, StoredRun(
                model_name=self.model_name, model_path=self.model_path, role=group.role, topology=group.topology,
                workload=request.workload, points=tuple(result.points), study=study, trial=trial))
        elif result.status not in _NOT_RECORDED:
            self.store.record_failure(self.key, StoredFailure(
                model_name=self.model_name, topology=group.topology, status=result.status, reason=result.reason,
                study=study))
