"""Prometheus metrics in a registry per app (no process globals): studies by status, trials by state and outcome
(read from the database at scrape time, so they are right after a restart), and trial durations (this process)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from api.models import StudyRecord, StudyStatus
from tuner.study import trial_census

DURATION_BUCKETS_S = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)



class _DatabaseCollector(Collector):
    def __init__(self, sessions: sessionmaker[Session], storage_url: str) -> None:
        self.sessions = sessions
        self.storage_url = storage_url

    def collect(self) -> Iterator[GaugeMetricFamily]:
        studies = GaugeMetricFamily("topotune_studies", "study requests by status", labels=["status"])
        with self.sessions() as s:
            counts = dict(s.execute(select(StudyRecord.status, func.count()).group_by(StudyRecord.status)).all())
        for status in StudyStatus:
            studies.add_metric([status.value], counts.get(status, 0))
        yield studies
        yield GaugeMetricFamily("topotune_studies_running", "studies running now",
                                value=counts.get(StudyStatus.RUNNING, 0) + counts.get(StudyStatus.CANCELLING, 0))
        trials = GaugeMetricFamily("topotune_trials", "Optuna trials by state (every study in the database)",
                                   labels=["state"])
        outcomes = GaugeMetricFamily("topotune_trial_outcomes", "trials by topotune outcome (ok, oom, ...)",
                                     labels=["status"])
        census = trial_census(self.storage_url)
        for state, n in census.by_state.items():
            trials.add_metric([state], n)
        for outcome, n in census.by_outcome.items():
            outcomes.add_metric([outcome], n)
        yield trials
        yield outcomes


class ServiceMetrics:
    def __init__(self, sessions: sessionmaker[Session], storage_url: str) -> None:
        self.registry = CollectorRegistry()
        self.trial_duration_s = Histogram("topotune_trial_duration_seconds", "wall time of launched trials",
                                          labelnames=["phase", "outcome"], buckets=DURATION_BUCKETS_S,
                                          registry=self.registry)
        self.registry.register(_DatabaseCollector(sessions, storage_url))
