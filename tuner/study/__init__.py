"""Studies: the ask/tell driver over Optuna, per phase, and the campaign that composes the PD front.

The names other packages, the service and the tests use; everything else stays in the private modules."""

from tuner.study._campaign import Campaign, CampaignResult, PhaseResult, load_campaign
from tuner.study._events import TrialEvent
from tuner.study._listing import list_campaigns
from tuner.study._live import LiveCampaign, TrialRow
from tuner.study._naming import campaign_name
from tuner.study._noise_test import NoiseTest, Verdict
from tuner.study._objectives import PHASE_AXES, PHASE_METRICS, phase_values
from tuner.study._options import TuneOptions
from tuner.study._records import PointRef, StoredPoint
from tuner.study._reverify import (
    ReverifyOptions,
    ReverifyReport,
    ReverifyRow,
    ReverifyState,
    current_versions,
    recipe_versions,
    reverify_state,
    reverify_study,
    stored_reports,
    study_space,
)
from tuner.study._runner import PhaseRun
from tuner.study._samplers import SAMPLERS, make_sampler
from tuner.study._stop import StopReason, StopSignal, request_cancel
from tuner.study._storage import close_storage, open_storage, trial_census
from tuner.study._transfer import StudyTransfer, cluster_notes
from tuner.study._trial_record import (
    CampaignMeta,
    TrialAttrs,
    TrialKind,
    TrialOutcome,
    TrialRecord,
    read_trials,
)
from tuner.study._versions import VersionTag, version_fronts
from tuner.study._warm_start import predicted_front_params

__all__ = [
    "PHASE_AXES",
    "PHASE_METRICS",
    "SAMPLERS",
    "Campaign",
    "CampaignMeta",
    "CampaignResult",
    "LiveCampaign",
    "NoiseTest",
    "PhaseResult",
    "PhaseRun",
    "PointRef",
    "ReverifyOptions",
    "ReverifyReport",
    "ReverifyRow",
    "ReverifyState",
    "StopReason",
    "StopSignal",
    "StoredPoint",
    "StudyTransfer",
    "TrialAttrs",
    "TrialEvent",
    "TrialKind",
    "TrialOutcome",
    "TrialRecord",
    "TrialRow",
    "TuneOptions",
    "Verdict",
    "VersionTag",
    "campaign_name",
    "close_storage",
    "cluster_notes",
    "current_versions",
    "list_campaigns",
    "load_campaign",
    "make_sampler",
    "open_storage",
    "phase_values",
    "predicted_front_params",
    "read_trials",
    "recipe_versions",
    "request_cancel",
    "reverify_state",
    "reverify_study",
    "stored_reports",
    "study_space",
    "trial_census",
    "version_fronts",
]
