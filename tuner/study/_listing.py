"""What `topotune studies` and the API list: campaigns grouped from their phase studies."""

from __future__ import annotations

from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from tuner.study._naming import split_name
from tuner.study._storage import open_storage
from tuner.study._trial_record import CampaignMeta, read_trials


@dataclass(frozen=True)
class CampaignSummary:
    name: str
    model: str
    gpu: str
    phases: tuple[str, ...]
    launched: int
    budget: int
    running: int
    backend: str


def list_campaigns(storage_url: str) -> list[CampaignSummary]:
    storage = open_storage(storage_url)
    grouped: dict[str, list[optuna.study.StudySummary]] = {}
    for s in optuna.get_all_study_summaries(storage, include_best_trial=False):
        base, phase = split_name(s.study_name) if "@" in s.study_name else (s.study_name, None)
        if phase is not None:
            grouped.setdefault(base, []).append(s)
    out = []
    for base, summaries in sorted(grouped.items()):
        launched = running = budget = 0
        meta: CampaignMeta | None = None
        phases = []
        for s in summaries:
            meta = CampaignMeta.read(s.user_attrs) if CampaignMeta.is_written(s.user_attrs) else None
            phases.append(meta.phase if meta and meta.phase else s.study_name.rsplit("/", 1)[-1])
            budget += meta.trials if meta else 0
            study = optuna.load_study(study_name=s.study_name, storage=storage)
            for r in read_trials(study, (TrialState.COMPLETE, TrialState.RUNNING)):
                if r.is_launch:
                    launched += r.state == TrialState.COMPLETE
                    running += r.state == TrialState.RUNNING
        out.append(CampaignSummary(name=base, model=meta.model if meta else "?", gpu=meta.gpu if meta else "?",
                                   phases=tuple(sorted(phases, key=lambda p: p != "prefill")), launched=launched,
                                   budget=budget, running=running, backend=meta.backend if meta else "?"))
    return out
