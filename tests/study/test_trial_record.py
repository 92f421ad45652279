"""The typed trial record: what it writes is what old studies hold, and it reads back what it wrote."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from tuner.backends import TrialStatus
from tuner.study import CampaignMeta, TrialAttrs, TrialKind, TrialOutcome, TrialRecord
from tuner.study._trial_record import parse_outcome


def _study() -> optuna.Study:
    return optuna.create_study(directions=["maximize", "maximize"])


def test_stored_keys_are_the_historical_ones() -> None:
    """Studies written before the record existed must read back: same keys, enums stored as plain strings."""
    attrs = TrialAttrs(kind=TrialKind.SAMPLED, outcome=TrialStatus.KV_TOO_SMALL, reason="too long",
                       constraint_detail={"memory": 1.0}, retry_of=3).user_attrs()
    assert attrs == {"kind": "sampled", "status": "kv_too_small", "reason": "too long",
                     "constraints": {"memory": 1.0}, "retry_of": 3}
    assert all(type(v) is not TrialKind and type(v) is not TrialStatus for v in attrs.values())


def test_write_then_read_round_trip() -> None:
    study = _study()
    trial = study.ask({"tp": optuna.distributions.CategoricalDistribution([1, 2])})
    TrialAttrs(kind=TrialKind.SAMPLED, driver="h:1", heartbeat_at=12.5, artifacts_dir="/tmp/x").write(trial)
    TrialAttrs(outcome=TrialOutcome.CANCELLED, reason="study cancelled").write(trial)
    study.tell(trial, state=TrialState.FAIL)
    [record] = [TrialRecord.read(t) for t in study.get_trials()]
    assert record.kind is TrialKind.SAMPLED and record.is_launch
    assert record.attrs.outcome is TrialOutcome.CANCELLED and record.status == "cancelled"
    assert record.attrs.driver == "h:1" and record.last_beat() == 12.5 and record.attrs.artifacts_dir == "/tmp/x"
    assert not record.feasible


def test_status_without_an_outcome_is_running_or_the_optuna_state() -> None:
    study = _study()
    running = study.ask()
    assert TrialRecord.read(study.get_trials()[0]).status == "running"
    study.tell(running, [1.0, 2.0])
    assert TrialRecord.read(study.get_trials()[0]).status == "complete"


def test_every_backend_status_is_an_outcome() -> None:
    for status in TrialStatus:
        assert parse_outcome(status.value) is status
    assert parse_outcome("reclaimed") is TrialOutcome.RECLAIMED
    with pytest.raises(ValueError):
        parse_outcome("no-such-outcome")


def test_campaign_meta_round_trip_and_missing() -> None:
    study = _study()
    with pytest.raises(KeyError):
        CampaignMeta.read(study.user_attrs)
    meta = CampaignMeta.new(phase="decode", model="m", model_path="/m", gpu="gb300", space={"name": "s"},
                            backend="simulated", sampler="tpe", seed=1, trials=4)
    meta.write(study)
    assert CampaignMeta.read(study.user_attrs) == meta
    assert study.user_attrs["topotune"]["model_path"] == "/m"


def test_an_asked_trial_of_a_dead_driver_is_reclaimed_and_asked_again(tmp_path: Path) -> None:
    """The driver claims a trial right after ask; a driver killed before it screened or launched it leaves a
    RUNNING trial that the next driver fails as reclaimed and enqueues again (its params are not lost)."""
    import socket
    import subprocess
    import sys

    from _support.paths import REFERENCE_MODEL, REFERENCE_SPACE

    from tuner.backends import SimulatedBackend
    from tuner.executors import LocalExecutor
    from tuner.space import load_space
    from tuner.study import Campaign, PhaseRun, TrialKind, TuneOptions, open_storage
    from tuner.study._trial_record import TrialOutcome

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    c = Campaign(model_path=str(REFERENCE_MODEL), space=load_space(REFERENCE_SPACE), backend_name="simulated",
                 executor=LocalExecutor(SimulatedBackend()),
                 storage_url=f"sqlite:///{tmp_path / 's.db'}", options=TuneOptions(trials=2),
                 artifacts_dir=tmp_path / "a")
    run = PhaseRun(phase="decode", space=c.space, model=c.model, model_path=str(REFERENCE_MODEL), gpu=c.gpu,
                   storage=open_storage(c.storage_url), study_name=c.phase_study_name("decode"),
                   backend_name="simulated", executor=c.executor, options=c.options, artifacts_dir=c.artifacts_dir)
    study = run.open_study()
    asked = study.ask(run.distributions())
    TrialAttrs(driver=f"{socket.gethostname()}:{dead.pid}", heartbeat_at=1.0).write(asked)  # claimed, no kind yet
    assert run.reclaim_stale(study) == 1
    records = [TrialRecord.read(t) for t in study.get_trials()]
    assert records[0].state == TrialState.FAIL and records[0].attrs.outcome is TrialOutcome.RECLAIMED
    assert records[0].kind is None and records[0].kind is not TrialKind.SAMPLED
    assert [t.state for t in study.get_trials()] == [TrialState.FAIL, TrialState.WAITING]
    again = study.ask(run.distributions())  # the next ask takes the enqueued config first
    assert again.params == asked.params and study.get_trials()[-1].user_attrs == {"retry_of": asked.number}


def test_an_unclaimed_trial_of_a_driver_killed_inside_ask_is_reclaimed(tmp_path: Path) -> None:
    """A driver killed between `study.ask` and its claim leaves a RUNNING trial with no driver (and maybe only
    some params): the next driver fails it as reclaimed without re-enqueueing the partial params; an unclaimed
    trial asked after that driver started (another live driver inside its ask) is left alone."""
    from _support.paths import REFERENCE_MODEL, REFERENCE_SPACE

    from tuner.backends import SimulatedBackend
    from tuner.executors import LocalExecutor
    from tuner.space import load_space
    from tuner.study import Campaign, PhaseRun, TuneOptions, open_storage

    c = Campaign(model_path=str(REFERENCE_MODEL), space=load_space(REFERENCE_SPACE), backend_name="simulated",
                 executor=LocalExecutor(SimulatedBackend()),
                 storage_url=f"sqlite:///{tmp_path / 's.db'}", options=TuneOptions(trials=2),
                 artifacts_dir=tmp_path / "a")

    def phase_run() -> PhaseRun:
        return PhaseRun(phase="decode", space=c.space, model=c.model, model_path=str(REFERENCE_MODEL), gpu=c.gpu,
                        storage=open_storage(c.storage_url), study_name=c.phase_study_name("decode"),
                        backend_name="simulated", executor=c.executor, options=c.options,
                        artifacts_dir=c.artifacts_dir)

    killed = phase_run()
    study = killed.open_study()
    first = next(iter(killed.distributions().items()))
    study.ask(dict([first]))  # the killed driver's ask: one param set, never claimed
    resumed = phase_run()
    inside_ask = study.ask(dict([first]))  # a live driver's ask, after the resumed driver started
    assert resumed.reclaim_stale(study) == 1
    states = [t.state for t in study.get_trials()]
    assert states == [TrialState.FAIL, TrialState.RUNNING]  # nothing enqueued from the partial params
    orphan = TrialRecord.read(study.get_trials()[0])
    assert orphan.attrs.outcome is TrialOutcome.RECLAIMED and "unclaimed" in (orphan.attrs.reason or "")
    assert study.get_trials()[1].number == inside_ask.number
