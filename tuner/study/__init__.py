"""Studies: the ask/tell driver over Optuna, per phase, and the campaign that composes the PD front."""

from tuner.study._campaign import Campaign, CampaignResult, FrontRow, PhaseResult, compose_front, load_campaign
from tuner.study._listing import CampaignSummary, list_campaigns
from tuner.study._live import LiveCampaign, TrialRow
from tuner.study._naming import campaign_name, study_name
from tuner.study._objectives import PHASE_AXES, PHASE_METRICS, phase_values
from tuner.study._records import StoredPoint
from tuner.study._runner import PhaseRun, TrialEvent, TuneOptions
from tuner.study._samplers import SAMPLERS, make_sampler
from tuner.study._stop import StopReason, StopSignal, request_cancel
from tuner.study._storage import TrialCensus, close_storage, open_storage, trial_census
from tuner.study._transfer import StudyTransfer, cluster_notes, open_transfer
from tuner.study._trial_record import (
    CampaignMeta,
    EventKind,
    Outcome,
    StudyFlag,
    TrialAttrs,
    TrialFailure,
    TrialKind,
    TrialOutcome,
    TrialRecord,
    read_trials,
)
from tuner.study._warm_start import predicted_front_params, predicted_points

__all__ = [
    "PHASE_AXES",
    "PHASE_METRICS",
    "SAMPLERS",
    "Campaign",
    "CampaignMeta",
    "CampaignResult",
    "CampaignSummary",
    "EventKind",
    "FrontRow",
    "LiveCampaign",
    "Outcome",
    "PhaseResult",
    "PhaseRun",
    "StopReason",
    "StopSignal",
    "StoredPoint",
    "StudyFlag",
    "StudyTransfer",
    "TrialAttrs",
    "TrialCensus",
    "TrialEvent",
    "TrialFailure",
    "TrialKind",
    "TrialOutcome",
    "TrialRecord",
    "TrialRow",
    "TuneOptions",
    "campaign_name",
    "close_storage",
    "cluster_notes",
    "compose_front",
    "list_campaigns",
    "load_campaign",
    "make_sampler",
    "open_storage",
    "open_transfer",
    "phase_values",
    "predicted_front_params",
    "predicted_points",
    "read_trials",
    "request_cancel",
    "study_name",
    "trial_census",
]
