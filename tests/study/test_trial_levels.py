"""One run is one trial: a trial's load levels are data of its one Optuna trial (tuner.study._trial_record.LoadLevel),
numbered consecutively, every level still on the fronts and exportable; studies stored the old way (each other
level an Optuna trial of kind "extra") read the same."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import optuna
import pytest
from _support.paths import REFERENCE_MODEL, REFERENCE_SPACE
from optuna.trial import TrialState

from tuner.backends import SimulatedBackend
from tuner.cli._logs import trial_artifacts_dir
from tuner.cli._tune import EXPORT_FLAGS
from tuner.errors import ConfigError, InfeasibleError
from tuner.executors import LocalExecutor
from tuner.export import campaign_operating_point, study_operating_point
from tuner.operating_point import at_running_requests, read_operating_point
from tuner.space import load_space
from tuner.study import Campaign, LiveCampaign, TrialRecord, TuneOptions, load_campaign, open_storage, trial_census
from tuner.study._guided import GuidedSampler
from tuner.study._prior import SimulatorPrior
from tuner.study._records import sampler_constraints
from tuner.study._trial_record import LoadLevel

TRIALS = 5


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A two-phase study on the simulated backend (every trial measures the space's whole concurrency ladder)."""
    tmp = tmp_path_factory.mktemp("levels")
    url = f"sqlite:///{tmp / 'new.db'}"
    campaign = Campaign(model_path=str(REFERENCE_MODEL), space=load_space(REFERENCE_SPACE), backend_name="simulated",
                        executor=LocalExecutor(SimulatedBackend(noise=0.05), max_parallel=2), storage_url=url,
                        options=TuneOptions(trials=TRIALS, sampler="random", seed=5), artifacts_dir=tmp / "a")
    campaign.run()
    return url, campaign.name


def _phase_studies(url: str, name: str) -> dict[str, optuna.Study]:
    storage = open_storage(url)
    return {phase: optuna.load_study(study_name=f"{name}/{phase}", storage=storage) for phase in ("prefill", "decode")}


def test_trial_numbers_are_consecutive_and_every_stored_trial_is_a_trial_tried(study: tuple[str, str]) -> None:
    url, name = study
    live = LiveCampaign(url, name)
    live.refresh()
    tried = 0
    for phase, s in _phase_studies(url, name).items():
        trials = s.get_trials(deepcopy=False)
        assert [t.number for t in trials] == list(range(len(trials))), phase  # #0, #1, #2, ... no gaps
        records = [TrialRecord.read(t) for t in trials]
        launched = [r for r in records if r.is_launch and r.state == TrialState.COMPLETE]
        assert len(launched) == TRIALS
        # every measured run keeps its whole ladder in its one trial, told one level of it
        for r in launched:
            assert r.attrs.load_levels is not None and len(r.attrs.load_levels) > 1
            told = r.attrs.load_levels[r.attrs.told_level or 0]
            assert r.values == told.values and r.attrs.load_level == told.label
        assert not any(r.is_level for r in records)
        tried += len(trials)
    # "trials stored" (what the page and the API print) == Optuna's rows == trials tried; the SQL census agrees
    assert live.trials_stored == tried == sum(trial_census(url).by_state.values())


def test_the_fronts_hold_levels_the_trial_was_not_told(study: tuple[str, str]) -> None:
    url, name = study
    result, _, _ = load_campaign(url, name)
    told = {(phase, TrialRecord.read(t).number): TrialRecord.read(t).attrs.load_level
            for phase, s in _phase_studies(url, name).items() for t in s.get_trials(deepcopy=False)}
    for phase, pr in result.phases.items():
        assert len(pr.points) > pr.launched  # every level of every trial is a point
        assert len({p.ref for p in pr.points}) == len(pr.points)  # a trial + its load names one point
        assert all(p.stored_as == p.trial for p in pr.points)
        untold = [p for p in pr.front if told[(phase, p.trial)] != p.level]
        assert untold, f"{phase}: every front point is a told level; the test needs a non-best one"


def test_export_and_plan_of_a_composed_point_at_a_level_its_trial_was_not_told(study: tuple[str, str],
                                                                               tmp_path: Path) -> None:
    url, name = study
    result, _, _ = load_campaign(url, name)
    decode = _phase_studies(url, name)["decode"]
    told = {t.number: TrialRecord.read(t).attrs.load_level for t in decode.get_trials(deepcopy=False)}
    found = [(i, p) for i, cp in enumerate(result.composed_front)
             for p in result.phases["decode"].points if p.metrics == cp.decode and told[p.trial] != p.level]
    assert found, "no composed point at a non-told decode level"
    row, level = found[0]
    op = study_operating_point(url, name, row)
    # the export deploys that level's operating point (--max-num-seqs at the requests it ran), not the told one's
    expected = at_running_requests(result.composed_front[row].deployment, level.metrics.running_requests)
    assert op.deployment == expected == result.exportable_deployments()[row]
    assert op.measured_on is not None and "not found" not in op.measured_on  # its stored point was found
    # and `plan --from` reads the exported point back unchanged
    path = tmp_path / "point.json"
    path.write_text(json.dumps(op.as_json()))
    assert read_operating_point(path) == op


# -- a study stored the old way: each other level an Optuna trial of kind "extra" ----------------------------------
def _write_old_layout(new: optuna.Study, old: optuna.Study) -> dict[int, int]:
    """Copy `new` into `old` as the writer before load_levels stored it: the trial told its level (attrs as then:
    `levels` the clients list), then each other level an added trial (kind "extra", parent_trial, load_level).
    Returns new trial number -> old number."""
    for key, value in new.user_attrs.items():
        old.set_user_attr(key, value)
    numbers: dict[int, int] = {}
    for t in new.get_trials(deepcopy=False):
        r = TrialRecord.read(t)
        attrs = {k: v for k, v in t.user_attrs.items() if k not in ("load_levels", "told_level")}
        levels = r.attrs.load_levels or ()
        if levels:
            attrs["levels"] = [lv.metrics.concurrency for lv in levels]
        numbers[t.number] = len(old.get_trials(deepcopy=False))
        old.add_trial(optuna.trial.create_trial(state=t.state, params=t.params, distributions=t.distributions,
                                                values=t.values, user_attrs=attrs, constraints=t.constraints))
        for i, lv in enumerate(levels):
            if i == r.attrs.told_level:
                continue
            extra = {"kind": "extra", "parent_trial": numbers[t.number], "topology": r.attrs.topology,
                     "constraints": lv.constraints, "concurrency": lv.metrics.concurrency, "load_level": lv.label,
                     "metrics": lv.metrics_json, "status": "ok", "deployment": t.user_attrs["deployment"],
                     "deployment_name": t.user_attrs["deployment_name"]}
            old.add_trial(optuna.trial.create_trial(params=t.params, distributions=t.distributions,
                                                    values=list(lv.values), user_attrs=extra,
                                                    constraints=sampler_constraints(lv.constraints)))
    return numbers


def test_a_study_stored_with_extra_level_trials_reads_as_before(study: tuple[str, str], tmp_path: Path) -> None:
    url, name = study
    old_url = f"sqlite:///{tmp_path / 'old.db'}"
    storage = open_storage(old_url)
    numbers = {}
    for phase, s in _phase_studies(url, name).items():
        old = optuna.create_study(study_name=s.study_name, storage=storage, directions=s.directions)
        numbers[phase] = _write_old_layout(s, old)
        assert any(TrialRecord.read(t).is_level for t in old.get_trials(deepcopy=False))
    new_result, _, _ = load_campaign(url, name)
    old_result, _, _ = load_campaign(old_url, name)
    for phase, pr in new_result.phases.items():
        was = old_result.phases[phase]
        assert was.counts == pr.counts and was.launched == pr.launched
        # the same points, each numbered by its trial's old number, with the same load, values and feasibility
        renumbered = {(numbers[phase][p.trial], p.level, p.values, p.feasible) for p in pr.points}
        assert {(p.trial, p.level, p.values, p.feasible) for p in was.points} == renumbered
        assert sorted(p.values for p in was.front) == sorted(p.values for p in pr.front)
        assert was.hypervolume_history == pr.hypervolume_history
    assert [(p.name, p.total_tok_s_per_gpu) for p in old_result.composed_front] == \
        [(p.name, p.total_tok_s_per_gpu) for p in new_result.composed_front]
    # the live view lists trials, each with its levels; its count is trials, not Optuna rows
    old_live, new_live = LiveCampaign(old_url, name), LiveCampaign(url, name)
    old_live.refresh()
    new_live.refresh()
    assert old_live.trials_stored == new_live.trials_stored
    assert [len(r.levels) for r in old_live.rows()] == [len(r.levels) for r in new_live.rows()]
    assert sum(trial_census(old_url).by_state.values()) == old_live.trials_stored  # extras are not counted
    # `topotune logs STUDY N` on an old extra level's number shows the logs of the run that measured it
    decode = optuna.load_study(study_name=f"{name}/decode", storage=storage)
    extra = next(TrialRecord.read(t) for t in decode.get_trials(deepcopy=False) if TrialRecord.read(t).is_level)
    assert trial_artifacts_dir(old_url, decode.study_name, extra.number) == \
        trial_artifacts_dir(old_url, decode.study_name, extra.trial) == \
        trial_artifacts_dir(url, decode.study_name, next(n for n, o in numbers["decode"].items() if o == extra.trial))


def test_the_guided_sampler_observes_the_same_levels_in_either_layout(study: tuple[str, str], tmp_path: Path) -> None:
    url, name = study
    new = _phase_studies(url, name)["decode"]
    old = optuna.create_study(study_name="old/decode", storage=f"sqlite:///{tmp_path / 'g.db'}",
                              directions=new.directions)
    _write_old_layout(new, old)
    from tuner.hardware import get_gpu
    from tuner.models import load_model

    space = load_space(REFERENCE_SPACE)
    prior = SimulatorPrior.build(space, "decode", load_model(REFERENCE_MODEL), get_gpu(space.cluster.gpu))
    sampler = GuidedSampler(lambda: prior)
    seen_new, seen_old = sampler._observe(new), sampler._observe(old)
    assert seen_new.points and sum(len(v) for v in seen_new.points.values()) > len(seen_new.points)
    assert {k: sorted(v) for k, v in seen_new.points.items()} == {k: sorted(v) for k, v in seen_old.points.items()}
    assert seen_new.taken == seen_old.taken


def test_a_load_level_round_trips_through_its_stored_json() -> None:
    from tuner.metrics import ServingMetrics

    m = ServingMetrics(concurrency=16, num_gpus=8, isl=1000, osl=100, total_tok_s=800.0, output_tok_s=80.0,
                       total_tok_s_per_gpu=100.0, output_tok_s_per_gpu=10.0, tok_s_per_user=20.0, ttft_ms_mean=50.0,
                       ttft_ms_p50=50.0, ttft_ms_p99=60.0, itl_ms_mean=5.0, itl_ms_p50=5.0, itl_ms_p99=6.0,
                       request_throughput_rps=1.0, max_concurrency=16)
    level = LoadLevel.of(m, (100.0, 20.0), {"ttft": -0.5, "itl": 0.1})
    back = LoadLevel.from_json(level.as_json())
    assert back.metrics == m and back.values == (100.0, 20.0) and back.label == "c16" and back.load == 16.0
    assert not back.feasible and LoadLevel.of(m, (1.0, 1.0), {"ttft": 0.0}).feasible


def test_an_old_studys_half_written_reverification_counts_nowhere_and_a_new_one_is_whole() -> None:
    """Old layout: a re-verification trial saying it has 3 levels with 1 of its 2 extras stored (a process killed
    between the writes) is dropped with that extra; a new one holds its levels and is never dropped."""
    from tuner.study import read_trials

    s = optuna.create_study(directions=["maximize", "maximize"])
    dist = {"tp": optuna.distributions.CategoricalDistribution([1, 2])}
    reverify = {"kind": "reverify", "reverify": {"levels": 3}, "status": "ok"}
    s.add_trial(optuna.trial.create_trial(params={"tp": 1}, distributions=dist, values=[1.0, 1.0],
                                          user_attrs=reverify))
    s.add_trial(optuna.trial.create_trial(params={"tp": 1}, distributions=dist, values=[2.0, 1.0],
                                          user_attrs={"kind": "extra", "parent_trial": 0}))
    level = {"metrics": {"concurrency": 1}, "values": [1.0, 1.0], "constraints": {"ttft": -1.0}}
    s.add_trial(optuna.trial.create_trial(params={"tp": 2}, distributions=dist, values=[1.0, 1.0], user_attrs={
        **reverify, "load_levels": [level, level, level], "told_level": 0}))
    assert [r.number for r in read_trials(s)] == [2]


def test_a_pd_study_without_a_composed_front_exports_no_lone_instance(study: tuple[str, str]) -> None:
    """A prefill + decode study whose fronts compose nothing (vLLM refuses every pair) has no deployment to export:
    `export STUDY --point 0` used to write the prefill front's first instance alone, as if it served requests."""
    url, name = study
    result, space, meta = load_campaign(url, name)
    refusal = InfeasibleError("no prefill topology pairs with a decode topology: vLLM refuses every pair",
                              field="topologies", fix="sweep prefill topologies with the decode topologies' TP")
    uncomposed = dataclasses.replace(result, composed=[], composed_front=[], composition_refusal=refusal)
    assert uncomposed.exportable_deployments() == []
    assert uncomposed.composition_error == refusal.user_message()  # what `show` prints: its one fix
    with pytest.raises(ConfigError) as err:
        campaign_operating_point(uncomposed, space, model_path=meta.model_path, model_name=meta.model, point=0,
                                 study=name, backend=meta.backend)
    assert err.value.field == "point" and "no composed PD front to export" in str(err.value)
    # one fix, rendered once: the refusal's own (to compose a front) or a phase's instances instead, as STUDY/PHASE
    shown = err.value.renamed(EXPORT_FLAGS).user_message()  # as `topotune export` shows it
    assert shown.startswith("--point: no composed PD front to export: no prefill topology pairs") and \
        shown.count("(fix: ") == 1, shown
    assert "(fix: sweep prefill topologies with the decode topologies' TP to compose one, or export one phase's " \
        f"instances instead: the STUDY {name}/decode or /prefill)" in shown
    # the refusal follows the one rule: a phase study (STUDY/PHASE) exports its front, whatever composed or not
    op = study_operating_point(url, f"{name}/decode", 0)
    assert len(op.deployment.groups) == 1  # one decode instance (group), not a PD deployment
