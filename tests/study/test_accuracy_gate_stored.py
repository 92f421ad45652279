"""The accuracy gate's score, interval and sample size are stored with the trial, and a score under the bar whose
interval still reaches it (sampling noise) leaves the trial feasible."""

from __future__ import annotations

from pathlib import Path

import optuna
from _support.paths import REFERENCE_MODEL, REFERENCE_SPACE

from tuner.backends import AccuracyGate, Backend, SimulatedBackend, TrialRequest, TrialResult
from tuner.backends.vllm._accuracy import wilson_interval
from tuner.executors import LocalExecutor
from tuner.space import load_space
from tuner.study import Campaign, TuneOptions, open_storage

MODEL = REFERENCE_MODEL
SPACE = REFERENCE_SPACE


class NoisyGateBackend(Backend):
    """The simulator's points plus a gate that scored 186/200 = 0.93 against a 0.95 bar (interval reaches it)."""

    name = "noisy-gate"

    def __init__(self) -> None:
        self.inner = SimulatedBackend()

    def run(self, request: TrialRequest) -> TrialResult:
        result = self.inner.run(request)
        low, high = wilson_interval(186, 200)
        assert request.min_accuracy is not None
        gate = AccuracyGate(score=0.93, correct=186, sample_size=200, ci_low=low, ci_high=high, confidence=0.95,
                            min_accuracy=request.min_accuracy, passed=high >= request.min_accuracy)
        return result.model_copy(update={"accuracy": gate.score, "accuracy_gate": gate})


def test_gate_is_stored_and_its_interval_decides_feasibility(tmp_path: Path) -> None:
    space = load_space(SPACE)
    assert space.constraints.min_accuracy == 0.95
    storage_url = f"sqlite:///{tmp_path / 's.db'}"
    campaign = Campaign(model_path=str(MODEL), space=space, backend_name="simulated",
                        executor=LocalExecutor(NoisyGateBackend()), storage_url=storage_url,
                        options=TuneOptions(trials=2, sampler="random"), artifacts_dir=tmp_path, phases=("decode",))
    result = campaign.run()
    study = optuna.load_study(study_name=result.phases["decode"].study_name, storage=open_storage(storage_url))
    sampled = [t for t in study.trials if t.user_attrs.get("kind") == "sampled" and "accuracy_gate" in t.user_attrs]
    assert sampled
    for t in sampled:
        gate = t.user_attrs["accuracy_gate"]
        assert gate["sample_size"] == 200 and gate["score"] == 0.93 and gate["passed"]
        assert gate["ci_low"] < 0.93 < 0.95 < gate["ci_high"]
        assert t.user_attrs["accuracy"] == 0.93
        assert t.user_attrs["constraints"]["accuracy"] < 0  # feasible on accuracy: the bar is inside the interval
