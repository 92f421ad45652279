"""`topotune tune` records every finished trial into the cluster store; `topotune calibrate` without a study shows
what the store learnt (factors moved, trials, models, held-out error); the next `tune` says what it starts from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _support.paths import REFERENCE_MODEL, REFERENCE_SPACE, REPO

from tuner.cli import main

OTHER_MODEL = str(REPO / "examples" / "models" / "qwen3-235b-a22b")


def _tune(model: str, storage: str) -> int:
    return main(["tune", model, "--space", str(REFERENCE_SPACE), "--trials", "3", "--sampler", "random",
                 "--executor", "local", "--storage", storage, "--noise", "0.05", "--phase", "decode", "--json"])


def test_studies_feed_the_cluster_store_and_calibrate_shows_it(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    storage = f"sqlite:///{tmp_path / 'studies.db'}"
    assert main(["calibrate", "--storage", storage]) == 2  # nothing recorded yet: says so, names the flag
    assert "--cluster" in capsys.readouterr().err
    assert _tune(str(REFERENCE_MODEL), storage) == 0
    assert _tune(OTHER_MODEL, storage) == 0
    capsys.readouterr()
    assert main(["calibrate", "--storage", storage, "--json"]) == 0
    (cluster,) = json.loads(capsys.readouterr().out)["clusters"]
    assert cluster["cluster"] == "gb300-nvlink72+infiniband" and cluster["gpu_class"] == "gb300"
    assert cluster["runs"] == 6 and len(cluster["models"]) == 2  # 3 launched trials of each model
    assert cluster["held_out"]["method"] == "leave-one-model-out" and cluster["held_out"]["models"] == 2
    assert set(cluster["factors"]) >= {"request_step_us"}  # shared: carried to every model
    assert {f["factor"] for f in cluster["kernel_factors"]} >= {"hbm_efficiency"}  # per group of kernel kinds
    # the second model's study started from the first's: the guard judged its prior on its 3 trials
    (verdict,) = cluster["guards"]
    assert verdict["model"] == "qwen3-235b-a22b" and verdict["trials"] == 3 and verdict["checks"]
    assert main(["calibrate", "--storage", storage]) == 0
    text = capsys.readouterr().out
    assert "learnt from 6 trials of 2 model(s)" in text and "held-out error (leave-one-model-out" in text
    assert "moved" in text and "kernel factors" in text
    assert "transfer guard, study" in text and "qwen3-235b-a22b:" in text
    assert main(["calibrate", "--storage", storage, "--cluster", "elsewhere"]) == 2
    assert "gb300-nvlink72+infiniband" in capsys.readouterr().err  # names the clusters it has
