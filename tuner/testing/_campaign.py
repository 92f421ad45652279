"""A small campaign over any executor, and its launched trials counted by outcome (fault-injection checks)."""

from __future__ import annotations

from pathlib import Path

from tuner.executors import Executor
from tuner.space import load_space
from tuner.study import Campaign, TrialKind, TuneOptions, read_trials
from tuner.study import open_storage as _open_storage


def small_campaign(*, model_path: str | Path, space_path: str | Path, executor: Executor, storage_url: str,
                   artifacts_dir: Path, trials: int, num_gpus: int, gpus_per_host: int, seed: int = 0) -> Campaign:
    """The given model and space, decode phase only, on a cluster of num_gpus: a Campaign ready to run()."""
    space = load_space(Path(space_path))
    space = space.model_copy(update={"cluster": space.cluster.model_copy(
        update={"num_gpus": num_gpus, "gpus_per_host": gpus_per_host})})
    options = TuneOptions(trials=trials, sampler="tpe", seed=seed, warm_start=False, heartbeat_s=1.0,
                          trial_timeout_s=120.0)
    return Campaign(model_path=str(model_path), space=space, backend_name="simulated", executor=executor,
                    storage_url=storage_url, options=options, artifacts_dir=artifacts_dir, phases=("decode",))


def study_counts(storage_url: str, study_name: str) -> dict[str, int]:
    """Launched (sampled) trials by state ("complete", "running", "fail_<outcome>"), from the storage."""
    import optuna

    study = optuna.load_study(study_name=study_name, storage=_open_storage(storage_url))
    counts: dict[str, int] = {}
    for r in read_trials(study):
        if r.kind is not TrialKind.SAMPLED:
            continue
        key = r.state.name.lower()
        if r.state.name == "FAIL":
            key = f"fail_{r.attrs.outcome or ''}"
        counts[key] = counts.get(key, 0) + 1
    return counts
