"""Known risks (layout+flags that crashed on this cluster for another model) are honoured by every sampler: the
warm start never enqueues one, the screen every proposal passes tells one infeasible with the failure seen and
repairs it with a config that is not a risk, and a budget beyond the space ends once every other config is measured;
`retry_risks` launches them again."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from _support.known_risks import CRASH, fitting_configs, record_crash
from _support.paths import MODELS

from tuner.backends import Backend, SimulatedBackend, TrialRequest, TrialResult
from tuner.cluster import ClusterKey, ClusterStore, risk_key
from tuner.executors import LocalExecutor
from tuner.hardware import get_gpu
from tuner.space import parse_space
from tuner.study import Campaign, TuneOptions
from tuner.trial_status import TrialStatus

MODEL = MODELS / "qwen3-235b-a22b"
SPACE = """
name: risky-cluster
cluster: {gpu: gb300, num_gpus: 16, gpus_per_host: 4}
workload: {isl: 1024, osl: 256}
phases:
  decode:
    tp: [1, 2, 4]
    dp: [1, 2, 4]
    ep: [false, true]
    max_num_seqs: [64, 256]
    concurrency: [8, 64]
"""


class RecordingBackend(Backend):
    name = "recording"

    def __init__(self) -> None:
        self.inner = SimulatedBackend(noise=0.0)
        self.requests: list[TrialRequest] = []

    def run(self, request: TrialRequest) -> TrialResult:
        self.requests.append(request)
        return self.inner.run(request)


def _fitting() -> list:
    return fitting_configs(SPACE, MODEL)


def _record_risks(storage_url: str) -> set[tuple]:
    """Every other fitting config crashed on this cluster for another model (an OOM there would not transfer)."""
    store = ClusterStore(storage_url)
    key = ClusterKey.of(get_gpu("gb300"))
    risky = _fitting()[::2]
    for topo in risky:
        record_crash(store, key, topo, "other-model")
    record_crash(store, key, _fitting()[1], "other-model", reason="CUDA out of memory", status=TrialStatus.OOM)
    return {risk_key(t) for t in risky}


def _run(storage_url: str, tmp_path: Path, sampler: str, *, trials: int,
         retry_risks: bool = False) -> tuple[RecordingBackend, optuna.Study]:
    backend = RecordingBackend()
    campaign = Campaign(model_path=str(MODEL), space=parse_space(SPACE), backend_name="simulated",
                        executor=LocalExecutor(backend), storage_url=storage_url,
                        options=TuneOptions(trials=trials, sampler=sampler, seed=2),
                        artifacts_dir=tmp_path / "artifacts", phases=("decode",),
                        name=f"risks-{sampler}@gb300/1024x256", retry_risks=retry_risks)
    result = campaign.run()
    return backend, optuna.load_study(study_name=result.phases["decode"].study_name, storage=storage_url)


@pytest.mark.parametrize("sampler", ["random", "tpe", "nsga2", "gp", "guided"])
def test_no_sampler_launches_a_known_risk(storage_url: str, tmp_path: Path, sampler: str) -> None:
    risky = _record_risks(storage_url)
    runnable = len(_fitting()) - len(risky)
    backend, study = _run(storage_url, tmp_path, sampler, trials=runnable + 4)  # a budget beyond what may run
    launched = [risk_key(r.deployment.groups[0].topology) for r in backend.requests]
    assert launched and not set(launched) & risky
    # every config that is not a risk was measured once, then the phase ended (it did not spin on risky asks)
    assert len(set(launched)) == len(launched) == runnable
    warm = [t for t in study.trials if t.user_attrs.get("warm_start")]
    space = parse_space(SPACE)
    assert all(risk_key(space.topology("decode", t.params)) not in risky for t in warm)
    screened = [t for t in study.trials if "known risk on this cluster" in (t.user_attrs.get("reason") or "")]
    for t in screened:  # told infeasible with the failure seen and the model it was seen on, then repaired
        assert t.user_attrs["kind"] == "screened" and t.constraints["feasibility"] > 0
        assert "crashed for other-model" in t.user_attrs["reason"] and CRASH[:40] in t.user_attrs["reason"]
        assert "--retry-risks" in t.user_attrs["reason"]
        assert risk_key(space.topology("decode", t.params)) in risky
    if sampler in ("random", "tpe", "nsga2", "gp"):  # they know nothing of the cluster: the screen caught them
        assert screened, "the sampler never proposed a known risk (the test proves nothing)"
        repaired = {t.user_attrs.get("repaired_from") for t in study.trials}
        assert {t.number for t in screened} <= repaired


def test_retry_risks_launches_them_again(storage_url: str, tmp_path: Path) -> None:
    risky = _record_risks(storage_url)
    backend, study = _run(storage_url, tmp_path, "random", trials=len(_fitting()), retry_risks=True)
    launched = {risk_key(r.deployment.groups[0].topology) for r in backend.requests}
    assert launched & risky and len(launched) == len(_fitting())
    assert not [t for t in study.trials if "known risk" in (t.user_attrs.get("reason") or "")]
