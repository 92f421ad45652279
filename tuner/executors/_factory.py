"""Executors by name, for the CLI and the API."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tuner.errors import ConfigError
from tuner.executors._base import Executor
from tuner.executors._local import LocalExecutor

if TYPE_CHECKING:
    from tuner.backends import SimulatedConfig, VllmConfig
    from tuner.settings import TunerSettings
    from tuner.space import ClusterSpec


def make_executor(kind: str, *, settings: TunerSettings, cluster: ClusterSpec, backend: SimulatedConfig | VllmConfig,
                  max_parallel: int) -> Executor:
    """`local`: threads in this process; `ray`: a Ray cluster (RAY_ADDRESS, or a local one started here). Either
    builds `backend` by its kind and options (a Ray worker from the same two, picklable)."""
    from tuner.backends import make_backend

    if kind == "local":
        return LocalExecutor(make_backend(backend.kind, **backend.options()), max_parallel=max_parallel,
                             num_gpus=cluster.num_gpus)
    if kind == "ray":
        from tuner.executors._ray import RayExecutor

        return RayExecutor.start(settings, cluster, backend_name=backend.kind,  # type: ignore[attr-defined]
                                 backend_options=backend.options(), max_parallel=max_parallel)
    raise ConfigError(f"unknown executor {kind!r}", field="--executor", fix="use ray or local")
