"""The guided sampler: starts at the simulator's best, never repeats a config (also in parallel), follows the data;
its residual model shares a layout's effect among the layout's configs and keeps untried layouts uncertain."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import optuna
import pytest
from _support.paths import REFERENCE_MODEL, REFERENCE_SPACE

from tuner.backends import Backend, SimulatedBackend, TrialRequest, TrialResult
from tuner.backends._simulated import _noisy
from tuner.backends._truth import HiddenTruth, HiddenTruthBackend
from tuner.errors import ConfigError
from tuner.executors import LocalExecutor
from tuner.frontier import hypervolume_2d
from tuner.hardware import get_gpu
from tuner.models import load_model
from tuner.space import StudyConstraints, load_space
from tuner.study import PhaseRun, TuneOptions, make_sampler
from tuner.study._guided import GuidedSampler, _Observed, measured_front
from tuner.study._prior import EP_SIZE_FEATURE, SimulatorPrior, params_key
from tuner.study._residual import KNOB_VARS, LAYOUT_VARS, SIGNAL_VARS, Hyper, fit_residual

MODEL = REFERENCE_MODEL
SPACE = REFERENCE_SPACE


@pytest.fixture(scope="module")
def setup():  # type: ignore[no-untyped-def]
    """The reference space without its SLA: these tests are about the search, on the whole front."""
    space = load_space(SPACE)
    return space.model_copy(update={"constraints": StudyConstraints()}), load_model(MODEL), get_gpu("gb300")


def _run(setup, backend: Backend, trials: int, tmp_path: Path, parallel: int = 1) -> optuna.Study:  # type: ignore[no-untyped-def]
    space, model, gpu = setup
    return PhaseRun(phase="prefill", space=space, model=model, model_path=str(MODEL), gpu=gpu,
                    storage=optuna.storages.InMemoryStorage(), study_name="guided", backend_name="simulated",
                    executor=LocalExecutor(backend, max_parallel=parallel),
                    options=TuneOptions(trials=trials, sampler="auto", seed=1), artifacts_dir=tmp_path).run()


def _launched(study: optuna.Study) -> list[dict]:
    return [t.params for t in study.trials if t.user_attrs.get("kind") == "sampled"]


def test_first_proposal_is_the_simulators_best_config(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    space, model, gpu = setup
    prior = SimulatorPrior.build(space, "prefill", model, gpu)
    hv = {params_key(c): hypervolume_2d([tuple(p) for p in prior.predicted[i]], (0.0, 0.0))
          for i, c in enumerate(prior.candidates)}
    study = _run(setup, SimulatedBackend(), 1, tmp_path)
    first = hv[params_key(_launched(study)[0])]
    assert first >= 0.97 * max(hv.values())  # the best predicted config or one of its near-twins


def test_parallel_asks_never_repeat_and_always_launch(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    study = _run(setup, HiddenTruthBackend(HiddenTruth.draw(1)), 12, tmp_path, parallel=4)
    launched = _launched(study)
    assert len(launched) == 12
    assert len({params_key(p) for p in launched}) == 12
    kinds = {t.user_attrs.get("kind") for t in study.trials}
    assert "screened" not in kinds and "duplicate" not in kinds  # every proposal could start, none repeated


class OneLayoutFaster(Backend):
    """The simulator, except that one layout the simulator ranks low runs 3x faster than predicted."""

    name = "one-layout-faster"

    def __init__(self, tp: int, dp: int) -> None:
        self.inner = SimulatedBackend()
        self.layout = (tp, dp)

    def run(self, request: TrialRequest) -> TrialResult:
        result = self.inner.run(request)
        topo = request.deployment.groups[0].topology
        if (topo.tp, topo.dp, topo.ep) != (*self.layout, False):
            return result
        return result.model_copy(update={"points": tuple(_noisy(p, 3.0, 1 / 3) for p in result.points)})


def test_data_override_the_simulator(setup, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """A layout the simulator ranks in its lower half runs 3x faster: once one trial of it is measured (queued
    first, as a user's hint would be), the sampler spends on it rather than on the simulator's favourites."""
    space, model, gpu = setup
    prior = SimulatorPrior.build(space, "prefill", model, gpu)
    hv = [hypervolume_2d([tuple(p) for p in prior.predicted[i]], (0.0, 0.0)) for i in range(len(prior.candidates))]
    rank: dict[tuple, int] = {}
    for i in np.argsort(hv)[::-1]:
        c = prior.candidates[i]
        rank.setdefault((c["tp"], c["dp"], c["ep"]), len(rank))
    slow = next(layout for layout, r in rank.items() if r >= len(rank) // 2 and not layout[2] and layout[0] > 1)
    hint = next(c for c in prior.candidates if (c["tp"], c["dp"], c["ep"]) == slow)
    run = PhaseRun(phase="prefill", space=space, model=model, model_path=str(MODEL), gpu=gpu,
                   storage=optuna.storages.InMemoryStorage(), study_name="hinted", backend_name="simulated",
                   executor=LocalExecutor(OneLayoutFaster(slow[0], slow[1])),
                   options=TuneOptions(trials=8, sampler="auto", seed=1), artifacts_dir=tmp_path)
    run.open_study().enqueue_trial(hint)
    study = run.run()
    launched = _launched(study)
    assert params_key(launched[0]) == params_key(hint)
    sampler = study.sampler
    assert isinstance(sampler, GuidedSampler)
    observed = sampler._observe(study)
    free = np.array([i for i in range(len(prior.candidates)) if i not in observed.taken])
    mean, _, _ = sampler._posterior(*sampler._residuals(observed), free)
    twins = np.array([(prior.candidates[i]["tp"], prior.candidates[i]["dp"], prior.candidates[i]["ep"]) == slow
                      for i in free])
    assert twins.any() and (~twins).any()
    # log(measured / predicted): the measured 3x (rates x3, latencies / 3) carries over to the unmeasured
    # configs of that layout; elsewhere the simulator, right so far, stays the prior but for the common offset,
    # which takes about the mean of the measured residuals (log 3 over the configs measured)
    assert np.allclose(mean[twins], np.log(3.0), atol=0.25), mean[twins]
    offset_share = np.log(3.0) / len(observed.points)
    assert np.abs(np.median(mean[~twins], axis=0)).max() < 1.5 * offset_share, np.median(mean[~twins], axis=0)


def test_guided_needs_a_prior() -> None:
    with pytest.raises(ConfigError) as err:
        make_sampler("guided", 0)
    assert err.value.field == "--sampler"


def _two_layouts() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Four configs: layouts 0 and 1 (neighbours in layout space), two engine variants each."""
    features = np.array([[0.0, 0.0], [0.0, 1.0], [0.1, 0.0], [0.1, 1.0]])  # (layout knob, engine knob)
    return features, np.array([True, False]), np.array([0, 0, 1, 1])


def test_one_measurement_of_a_layout_moves_its_other_configs() -> None:
    """The per-layout random effect: a residual measured on one config of a layout carries to that layout's
    other engine variant, and much less to a neighbouring layout (no smooth kernel can tell them apart)."""
    features, layout, group = _two_layouts()
    hyper = Hyper(signal_var=0.004, layout_scale=1.0, engine_scale=3.0, noise_var=0.0004, layout_var=0.04)
    fit = fit_residual(features[:1], np.zeros(1), layout, group[:1], np.array([0.3]), hyper)
    mean, sd = fit.predict(features[1:], np.zeros(3), group[1:])
    same, neighbour = mean[0], mean[1:]
    assert same > 0.28, same  # the twin is predicted almost at the measured residual
    assert (neighbour < same - 0.02).all(), mean  # the neighbouring layout keeps part of its own uncertainty
    assert (sd[1:] > sd[0] + 0.05).all(), sd
    without = dataclasses.replace(hyper, layout_var=0.0)
    flat = fit_residual(features[:1], np.zeros(1), layout, group[:1], np.array([0.3]), without)
    flat_mean, _ = flat.predict(features[1:], np.zeros(3), group[1:])
    assert flat_mean[0] - flat_mean[1] < same - neighbour[0]  # the layout term is what separates them


def test_an_untried_layout_stays_uncertain() -> None:
    """However well the data fit elsewhere, a layout never measured keeps at least the smallest per-layout
    effect of the grid as its sd: the search can still afford to try it."""
    rng = np.random.default_rng(0)
    n = 30
    features = np.column_stack([rng.integers(0, 4, n) / 3, rng.random(n)])
    group = (features[:, 0] * 3).astype(int)
    fit = fit_residual(features, np.zeros(n), np.array([True, False]), group, np.full(n, 0.1))
    assert fit.hyper.layout_var >= min(LAYOUT_VARS) > 0
    _, sd = fit.predict(np.array([[0.5, 0.5], [1 / 3, 0.5]]), np.zeros(2), np.array([99, 1]))
    assert sd[0] >= 0.9 * np.sqrt(min(LAYOUT_VARS)), sd
    assert sd[1] < sd[0]  # a measured layout is known better


def test_coordinate_search_never_loses_to_its_start() -> None:
    rng = np.random.default_rng(1)
    n = 40
    features = rng.random((n, 3))
    group = rng.integers(0, 6, n)
    slope = rng.normal(0, 0.5, n)
    y = 0.2 * slope + 0.1 * np.sin(4 * features[:, 0]) + rng.normal(0, 0.03, n)
    layout = np.array([True, True, False])
    full = fit_residual(features, slope, layout, group, y)
    start = Hyper(SIGNAL_VARS[-1], 0.1, 10.0, 0.01, LAYOUT_VARS[-1], 0.0, 0.01)

    def log_ml(fit) -> float:  # type: ignore[no-untyped-def]
        return -0.5 * float(y @ fit.alpha) - float(np.sum(np.log(np.diag(fit.chol))))
    searched = fit_residual(features, slope, layout, group, y, start=start)
    assert log_ml(searched) > log_ml(fit_residual(features, slope, layout, group, y, start)) + 10.0
    # as the sampler uses it: from the last fit (here the full grid's best), never worse than the start
    again = fit_residual(features, slope, layout, group, y, start=full.hyper)
    assert log_ml(again) >= log_ml(full)


def test_objective_draws_follow_the_measured_correlation(setup) -> None:  # type: ignore[no-untyped-def]
    """Residuals of rate and per-user speed that move together (a step-time factor) give correlated draws; before
    4 measured configs the default holds; anti-correlated residuals are not trusted below 0."""
    space, model, gpu = setup
    prior = SimulatorPrior.build(space, "prefill", model, gpu)
    sampler = GuidedSampler(lambda: prior)

    def observed(residuals: list[tuple[float, float]]) -> _Observed:
        points = {i: [(0, float(prior.predicted[i, 0, 0] * np.exp(a)), float(prior.predicted[i, 0, 1] * np.exp(b)),
                       True)] for i, (a, b) in enumerate(residuals)}
        return _Observed(points=points, taken=set(points), running=[])

    def correlation(residuals: list[tuple[float, float]]) -> float:
        return sampler._correlation(sampler._residuals(observed(residuals))[1])
    assert correlation([(0.1, 0.1), (0.2, 0.2)]) == 0.5
    together = [(v, v + 0.01 * (-1) ** i) for i, v in enumerate((0.1, -0.2, 0.3, 0.0, -0.1))]
    assert correlation(together) == pytest.approx(0.9)
    assert correlation([(v, -v) for v in (0.1, -0.2, 0.3, 0.0, -0.1)]) == 0.0


def test_a_knobs_deviation_measured_on_one_layout_carries_to_untried_layouts() -> None:
    """The additive per-knob term never drops out: after two layouts, one with EP measured 0.4 below the model
    and one without EP on it, an untried EP layout is predicted lower than an untried layout without EP (the
    marginal likelihood of two points would explain both by the offset and per-layout effects alone, and the
    search would keep proposing EP layouts that share the measured one's deficit)."""
    features = np.array([[0.0, 1.0], [0.0, 0.0]])  # (tp position, ep): layout knobs only
    group = np.array([0, 1])
    fit = fit_residual(features, np.zeros(2), np.array([True, True]), group, np.array([-0.4, 0.0]))
    assert fit.hyper.knob_var >= min(KNOB_VARS) > 0
    mean, _ = fit.predict(np.array([[2 / 3, 1.0], [2 / 3, 0.0]]), np.zeros(2), np.array([7, 8]))
    assert mean[0] < mean[1] - 0.05, mean


def test_the_measured_front_is_moved_to_the_posterior() -> None:
    """A config measured above what the model pools from its twins (a lucky draw: a trial's noise moves all its
    levels) enters the front at the posterior estimate, so a new layout is not asked to beat the luckiest twin;
    a config measured where the model expects it stays put, and infeasible points stay out."""
    observed = _Observed(points={3: [(0, 100.0, 10.0, True), (1, 200.0, 5.0, True)],
                                 7: [(0, 150.0, 8.0, True), (1, 300.0, 2.0, False)]}, taken={3, 7}, running=[])
    rows, residual = np.array([3, 7]), np.array([[0.2, 0.2], [0.0, -0.1]])
    posterior = np.array([[0.1, 0.05], [0.0, -0.1]])
    front = measured_front(observed, rows, residual, posterior)
    expected = [(100 * np.exp(-0.1), 10 * np.exp(-0.15)), (200 * np.exp(-0.1), 5 * np.exp(-0.15)), (150.0, 8.0)]
    np.testing.assert_allclose(np.array(front), np.array(expected))


def test_the_ep_groups_size_is_a_layout_feature(setup) -> None:  # type: ignore[no-untyped-def]
    """EP's all-to-all and load imbalance grow with the EP group (tp x dp): the residual model sees its size, so
    a deficit measured at one EP size is carried to that size, not to every layout of the same dp."""
    space, model, gpu = setup
    prior = SimulatorPrior.build(space, "decode", model, gpu)
    col = prior.names.index(EP_SIZE_FEATURE)
    assert prior.layout[col]
    sizes = {}
    for c, f in zip(prior.candidates, prior.features[:, col], strict=True):
        sizes.setdefault((c["tp"] * c["dp"]) if c["ep"] else 0, set()).add(round(float(f), 9))
    assert sizes[0] == {0.0}
    assert all(len(v) == 1 for v in sizes.values())  # one value per EP size
    ordered = [next(iter(sizes[k])) for k in sorted(sizes)]
    assert ordered == sorted(ordered) and ordered[-1] == 1.0 and len(ordered) >= 4
