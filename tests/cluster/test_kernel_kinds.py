"""Transfer that never hurts (issue 49): kernel factors carry only to models whose kernels match, the shared part to
every model, and a new model's guard falls back where the transferred prior predicts its first trials worse than
the documented default."""

from __future__ import annotations

import dataclasses

import pytest
from _support.truth_runs import MODELS, measured_runs, space

from tuner.backends import TrialRequest, TrialResult
from tuner.cluster import KERNEL_DEPENDENCE, ClusterKey, ClusterStore, GuardVerdict, guard, learn
from tuner.cluster._knowledge import samples_of
from tuner.deployment import Deployment
from tuner.hardware import get_gpu
from tuner.models import kernel_kind, load_model
from tuner.perf import default_calibration
from tuner.study import StudyTransfer
from tuner.trial_status import TrialStatus

GPU = get_gpu("gb300")
KEY = ClusterKey.of(GPU, None, "truth-3")
GPT_OSS = load_model(MODELS / "gpt-oss-120b")
MINIMAX = load_model(MODELS / "minimax-m2")


@pytest.fixture(scope="module")
def fp8_runs() -> list:
    """Two FP8-expert models (MLA and GQA attention) measured on truth 3."""
    return measured_runs("kimi-k2-instruct", 10) + measured_runs("minimax-m2", 10)


def test_kernel_kind_reads_the_model() -> None:
    assert kernel_kind(GPT_OSS).expert_weights == "mxfp4" and kernel_kind(GPT_OSS).attention == "swa-sinks"
    kimi = kernel_kind(load_model(MODELS / "kimi-k2-instruct"))
    assert (kimi.dense_weights, kimi.expert_weights, kimi.attention) == ("fp8", "fp8", "mla")
    assert kernel_kind(MINIMAX).attention == "gqa"
    assert kernel_kind(load_model(MODELS / "qwen3-next-80b-a3b")).attention == "hybrid-linear"
    assert kernel_kind(load_model(MODELS / "llama-3.1-70b")).expert_weights == "none"


def test_fp8_factors_do_not_move_an_mxfp4_models_prior(store: ClusterStore, fp8_runs: list,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """What FP8-expert models taught about the GEMM and bandwidth kernels stays with FP8-expert models: gpt-oss
    (MXFP4 experts) opens its study at the documented kernel factors, with the shared factors learnt (the store's
    fit itself; its cross-check is tests/cluster/test_crosscheck.py)."""
    monkeypatch.setattr("tuner.study._transfer.CROSS_CHECK", False)
    for run in fp8_runs:
        store.record_run(KEY, run)
    mxfp4 = StudyTransfer.open(store, GPU, GPT_OSS, str(MODELS / "gpt-oss-120b"), cluster="truth-3")
    fp8 = StudyTransfer.open(store, GPU, MINIMAX, str(MODELS / "minimax-m2"), cluster="truth-3")
    default = default_calibration("gb300")
    kernel = [f for f in KERNEL_DEPENDENCE if f in mxfp4.knowledge.factors]
    assert kernel  # decode trials exercise the kernel factors hbm_efficiency and flop_efficiency
    for name in kernel:
        assert mxfp4.knowledge.calibration.factor(name) == default.factor(name)
        assert mxfp4.knowledge.evidence[name].runs == 0
    assert any(fp8.knowledge.calibration.factor(n) != default.factor(n) for n in kernel)
    shared = [n for n in mxfp4.knowledge.factors if n not in KERNEL_DEPENDENCE]
    moved = [n for n in shared if mxfp4.knowledge.calibration.factor(n) != default.factor(n)]
    assert moved  # the network and per-step / per-request costs carry to every model
    assert all(mxfp4.knowledge.calibration.factor(n) == fp8.knowledge.calibration.factor(n) for n in shared)
    # the store without a kind (calibrate, the cluster page): kernel factors listed per group of kinds
    k = learn(KEY, GPU, fp8_runs)
    groups = {(f.factor, f.group) for f in k.kernel_factors}
    assert ("hbm_efficiency", "dense_weights=fp8, expert_weights=fp8, kv_cache=bf16") in groups
    assert not set(k.moved()) & set(KERNEL_DEPENDENCE)


def _wrong_for_mxfp4(fp8_runs: list):  # type: ignore[no-untyped-def]
    """gpt-oss's knowledge with an HBM efficiency far from the truth's (as if carried from another kind)."""
    k = learn(KEY, GPU, fp8_runs, kind=kernel_kind(GPT_OSS))
    wrong = k.calibration.model_copy(update={"hbm_efficiency": 0.45})
    return dataclasses.replace(k, calibration=wrong)


def test_the_guard_detects_a_prior_wrong_for_the_kind_and_falls_back(fp8_runs: list) -> None:
    knowledge = _wrong_for_mxfp4(fp8_runs)
    first = samples_of(measured_runs("gpt-oss-120b", 3))  # never seen by the fit behind `knowledge`
    assert len(first) == 3
    kept, verdict = guard(knowledge, first, GPU, GPT_OSS.name)
    assert verdict.error_prior > verdict.error_default  # the transferred prior is worse on these trials
    assert "hbm_efficiency" in verdict.fell_back or verdict.whole_fallback
    assert kept.calibration.hbm_efficiency == knowledge.default.hbm_efficiency
    assert verdict.error_after < verdict.error_prior and verdict.error_after <= verdict.error_default
    assert GuardVerdict.from_json(verdict.as_json()) == verdict
    # a right prior is kept: the guard does not throw away what transfers
    good = learn(KEY, GPU, fp8_runs, kind=kernel_kind(MINIMAX))
    _, fine = guard(good, samples_of(measured_runs("minimax-m2", 3, seed=3)), GPU, MINIMAX.name)
    assert not fine.whole_fallback


def test_a_study_records_the_guard_and_its_prior_follows(store: ClusterStore, fp8_runs: list) -> None:
    """Through the study's transfer: after GUARD_TRIALS measured trials the guard runs once, its verdict goes into
    the store (what calibrate --storage and the cluster page read) and the study's prior uses what it kept."""
    for run in fp8_runs:
        store.record_run(KEY, run)
    path = str(MODELS / "gpt-oss-120b")
    opened = StudyTransfer.open(store, GPU, GPT_OSS, path, cluster="truth-3")
    transfer = dataclasses.replace(opened, knowledge=_wrong_for_mxfp4(fp8_runs))
    sp = space()
    before = transfer.prior(sp, "decode", GPT_OSS, GPU)
    changed = []
    for i, run in enumerate(measured_runs("gpt-oss-120b", 3)):
        request = TrialRequest(trial_id=f"g#{i}", model_path=path, gpu="gb300",
                               deployment=Deployment.single(run.topology), workload=run.workload)
        changed.append(transfer.record("gpt-oss/decode", i, request, TrialResult(status=TrialStatus.OK,
                                                                                  points=run.points)))
    assert changed == [False, False, True] and transfer.verdict is not None
    assert transfer.active.calibration.hbm_efficiency == transfer.knowledge.default.hbm_efficiency
    after = transfer.prior(sp, "decode", GPT_OSS, GPU)
    assert after.candidates == before.candidates and not (after.predicted == before.predicted).all()
    (stored,) = store.read_guards(KEY)
    assert stored["model"] == GPT_OSS.name and stored["study"] == "gpt-oss/decode"
    assert GuardVerdict.from_json(stored).fell_back == transfer.verdict.fell_back
    assert len(store.read_runs(KEY)) == len(fp8_runs) + 3  # the trials were recorded as before
