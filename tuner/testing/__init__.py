"""A test kit shipped with the library (like optuna.testing): a probe backend, fault injection, a small campaign,
a multi-node Ray cluster on this machine, and the conformance checks every backend and executor passes
(check_backend, check_executor).

Public API only, and no repository paths: callers pass the model and space they want, so the kit works from an
installed package as well as from a checkout. Not user-facing; tests/ and benchmarks/ use it.
"""

from tuner.launch import alive_pids
from tuner.testing._campaign import small_campaign, study_counts
from tuner.testing._cluster import ray_test_cluster
from tuner.testing._conformance import ConformanceError, check_backend, check_executor, check_result
from tuner.testing._faults import KilledCampaign, KillReport, campaign_under_kills, kill_runners
from tuner.testing._probe import (
    CHILDREN,
    EVENTS,
    ProbeBackend,
    peak_gpus,
    probe_spec,
    read_events,
    spawned_children,
)

__all__ = [
    "CHILDREN",
    "EVENTS",
    "ConformanceError",
    "KillReport",
    "KilledCampaign",
    "ProbeBackend",
    "alive_pids",
    "campaign_under_kills",
    "check_backend",
    "check_executor",
    "check_result",
    "kill_runners",
    "peak_gpus",
    "probe_spec",
    "ray_test_cluster",
    "read_events",
    "small_campaign",
    "spawned_children",
    "study_counts",
]
