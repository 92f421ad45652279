"""The typed trial record: what it writes is what old studies hold, and it reads back what it wrote."""

from __future__ import annotations

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
