"""The store's cross-check (issue 49): a transferred part moves a new model's prior only as far as leaving one of the
store's models out shows that it carries from model to model."""

from __future__ import annotations

import math

import numpy as np
import pytest
from _support.truth_runs import MODELS, measured_runs

from tuner.cluster import ClusterKey, ClusterStore, cross_check, learn, pretrial_knowledge
from tuner.cluster._guard import prior_error
from tuner.cluster._knowledge import samples_of
from tuner.hardware import get_gpu
from tuner.models import kernel_kind, load_model
from tuner.perf import default_calibration

GPU = get_gpu("gb300")
KEY = ClusterKey.of(GPU, None, "truth-3")
GPT_OSS = load_model(MODELS / "gpt-oss-120b")


@pytest.fixture(scope="module")
def two_models() -> list:
    return measured_runs("kimi-k2-instruct", 10) + measured_runs("minimax-m2", 10)


def test_one_model_in_the_store_moves_nothing(store: ClusterStore) -> None:
    """With a single model there is no model to leave out: nothing shows the factors carry, so the prior is the
    documented one (the known risks still transfer), and each part says why."""
    for run in measured_runs("kimi-k2-instruct", 8):
        store.record_run(KEY, run)
    plain = learn(KEY, GPU, store.read_runs(KEY), kind=kernel_kind(GPT_OSS))
    assert any(not math.isclose(a, b) for a, b in plain.moved().values())  # the fit alone would move factors
    checked = pretrial_knowledge(store, KEY, GPU, kernel_kind(GPT_OSS))
    default = default_calibration("gb300")
    assert all(math.isclose(checked.calibration.factor(n), default.factor(n), rel_tol=1e-6)
               for n in plain.factors)
    run = store.read_runs(KEY)[0]
    assert checked.offset_weight == 0.0 and checked.offset(run.role, run.topology) == (0.0, 0.0)
    assert checked.pretrial and all(c["weight"] == 0.0 and c["folds"] == 0 for c in checked.pretrial)
    assert "pretrial_checks" in checked.as_json()


def test_the_chosen_weights_predict_the_left_out_models_no_worse_than_the_default(two_models: list) -> None:
    """Each part's weight is the one with the lowest mean held-out error (ties to the default), and the prior a
    third model then gets predicts its own runs (which no fold saw) no worse than the documented calibration."""
    samples = samples_of(two_models)
    plain = learn(KEY, GPU, two_models, kind=kernel_kind(GPT_OSS))
    checked = cross_check(plain, samples, GPU)
    judged = [c for c in checked.pretrial if c["folds"]]
    assert judged  # two models: the shared factors and offsets are judged on each left out
    for c in judged:
        errors = np.array(c["errors"])
        assert errors[[0.0, 0.5, 1.0].index(c["weight"])] == errors.min() or c["weight"] == 0.0
    third = samples_of(measured_runs("gpt-oss-120b", 8))
    default = default_calibration("gb300")
    assert prior_error(third, GPU, checked.calibration, checked) <= prior_error(third, GPU, default, None)
