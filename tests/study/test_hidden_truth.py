"""Hidden truths: the tuner only ever sees TrialResults, never a truth's parameters; a truth differs from the model."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from _support.paths import REFERENCE_MODEL, REFERENCE_SPACE, REPO

from tuner.backends import TrialRequest, TrialStatus
from tuner.backends._truth import LATER_FACTORS, HiddenTruth, HiddenTruthBackend, draw_calibration
from tuner.deployment import Deployment
from tuner.executors import LocalExecutor
from tuner.hardware import get_gpu
from tuner.models import load_model
from tuner.perf import FITTABLE_FACTORS, Calibration, RooflineModel, default_calibration
from tuner.space import load_space
from tuner.study import PhaseRun, TuneOptions

MODEL = REFERENCE_MODEL
SPACE = REFERENCE_SPACE
READS: list[tuple[str, str]] = []  # (field, module of the code that read it)


@dataclass(frozen=True)
class SpiedTruth(HiddenTruth):
    """A truth that logs which module reads each of its fields or methods."""

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("__"):
            READS.append((name, sys._getframe(1).f_globals.get("__name__", "?")))
        return object.__getattribute__(self, name)


def test_a_study_never_reads_the_truths_parameters(tmp_path: Path) -> None:
    drawn = HiddenTruth.draw(3)
    truth = SpiedTruth(**{f: getattr(drawn, f) for f in drawn.__dataclass_fields__})
    READS.clear()
    space, model = load_space(SPACE), load_model(MODEL)
    run = PhaseRun(phase="prefill", space=space, model=model, model_path=str(MODEL), gpu=get_gpu("gb300"),
                   storage=optuna.storages.InMemoryStorage(), study_name="spied", backend_name="simulated",
                   executor=LocalExecutor(HiddenTruthBackend(truth)),
                   options=TuneOptions(trials=4, sampler="auto", seed=0), artifacts_dir=tmp_path)
    study = run.run()
    launched = [t for t in study.trials if t.user_attrs.get("kind") == "sampled"]
    assert len(launched) == 4
    assert READS, "the spy saw no reads: the backend did not use the truth"
    readers = {module for _, module in READS}
    assert readers == {"tuner.backends._truth"}, f"read outside the truth's backend: {readers}"
    stored = json.dumps([t.user_attrs for t in study.trials] + [study.user_attrs], default=str)
    base = default_calibration("gb300")
    drawn_values = [repr(getattr(drawn.calibration, n))[:10] for n in FITTABLE_FACTORS
                    if getattr(drawn.calibration, n) != getattr(base, n)]
    assert len(drawn_values) >= 10 and all(len(v) == 10 for v in drawn_values)
    for value in drawn_values:  # no drawn factor leaks into what the study stores
        assert value not in stored, value


def test_no_tuner_module_but_the_backend_imports_the_truth() -> None:
    importers = []
    for path in (REPO / "tuner").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.endswith("_truth"):
                importers.append(path.relative_to(REPO).as_posix())
    assert importers == [], importers  # tuner/backends/_truth.py defines it; nothing in tuner/ uses it


def test_truths_differ_from_the_model_within_bounds() -> None:
    base = default_calibration("gb300")
    truths = [HiddenTruth.draw(i) for i in range(5)]
    for t in truths:
        assert t.calibration != base
        assert 0.95 <= t.kv_capacity_factor <= 1.05
        for name in FITTABLE_FACTORS:
            value = getattr(t.calibration, name)
            Calibration.model_validate({**base.model_dump(), name: value})  # inside the documented bounds
    assert len({t.calibration for t in truths}) == 5
    assert HiddenTruth.draw(2) == HiddenTruth.draw(2)  # seeded


def test_truth_answers_differ_from_the_simulator_and_measurements_are_noisy() -> None:
    space, model, gpu = load_space(SPACE), load_model(MODEL), get_gpu("gb300")
    workload = space.phase_workload("decode")
    topo = space.topology("decode", {"tp": 4, "dp": 4, "ep": True, "mtp": 1, "gpu_memory_utilization": 0.9,
                                     "max_num_seqs": 256, "max_num_batched_tokens": 8192})
    request = TrialRequest(trial_id="t", model_path=str(MODEL), gpu="gb300", deployment=Deployment.single(topo),
                           workload=workload, seed=1)
    backend = HiddenTruthBackend(HiddenTruth.draw(0))
    simulated = RooflineModel(model, gpu).predict_curve(topo, topo.role, isl=workload.isl, osl=workload.osl,
                                                        concurrencies=workload.concurrency)
    truth = backend.expected_curve(request)
    ratios = [t.total_tok_s_per_gpu / s.total_tok_s_per_gpu for t, s in zip(truth, simulated, strict=True)]
    assert all(abs(r - 1) > 0.02 for r in ratios), ratios
    first = backend.run(request)
    again = backend.run(request.model_copy(update={"seed": 2}))
    assert first.status is TrialStatus.OK and again.status is TrialStatus.OK
    assert first.points[0].total_tok_s_per_gpu != again.points[0].total_tok_s_per_gpu  # noise per measurement
    assert backend.run(request).points == first.points  # the same trial seed measures the same numbers


def test_a_truths_kv_factor_moves_the_kv_cap_and_never_max_num_seqs() -> None:
    """max-num-seqs is a flag the truth honours exactly: a KV cache 5% smaller must not run 4 seqs as 3."""
    from tuner.backends._truth import _TruthRoofline

    space, model, gpu = load_space(SPACE), load_model(MODEL), get_gpu("gb300")
    workload = space.phase_workload("decode")
    topo = space.topology("decode", {"tp": 4, "dp": 4, "ep": True, "mtp": 1, "gpu_memory_utilization": 0.9,
                                     "max_num_seqs": 4, "max_num_batched_tokens": 8192})
    modelled = RooflineModel(model, gpu).state(topo, topo.role, isl=workload.isl, osl=workload.osl)
    assert modelled.cap_per_rank == 4 < modelled.kv_cap_per_rank  # the flag binds, not the KV cache
    for factor in (0.95, 1.05):
        truth = dataclasses.replace(HiddenTruth.draw(0), kv_capacity_factor=factor)
        state = _TruthRoofline(model, gpu, truth).state(topo, topo.role, isl=workload.isl, osl=workload.osl)
        assert state.kv_cap_per_rank == int(modelled.kv_cap_per_rank * factor)
        assert state.cap_per_rank == 4


def test_the_benchmark_prints_the_issue_figures_as_json_and_resumes_from_its_runs(tmp_path: Path) -> None:
    """`sample_efficiency.py --json` gives the figures scripts read (per phase and sampler, with their standard
    errors); `--runs` keeps every finished run, and a second invocation reads them back instead of re-running;
    `--jobs 2` gives the same figures from two worker processes; `--max-trials` caps each run."""
    runs = tmp_path / "runs.jsonl"
    argv = [sys.executable, str(REPO / "benchmarks" / "sample_efficiency.py"), "--json", "--phases", "prefill",
            "--samplers", "auto", "random", "--truths", "1", "--first-truth", "3", "--seeds", "2", "--runs", str(runs)]
    first = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True)
    figures = json.loads(first.stdout)
    assert set(figures) == {"prefill"} and set(figures["prefill"]) == {"auto", "random"}
    for row in figures["prefill"].values():
        assert 0.0 < row["hv_ratio_at_10pct"] <= 1.0 + 1e-9
        assert row["hv_ratio_at_10pct_se"] is not None and row["hv_ratio_at_10pct_se"] >= 0.0
        assert {"trials_to_95pct", "trials_per_front_point", "trials_per_front_point_se"} <= set(row)
    assert len(runs.read_text().splitlines()) == 4  # 2 samplers x 1 truth x 2 seeds
    second = subprocess.run([*argv, "--per-truth"], capture_output=True, text=True, timeout=600, check=True)
    assert len(runs.read_text().splitlines()) == 4  # nothing re-run
    again = json.loads(second.stdout)
    for sampler, row in figures["prefill"].items():  # the same runs give the same figures (timings aside)
        assert {k: v for k, v in again["prefill"][sampler].items() if "_s_per_trial" not in k and k != "per_truth"} == {
            k: v for k, v in row.items() if "_s_per_trial" not in k}
        truth = dict(again["prefill"][sampler]["per_truth"]["3"])  # one truth: its figures are the whole row's
        assert len(truth.pop("trials_to_95pct_each")) == int(truth["runs_reaching_95pct"].split("/")[0])
        assert truth["runs_reaching_95pct"].endswith("/2")
        assert truth == {k: v for k, v in again["prefill"][sampler].items() if k != "per_truth"}
    assert "| auto | 3 |" in second.stderr  # the per-truth table, beside the JSON
    # the runs spread over two worker processes: the same runs, the same figures, every run logged once
    spread = tmp_path / "spread.jsonl"
    parallel = subprocess.run([*argv[:-1], str(spread), "--jobs", "2"], capture_output=True, text=True, timeout=600,
                              check=True)
    assert sorted(json.loads(line)["key"]["seed"] for line in spread.read_text().splitlines()) == [0, 0, 1, 1]
    for sampler, row in json.loads(parallel.stdout)["prefill"].items():
        assert {k: v for k, v in row.items() if "_s_per_trial" not in k} == {
            k: v for k, v in figures["prefill"][sampler].items() if "_s_per_trial" not in k}
    # a screening run stops at --max-trials and is scored there (its runs are logged apart from full ones)
    capped = tmp_path / "capped.jsonl"
    short = subprocess.run([*argv[:-1], str(capped), "--max-trials", "4", "--samplers", "random"], capture_output=True,
                           text=True, timeout=600, check=True)
    assert json.loads(short.stdout)["prefill"]["random"]["budget"] == 4
    assert {json.loads(line)["key"]["budget"] for line in capped.read_text().splitlines()} == {4}
    assert all(len(json.loads(line)["score"]["hv_ratios"]) == 4 for line in capped.read_text().splitlines())


def test_factors_added_later_leave_every_earlier_draw_alone() -> None:
    """A factor added to Calibration after the truths were fixed is drawn from its own generator: the other
    factors (and so every truth and the benchmark's published figures) do not move, whatever it draws."""
    import numpy as np

    base = default_calibration("h200")  # a class where the later factor is not zero
    a = draw_calibration(base, np.random.default_rng(7), np.random.default_rng(1))
    b = draw_calibration(base, np.random.default_rng(7), np.random.default_rng(2))
    for name in type(base).model_fields:
        if name in LATER_FACTORS:
            assert getattr(a, name) != getattr(b, name) and getattr(a, name) > 0
        else:
            assert getattr(a, name) == getattr(b, name), name


def test_kernel_kind_efficiencies_differ_by_kind_and_only_when_asked() -> None:
    """kernel_kind_sigma (benchmarks/transfer.py): models of one kernel kind share each kernel efficiency, another
    kind's differs where its kernels do; 0 (every other truth) is the cluster's one calibration for every model."""
    models = {n: load_model(REPO / "examples" / "models" / n)
              for n in ("kimi-k2-instruct", "minimax-m2", "qwen3-235b-a22b")}
    plain = HiddenTruth.draw(3)
    assert all(plain.calibration_for(m) == plain.calibration for m in models.values())
    truth = dataclasses.replace(plain, kernel_kind_sigma=0.10)
    kimi, minimax, qwen = (truth.calibration_for(models[n]) for n in models)
    # kimi and minimax: FP8 weights and experts, BF16 KV; they differ only in attention (MLA against GQA)
    assert kimi.hbm_efficiency == minimax.hbm_efficiency and kimi.moe_gemm_efficiency == minimax.moe_gemm_efficiency
    assert kimi.prefill_flop_efficiency != minimax.prefill_flop_efficiency
    assert qwen.moe_gemm_efficiency != kimi.moe_gemm_efficiency  # BF16 experts: another GEMM
    assert kimi.step_overhead_ms == plain.calibration.step_overhead_ms  # not a kernel efficiency: the cluster's
