"""`topotune logs STUDY TRIAL`: prints the trial's logs; clear errors naming the missing field."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from tuner.cli import main

STUDY = "m@gb300/8192x1024/decode"


@pytest.fixture
def storage(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'logs.db'}"
    study = optuna.create_study(study_name=STUDY, storage=url, directions=["maximize", "maximize"])
    folder = tmp_path / "art" / "trial-0000"
    (folder / "logs").mkdir(parents=True)
    (folder / "trial.log").write_text("[topotune] trial m#0 attempt 1\nhello from the runner\n")
    (folder / "executor.json").write_text('{"attempts": 1}')
    (folder / "logs" / "decode-0.log").write_text("INFO vllm serve started\n")
    launched = study.ask()
    launched.set_user_attr("artifacts_dir", str(folder))
    study.tell(launched, [1.0, 1.0])
    study.tell(study.ask(), [0.0, 0.0])  # trial 1: screened, no folder
    gone = study.ask()
    gone.set_user_attr("artifacts_dir", str(tmp_path / "missing"))
    study.tell(gone, [0.0, 0.0])
    return url


def test_prints_runner_output_executor_record_and_backend_logs(storage: str, capsys) -> None:
    assert main(["logs", STUDY, "0", "--storage", storage]) == 0
    out = capsys.readouterr().out
    assert out.index("hello from the runner") < out.index('"attempts": 1') < out.index("vllm serve started")
    assert "logs/decode-0.log" in out


@pytest.mark.parametrize(("study", "trial", "message"), [
    ("nope@gb300/1x1/decode", "0", "STUDY: no study named"),
    (STUDY, "7", "TRIAL: study 'm@gb300/8192x1024/decode' has no trial 7"),
    (STUDY, "1", "artifacts_dir: trial 1 of"),
    (STUDY, "2", "artifacts_dir: the artifacts folder of trial 2 does not exist"),
])
def test_errors_name_the_field(storage: str, capsys, study: str, trial: str, message: str) -> None:
    assert main(["logs", study, trial, "--storage", storage]) == 2
    assert message in capsys.readouterr().err.replace("\n", "")
