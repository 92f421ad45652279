"""`topotune logs STUDY TRIAL`: print a trial's logs from its artifacts folder (recorded in the study)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tuner.cli._app import app, console
from tuner.errors import ConfigError
from tuner.trial_logs import trial_log_files


def trial_artifacts_dir(storage_url: str, study: str, trial: int) -> Path:
    """The folder a trial's logs went to, from its user attr "artifacts_dir"; errors name what is missing."""
    import optuna

    from tuner.study import TrialRecord, open_storage

    storage = open_storage(storage_url)
    names = {s.study_name for s in optuna.get_all_study_summaries(storage, include_best_trial=False)}
    if study not in names:
        raise ConfigError(f"no study named {study!r} in {storage_url}", field="STUDY",
                          fix="give a full phase study name from `topotune studies`, e.g. model@gb300/8192x1024/decode")
    trials = optuna.load_study(study_name=study, storage=storage).get_trials(deepcopy=False)
    found = next((t for t in trials if t.number == trial), None)
    if found is None:
        raise ConfigError(f"study {study!r} has no trial {trial} (it has {len(trials)})", field="TRIAL",
                          fix="use a trial number shown by `topotune show`")
    record = TrialRecord.read(found)
    if record.is_level:  # a load level an old study stored as its own trial: its run's logs are its trial's
        found = next((t for t in trials if t.number == record.trial), found)
        record = TrialRecord.read(found)
    folder = record.attrs.artifacts_dir
    if not folder:
        raise ConfigError(f"trial {trial} of {study!r} has no artifacts_dir (screened out, or never launched)",
                          field="artifacts_dir", fix="pick a launched trial")
    path = Path(folder)
    if not path.is_dir():
        raise ConfigError(f"the artifacts folder of trial {trial} does not exist: {path}", field="artifacts_dir",
                          fix="run `topotune logs` on the machine (or shared disk) where the trial ran")
    return path


@app.command("logs")
def logs_command(
    study: Annotated[str, typer.Argument(help="full phase study name, e.g. model@gb300/8192x1024/decode")],
    trial: Annotated[int, typer.Argument(help="trial number")],
    storage: Annotated[str | None, typer.Option("--storage", help="Optuna storage URL (default: data dir's)")] = None,
    tail: Annotated[int, typer.Option("--tail", help="last N lines per file (0: all)")] = 0,
) -> None:
    """Print a trial's stdout/stderr, executor record and backend logs."""
    from tuner.settings import TunerSettings

    folder = trial_artifacts_dir(storage or TunerSettings().storage_url, study, trial)
    files = trial_log_files(folder)
    if not files:
        console.print(f"no log files in {folder}")
        return
    for path in files:
        text = path.read_text(errors="replace")
        if tail > 0:
            text = "\n".join(text.splitlines()[-tail:])
        console.rule(str(path.relative_to(folder)))
        console.print(text, markup=False, highlight=False, soft_wrap=True)
