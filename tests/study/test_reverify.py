"""Re-verifying a front after an emulated vLLM upgrade: the verdicts follow the emulation's factors through the
noise test, the new runs supersede the old ones, the search re-opens, and studies stored before versions load."""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
from pathlib import Path

import optuna
import pytest
import sqlalchemy
from _support.paths import REFERENCE_MODEL, REFERENCE_SPACE

from tuner.backends import SimulatedBackend
from tuner.backends._version_shift import SHIFT_SPREAD, SIMULATED_VLLM_VERSION, VersionShift
from tuner.cli import main
from tuner.errors import ConfigError
from tuner.executors import LocalExecutor
from tuner.export import simulated_label
from tuner.models import load_model
from tuner.space import load_space
from tuner.study import (
    Campaign,
    NoiseTest,
    ReverifyOptions,
    TuneOptions,
    Verdict,
    VersionTag,
    load_campaign,
    open_storage,
    recipe_versions,
    reverify_state,
    reverify_study,
    stored_reports,
    version_fronts,
)
from tuner.study._reverify import front_targets

SPACE = load_space(REFERENCE_SPACE)
CANDIDATE_VERSIONS = [f"0.{minor}.{patch}" for minor in range(33, 41) for patch in range(4)]


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One demo-like study on the simulated backend (the reference model and space), tuned once per module."""
    db = tmp_path_factory.mktemp("tuned") / "studies.db"
    campaign = Campaign(model_path=str(REFERENCE_MODEL), space=SPACE, backend_name="simulated",
                        executor=LocalExecutor(SimulatedBackend(), max_parallel=2), storage_url=f"sqlite:///{db}",
                        options=TuneOptions(trials=6), artifacts_dir=db.parent / "artifacts")
    return db, campaign.run().name


@pytest.fixture
def study(tuned: tuple[Path, str], tmp_path: Path) -> tuple[str, str]:
    """A private copy of the tuned study: (storage url, campaign name)."""
    db, name = tuned
    with contextlib.closing(sqlite3.connect(db)) as source, contextlib.closing(
            sqlite3.connect(tmp_path / "studies.db")) as copy:
        source.backup(copy)  # the committed pages, the write-ahead log's included (tuner.sqlite)
    return f"sqlite:///{tmp_path / 'studies.db'}", name


def _expected(phase: str, params: dict, shift: VersionShift, test: NoiseTest, repeats: int) -> Verdict | None:
    """What the noise test must say given the emulation's factor (None: inside the test's grey zone)."""
    topo = SPACE.topology(phase, params)  # type: ignore[arg-type]
    if shift.stops_starting(topo):
        return Verdict.NO_LONGER_STARTS
    ratio = 1.0 / shift.step_factor(topo)  # throughput scales by the inverse of the step time
    detectable = test.detectable_ratio(1, repeats)
    if ratio >= detectable:
        return Verdict.FASTER
    if ratio <= 1 / detectable:
        return Verdict.SLOWER
    return Verdict.UNCHANGED if math.isclose(ratio, 1.0) else None


def _version_with_every_change(url: str, name: str, test: NoiseTest, repeats: int) -> tuple[str, dict]:
    """The first candidate version under which the front has a faster, a slower and a no-longer-starting config."""
    result, _, _ = load_campaign(url, name)
    targets = front_targets(result)
    for version in CANDIDATE_VERSIONS:
        shift = VersionShift(SIMULATED_VLLM_VERSION, version)
        expected = {(t.phase, t.point.stored_as): _expected(t.phase, t.point.params, shift, test, repeats)
                    for t in targets}
        if {Verdict.FASTER, Verdict.SLOWER, Verdict.NO_LONGER_STARTS} <= set(expected.values()):
            return version, expected
    pytest.fail("no candidate version changes the front in every way")


def test_reverify_reports_exactly_the_configs_the_emulated_upgrade_changed(study: tuple[str, str],
                                                                           tmp_path: Path) -> None:
    url, name = study
    test, repeats = NoiseTest(), 3
    version, expected = _version_with_every_change(url, name, test, repeats)
    assert None not in expected.values()  # the emulation's changes (>= 12%) are beyond the test's grey zone
    report = reverify_study(url, name, LocalExecutor(SimulatedBackend(vllm_version=version), max_parallel=2),
                            ReverifyOptions(budget=len(expected), repeats=repeats, test=test, reopen=False),
                            artifacts_dir=tmp_path)
    got = {(r.phase, r.trial): Verdict(r.verdict) for r in report.rows}
    assert got == expected
    assert report.vllm_version == version and report.to_version.startswith(f"vLLM {version}")
    assert report.rows[0].why == "recipe"  # the exported recipes' configs come first
    # the new runs are stored tagged with the new version and are the configs' current measurements
    result, _, _ = load_campaign(url, name)
    for r in report.rows:
        pr = result.phases[r.phase]
        assert all(p.stored_as != r.trial for p in pr.points)  # the old trial's every level is history now
        assert any(r.compared(p) for p in pr.superseded)
        # "before" reads the figure the front printed for that point (#46: the front's goodput tok/s/GPU)
        stored = next(p for p in pr.superseded if r.compared(p))
        assert r.front_before == stored.values[0] and r.label == stored.label
        current = [p for p in pr.points if p.trial == r.new_trial]
        if r.verdict == Verdict.NO_LONGER_STARTS:
            assert current == []  # a config that no longer starts is on no front and in no export
        else:
            assert current and all(p.vllm_version == version for p in current)
    # the per-version history: the old version's front and the new one's, both kept
    points = [p for pr in result.phases.values() for p in [*pr.points, *pr.superseded]]
    tags = {t.vllm_version for t in version_fronts(points)}
    assert tags == {SIMULATED_VLLM_VERSION, version}
    assert [r.id for r in stored_reports(url, name)] == [report.id]


def test_reverify_reopens_the_search_around_changed_configs(study: tuple[str, str], tmp_path: Path) -> None:
    url, name = study
    version, expected = _version_with_every_change(url, name, NoiseTest(), 2)
    budget = len(expected) + 4
    report = reverify_study(url, name, LocalExecutor(SimulatedBackend(vllm_version=version)),
                            ReverifyOptions(budget=budget, repeats=2), artifacts_dir=tmp_path)
    changed = {r.trial for r in report.rows[:len(expected)] if r.verdict != Verdict.UNCHANGED}
    neighbours = report.rows[len(expected):]
    assert len(report.rows) <= budget
    assert all(r.why.startswith("neighbour of trial ") and int(r.why.rsplit(" ", 1)[1]) in changed
               for r in neighbours)
    assert report.enqueued  # unmeasured neighbours wait in the studies, first in line for the next `tune`
    storage = open_storage(url)
    for item in report.enqueued:
        waiting = optuna.load_study(study_name=f"{name}/{item['phase']}", storage=storage).get_trials(
            states=(optuna.trial.TrialState.WAITING,))
        assert any(t.system_attrs.get("fixed_params") == item["params"]
                   and t.user_attrs.get("reopened_from") == item["reopened_from"]
                   for t in waiting)
    # continuing the study on the new version launches them first, tagged with that version
    campaign = Campaign(model_path=str(REFERENCE_MODEL), space=SPACE, backend_name="simulated",
                        executor=LocalExecutor(SimulatedBackend(vllm_version=version)), storage_url=url,
                        options=TuneOptions(trials=7), artifacts_dir=tmp_path, name=name)
    campaign.run()
    for phase in ("prefill", "decode"):
        s = optuna.load_study(study_name=f"{name}/{phase}", storage=storage)
        new = [t for t in s.get_trials() if t.user_attrs.get("kind") == "sampled"][-1]
        assert new.user_attrs["vllm_version"] == version
        if any(item["phase"] == phase for item in report.enqueued):
            assert new.user_attrs.get("reopened_from") is not None


def test_a_study_stored_before_versions_loads_and_reverifies(study: tuple[str, str], tmp_path: Path) -> None:
    """Trials without vllm_version / model_revision (what older topotune stored) read as "unknown"."""
    url, name = study
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:  # the rows as an older topotune left them: no version keys at all
        gone = conn.execute(sqlalchemy.text("DELETE FROM trial_user_attributes WHERE key IN "
                                            "('vllm_version', 'model_revision')")).rowcount
    engine.dispose()
    assert gone > 0
    before, _, _ = load_campaign(url, name)
    points = [p for pr in before.phases.values() for p in pr.points]
    assert points and {p.vllm_version for p in points} == {"unknown"}
    assert list(version_fronts(points)) == [VersionTag()]
    report = reverify_study(url, name, LocalExecutor(SimulatedBackend()), ReverifyOptions(budget=2, repeats=2),
                            artifacts_dir=tmp_path)
    assert all(r.from_version.startswith("version unknown") for r in report.rows)
    assert all(r.verdict == Verdict.UNCHANGED for r in report.rows)  # same physics, no noise: nothing moved


def test_cli_reverify_prints_the_verdicts_and_names_bad_fields(study: tuple[str, str], tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    url, name = study
    version, expected = _version_with_every_change(url, name, NoiseTest(), 3)
    code = main(["reverify", name, "--storage", url, "--emulate-vllm", version, "--budget", str(len(expected)),
                 "--no-reopen", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert {(r["phase"], r["trial"]): r["verdict"] for r in out["rows"]} == {k: str(v) for k, v in expected.items()}
    assert out["counts"]["no longer starts"] >= 1
    assert main(["reverify", name, "--storage", url, "--repeats", "0"]) == 2
    assert "--repeats" in capsys.readouterr().err
    assert main(["reverify", name, "--storage", url, "--noise-floor", "2"]) == 2
    assert "--noise-floor" in capsys.readouterr().err


def test_noise_test_and_emulation_are_bounded_and_deterministic() -> None:
    test = NoiseTest()
    assert test.compare([100.0], [100.0] * 3).verdict is Verdict.UNCHANGED
    assert test.compare([100.0], [88.0] * 3).verdict is Verdict.SLOWER
    assert test.compare([100.0], [113.0] * 3).verdict is Verdict.FASTER
    assert test.compare([100.0], [95.0] * 3).verdict is Verdict.UNCHANGED  # within one run's noise floor
    # real spread beyond the floor widens the test (Welch): a 12% gap with 15% noise is not called
    assert test.compare([100.0, 130.0, 80.0], [88.0, 115.0, 70.0]).verdict is Verdict.UNCHANGED
    assert test.detectable_ratio(1, 3) < SHIFT_SPREAD[0]  # every emulated speed change is detectable
    with pytest.raises(ConfigError, match="alpha"):
        NoiseTest(alpha=0.7)
    shift = VersionShift(SIMULATED_VLLM_VERSION, "0.33.0")
    topos = SPACE.expand("decode", load_model(REFERENCE_MODEL))
    factors = [shift.step_factor(t) for t in topos]
    assert factors == [VersionShift(SIMULATED_VLLM_VERSION, "0.33.0").step_factor(t) for t in topos]
    lo, hi = SHIFT_SPREAD
    assert all(f == 1.0 or lo <= f <= hi or lo <= 1 / f <= hi for f in factors)
    assert 1.0 in factors and any(f > 1 for f in factors) and any(f < 1 for f in factors)
    assert 0 < sum(shift.stops_starting(t) for t in topos) < len(topos) / 4
    same = VersionShift("0.33.0", "0.33.0")
    assert all(same.step_factor(t) == 1.0 and not same.stops_starting(t) for t in topos)


def test_simulated_version_is_the_version_table_newest() -> None:
    from tuner.backends.vllm._versions import NEWEST_CHECKED

    assert str(NEWEST_CHECKED) == SIMULATED_VLLM_VERSION


def test_an_exported_recipe_names_the_version_it_was_verified_on(study: tuple[str, str], tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    url, name = study
    # what export indexes: the composed front, or where this small study composes nothing, each phase's instances
    # (a PD study without a composed front has no deployment: tests/study/test_trial_levels.py)
    result, _, _ = load_campaign(url, name)
    studies = [name] if result.composed_front else [f"{name}/{phase}" for phase in result.phases]
    for fmt in ("vllm", "compose", "srt-slurm"):
        assert main(["export", studies[-1], "--storage", url, "--format", fmt]) == 0
        # a simulated study: its figures say so, under the rules of the version its trials were tagged with (#46)
        assert f"# Figures: simulated (vLLM {SIMULATED_VLLM_VERSION.rsplit('.', 1)[0]} rules), not measured." in \
            capsys.readouterr().out
    report = reverify_study(url, name, LocalExecutor(SimulatedBackend(vllm_version="0.33.0")),
                            ReverifyOptions(budget=30, repeats=1, reopen=False), artifacts_dir=tmp_path)
    assert report.rows
    lines = []
    for study_name in studies:
        for point, label in enumerate(recipe_versions(load_campaign(url, study_name)[0])):
            assert main(["export", study_name, "--storage", url, "--point", str(point)]) == 0
            lines.append(next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("# Figures")))
            assert lines[-1] == f"# Figures: {simulated_label(label)}, not measured."
    assert any("vLLM 0.33 rules" in ln for ln in lines)  # the re-measured configs' recipes name the new version


def test_reverify_claims_the_study_and_always_leaves_a_report(study: tuple[str, str], tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished re-verification clears its claim (even with heartbeats racing its end), a failing one stores a
    failed report with the error, and a claim left by a process that no longer runs is reported failed once, after
    which the study re-verifies."""
    import os
    import socket

    import tuner.study._reverify as rv

    monkeypatch.setattr(rv, "HEARTBEAT_S", 0.001)  # beats as often as possible: one must not outlive the end
    url, name = study
    options = ReverifyOptions(budget=2, repeats=1, reopen=False)
    report = reverify_study(url, name, LocalExecutor(SimulatedBackend(vllm_version="0.33.0")), options,
                            artifacts_dir=tmp_path)
    state = reverify_state(url, name)
    assert report.status == "complete" and not state.running and state.error is None

    failing = LocalExecutor(SimulatedBackend())
    failing.can_start = lambda _request: (_ for _ in ()).throw(RuntimeError("the executor broke"))  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        reverify_study(url, name, failing, options, artifacts_dir=tmp_path)
    state = reverify_state(url, name)
    assert not state.running and state.error == "RuntimeError: the executor broke"
    assert [r.status for r in stored_reports(url, name)] == ["complete", "failed"]

    first = next(iter(rv.open_campaign_studies(url, name).values()))
    dead = rv._Heartbeat(first, rv.ReverifyReport(campaign=name, to_version="", vllm_version="unknown",
                                                  model_revision="unknown", budget=2, repeats=1, noise_floor=0.1,
                                                  alpha=0.05, min_effect=0.1, started_at=0.0)).claim()
    first.set_user_attr(rv.RUNNING_KEY, dead)  # this process's claim: alive
    with pytest.raises(ConfigError, match="already running"):
        reverify_study(url, name, LocalExecutor(SimulatedBackend()), options, artifacts_dir=tmp_path)
    assert reverify_state(url, name).running
    # a pid above the kernel's pid_max (2**22) runs nowhere: the claim of a process that is gone
    first.set_user_attr(rv.RUNNING_KEY, {**dead, "driver": f"{socket.gethostname()}:{2**22 + os.getpid()}"})
    state = reverify_state(url, name)
    assert not state.running and state.recovered is not None and "interrupted" in (state.error or "")
    assert reverify_state(url, name).recovered is None  # found once
    again = reverify_study(url, name, LocalExecutor(SimulatedBackend(vllm_version="0.33.0")), options,
                           artifacts_dir=tmp_path)
    assert again.status == "complete" and [r.status for r in stored_reports(url, name)][-2:] == ["failed",
                                                                                                  "complete"]


def test_a_composed_recipe_re_verified_on_one_side_names_each_sides_version() -> None:
    """A composed point whose decode side was re-measured on 0.33 (its prefill side still 0.32): the recipe's
    figures name both, not the first version found (the export said 0.32 rules for it)."""
    assert simulated_label("prefill vLLM 0.32.0 · model e0f1e04, decode vLLM 0.33.0 · model e0f1e04") == \
        "simulated (prefill vLLM 0.32 rules, decode vLLM 0.33 rules)"
    assert simulated_label("vLLM 0.32.0 · model e0f1e04") == "simulated (vLLM 0.32 rules)"
