"""A search space at open-loop request rates: the study, the guided sampler and the simulated backend key load
levels by the rate, and a rate an instance cannot sustain is infeasible, never a point of the front."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml
from _support.paths import REFERENCE_MODEL, REFERENCE_SPACE

from tuner.cli import main
from tuner.errors import ConfigError
from tuner.hardware import get_gpu
from tuner.models import load_model
from tuner.space import load_space
from tuner.study._guided import GuidedSampler
from tuner.study._prior import SimulatorPrior

RATES = [0.25, 1.0, 4.0, 16.0, 64.0, 4096.0]  # requests/s per decode instance; the top one saturates every config


def _rate_space(tmp_path: Path) -> Path:
    space = yaml.safe_load(Path(REFERENCE_SPACE).read_text())
    space["workload"] = {"isl": 2048, "osl": 256, "arrival": "poisson", "request_rates": RATES}
    space["phases"] = {"decode": space["phases"]["decode"]}
    path = tmp_path / "rate-space.yaml"
    path.write_text(yaml.safe_dump(space))
    return path


def test_prior_keys_levels_by_rate_and_saturated_levels_are_infeasible(tmp_path: Path) -> None:
    space = load_space(_rate_space(tmp_path))
    assert space.phase_workload("decode").levels == tuple(RATES)
    prior = SimulatorPrior.build(space, "decode", load_model(REFERENCE_MODEL), get_gpu(space.cluster.gpu))
    assert prior.levels == tuple(RATES) and prior.predicted.shape[1] == len(RATES)
    # every config saturates at 4096 req/s (1M output tok/s on one instance): no point, infeasible
    assert not prior.feasible[:, -1].any()
    assert prior.feasible[:, 0].any()  # and the lowest rate is served within the SLA by some config


def test_study_on_request_rates_has_no_saturated_point_on_its_front(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    storage = f"sqlite:///{tmp_path / 'rates.db'}"
    path = _rate_space(tmp_path)
    assert main(["tune", str(REFERENCE_MODEL), "--space", str(path), "--trials", "6",
                 "--executor", "local", "--storage", storage, "--json"]) == 0
    name = json.loads(capsys.readouterr().out)["name"]
    # the guided sampler (the default) read the measured levels by their rate: none at the saturating one
    space = load_space(path)
    prior = SimulatorPrior.build(space, "decode", load_model(REFERENCE_MODEL), get_gpu(space.cluster.gpu))
    observed = GuidedSampler(lambda: prior)._observe(optuna.load_study(study_name=f"{name}/decode",
                                                                       storage=storage))
    seen = {prior.levels[level] for points in observed.points.values() for level, *_ in points}
    assert len(seen) > 1 and seen <= set(RATES[:-1])
    assert main(["show", name, "--storage", storage, "--json"]) == 0
    front = json.loads(capsys.readouterr().out)["phases"]["decode"]["front"]
    assert front
    for point in front:
        m = point["metrics"]
        assert m["offered_rps"] in RATES  # open-loop points, keyed by their rate
        assert m["request_throughput_rps"] == pytest.approx(m["offered_rps"])  # served what was offered
        assert m["ttft_ms_p90"] <= 2000 and m["itl_ms_p90"] <= 50  # the space's SLA holds on the front


def test_open_loop_needs_its_rates(tmp_path: Path) -> None:
    space = yaml.safe_load(Path(REFERENCE_SPACE).read_text())
    space["workload"] = {"isl": 2048, "osl": 256, "arrival": "poisson"}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(space))
    with pytest.raises(ConfigError, match="request_rates"):
        load_space(path)
