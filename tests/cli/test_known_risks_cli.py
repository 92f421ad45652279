"""Known risks on the command line: `tune` skips the configs that crashed on this cluster for another model (and
says so before the first trial) unless `--retry-risks`; `plan --storage` warns when a planned instance repeats one,
naming the failure and the model it was seen on."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from _support.known_risks import CRASH, fitting_configs, record_crash
from _support.paths import MODELS

from tuner.cli import main
from tuner.cluster import ClusterKey, ClusterStore, risk_key
from tuner.deployment import parse_deployment
from tuner.hardware import get_gpu
from tuner.space import parse_space
from tuner.topology import Topology

MODEL = MODELS / "qwen3-235b-a22b"
SPACE = """
name: risky-cluster
cluster: {gpu: gb300, num_gpus: 8, gpus_per_host: 4}
workload: {isl: 1024, osl: 256}
phases:
  decode:
    tp: [1, 2, 4]
    dp: [1, 2]
    ep: [false, true]
    max_num_seqs: [64]
    concurrency: [8, 64]
"""
GPU = get_gpu("gb300")


def _crash(store: ClusterStore, key: ClusterKey, topo: Topology, model: str = "minimax-m2") -> None:
    record_crash(store, key, topo, model)


def _fitting() -> list[Topology]:
    return fitting_configs(SPACE, MODEL)


def _launched(storage: str) -> set[tuple]:
    space = parse_space(SPACE)
    (name,) = [s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)]
    trials = optuna.load_study(study_name=name, storage=storage).trials
    return {risk_key(space.topology("decode", t.params)) for t in trials if t.user_attrs.get("kind") == "sampled"}


@pytest.mark.parametrize("retry", [False, True])
def test_tune_skips_known_risks_unless_retry_risks(tmp_path: Path, retry: bool,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    fitting = _fitting()
    risky = fitting[1:]  # all but one config crashed here for another model
    store = ClusterStore(storage)
    for topo in risky:
        _crash(store, ClusterKey.of(GPU), topo)
    args = ["tune", str(MODEL), "--space", str(space), "--trials", str(len(fitting)), "--sampler", "tpe",
            "--executor", "local", "--storage", storage, "--phase", "decode"]
    assert main([*args, *(["--retry-risks"] if retry else [])]) == 0
    out = capsys.readouterr().out
    action = "retried (--retry-risks)" if retry else "skipped (--retry-risks to retry)"
    notes = [line for line in out.splitlines() if "known risk on this cluster: crashed for minimax-m2" in line]
    assert len(notes) == len(risky) and all(line.endswith(action) for line in notes)
    launched = _launched(storage)
    if retry:
        assert launched == {risk_key(t) for t in fitting}  # the budget covers the space: every config ran
    else:
        assert launched == {risk_key(fitting[0])}  # the one config that is not a risk, and nothing else


def test_plan_warns_when_a_planned_instance_is_a_known_risk(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    deployment = "1P:TP4DP2+EP,1D:TEP8"
    prefill, decode = (g.topology for g in parse_deployment(deployment).groups_in_launch_order)
    store = ClusterStore(storage)
    _crash(store, ClusterKey.of(GPU, "0.26.1"), decode)  # on the planned version
    _crash(store, ClusterKey.of(GPU, "0.26.1"), decode.model_copy(update={"max_num_seqs": 96}), "glm-4.6")
    _crash(store, ClusterKey.of(get_gpu("h200")), prefill, "kimi-k2-instruct")  # another GPU: not this cluster
    base = ["plan", deployment, "--vllm", "/nonexistent/vllm", "--not-hybrid", "--vllm-version", "0.26.1"]

    assert main(base) == 0
    assert "known risk" not in capsys.readouterr().out  # no --storage: nothing checked
    assert main([*base, "--storage", storage]) == 0
    warnings = [line for line in capsys.readouterr().out.splitlines() if "known risk" in line]
    assert warnings == [f"# warning: decode {decode.label()} is a known risk on cluster gb300-nvlink72+infiniband "
                        f"(vLLM 0.26.1): crashed for minimax-m2 (last: {CRASH})"]  # the flags must match too

    assert main([*base, "--storage", storage, "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["processes"] and "crashed for minimax-m2" in captured.err
    assert main([*base, "--storage", storage, "--max-num-seqs", "96"]) == 0
    assert "crashed for glm-4.6" in capsys.readouterr().out
    assert main([*base[:-1], "0.32.0", "--storage", storage]) == 0  # another vLLM: that crash is not known there
    assert "known risk" not in capsys.readouterr().out
    assert main([*base, "--storage", storage, "--cluster", "elsewhere"]) == 0
    assert "known risk" not in capsys.readouterr().out

    _crash(store, ClusterKey.of(GPU), prefill, "deepseek-v3")  # a study that did not pin its vLLM: any version
    assert main([*base[:-1], "0.32.0", "--storage", storage]) == 0
    out = capsys.readouterr().out
    assert f"prefill {prefill.label()} is a known risk" in out and "(vLLM unknown): crashed for deepseek-v3" in out
