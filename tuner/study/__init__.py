"""Studies: the ask/tell driver over Optuna, per phase, and the campaign that composes the PD front."""

from tuner.study._campaign import Campaign, CampaignResult, PhaseResult, compose_front, load_campaign
from tuner.study._listing import CampaignSummary, list_campaigns
from tuner.study._live import LiveCampaign, TrialRow
from tuner.study._naming import campaign_name, study_name
from tuner.study._records import StoredPoint
from tuner.study._runner import PhaseRun, TrialEvent, TuneOptions
from tuner.study._samplers import SAMPLERS, make_sampler
from tuner.study._stop import StopReason, StopSignal, request_cancel
from tuner.study._storage import TrialCensus, open_storage, trial_census
from tuner.study._warm_start import predicted_front_params, predicted_points, topology_params

__all__ = [
    "SAMPLERS",
    "Campaign",
    "CampaignResult",
    "CampaignSummary",
    "LiveCampaign",
    "PhaseResult",
    "PhaseRun",
    "StopReason",
    "StopSignal",
    "StoredPoint",
    "TrialCensus",
    "TrialEvent",
    "TrialRow",
    "TuneOptions",
    "campaign_name",
    "compose_front",
    "list_campaigns",
    "load_campaign",
    "make_sampler",
    "open_storage",
    "predicted_front_params",
    "predicted_points",
    "request_cancel",
    "study_name",
    "topology_params",
    "trial_census",
]
