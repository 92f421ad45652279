"""LiveCampaign: folding trials in as they finish gives exactly what a full load gives, at every step."""

from __future__ import annotations

from pathlib import Path

from _support.paths import REFERENCE_MODEL, REFERENCE_SPACE

from tuner.backends import SimulatedBackend
from tuner.executors import LocalExecutor
from tuner.space import load_space
from tuner.study import Campaign, LiveCampaign, TrialEvent, TuneOptions, load_campaign

MODEL = REFERENCE_MODEL
SPACE = REFERENCE_SPACE


def _same(live: LiveCampaign, storage_url: str) -> None:
    full, _, _ = load_campaign(storage_url, live.name)
    assert live.result is not None
    assert list(live.result.phases) == list(full.phases)
    for phase, pr in full.phases.items():
        mine = live.result.phases[phase]
        assert mine.counts == pr.counts and mine.launched == pr.launched, phase
        assert [p.ref for p in mine.points] == [p.ref for p in pr.points]
        assert sorted(p.values for p in mine.front) == sorted(p.values for p in pr.front)
        assert mine.failures == pr.failures
    assert [(p.name, p.total_tok_s_per_gpu, p.tok_s_per_user) for p in live.result.composed_front] == \
        [(p.name, p.total_tok_s_per_gpu, p.tok_s_per_user) for p in full.composed_front]
    assert live.result.composition_error == full.composition_error
    assert live.trials_stored == sum(len(rows) for rows in [live.rows("prefill"), live.rows("decode")])
    for phase, pr in full.phases.items():  # a trial is a configuration: its load levels are listed under it
        rows = live.rows(phase)
        assert not any(r.record.is_level for r in rows)
        assert all(level.trial == r.record.number for r in rows for level in r.levels)
        measured = {r.record.number: len(r.levels) for r in rows if r.record.attrs.metrics is not None}
        assert sum(measured.values()) == len(pr.points) + len(pr.superseded)
        assert {p.trial for p in pr.points} <= set(measured)


def test_live_fold_matches_full_load_at_every_trial(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    space = load_space(SPACE)
    live: LiveCampaign | None = None
    checked = 0

    def on_event(e: TrialEvent) -> None:
        nonlocal live, checked
        if e.kind not in ("done", "failed"):
            return
        live = live or LiveCampaign(url, campaign.name)
        before = live.version
        assert live.refresh() and live.version == before + 1
        _same(live, url)
        checked += 1

    campaign = Campaign(model_path=str(MODEL), space=space, backend_name="simulated",
                        executor=LocalExecutor(SimulatedBackend(noise=0.05)), storage_url=url,
                        options=TuneOptions(trials=5, sampler="random", seed=3), artifacts_dir=tmp_path / "a",
                        on_event=on_event)
    campaign.run()
    assert live is not None and checked >= 8
    live.refresh()
    _same(live, url)
    assert live.result is not None and live.result.composed_front
    version = live.version
    assert not live.refresh() and live.version == version  # nothing new: nothing recomposed
    fresh = LiveCampaign(url, campaign.name)  # a cold reader (a restarted service) sees the same
    assert fresh.refresh()
    _same(fresh, url)
