"""`reverify`: re-measure a stored study's front on what the cluster runs now, one typed request in. The backend is
the study's own kind on its cluster (built by `backend_config`, the same builder `tune` requests use), with the
request's simulated noise or emulated vLLM version. `topotune reverify` and the service build a `ReverifyRequest`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tuner.backends import SimulatedConfig, VllmConfig, backend_config
from tuner.errors import ConfigError, config_error

if TYPE_CHECKING:
    from tuner.settings import TunerSettings
    from tuner.study import ReverifyReport


class ReverifyRequest(BaseModel):
    """Which study, how many configs and runs, the noise test, and (simulated studies) the emulated upgrade."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    study: str = Field(min_length=1, description="the campaign's name")
    budget: int = Field(8, ge=1, le=1000, description="configs re-measured: recipe configs first, then the front")
    repeats: int = Field(3, ge=1, le=50, description="runs per config (the noise test's sample)")
    reopen: bool = True
    noise_floor: float = Field(0.03, gt=0, lt=1, description="least log-sd of one run's throughput")
    alpha: float = Field(0.01, gt=0, lt=0.5, description="two-sided significance of a reported change")
    emulate_vllm: str | None = Field(None, description="simulated study: answer as this vLLM version")
    noise: float = Field(0.0, ge=0, lt=1, description="simulated study: seeded run-to-run noise")

    @classmethod
    def create(cls, **fields: Any) -> ReverifyRequest:
        """Build with a one-line error naming the request's field (`budget`, `alpha`, ...)."""
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise config_error(exc) from None

    def backend(self, kind: str, *, gpu: str) -> SimulatedConfig | VllmConfig:
        """The stored study's backend kind on its cluster, with this request's noise and emulated version."""
        if kind not in ("simulated", "vllm"):
            raise ConfigError(f"the study ran on backend {kind!r}, which cannot be re-run", field="study",
                              fix="re-verify a study tuned on the simulated or the vllm backend")
        return backend_config(kind, gpu=gpu, noise=self.noise, emulate_vllm=self.emulate_vllm)


def reverify(request: ReverifyRequest, settings: TunerSettings, *, executor: str = "local",
             max_parallel: int = 1) -> ReverifyReport:
    """Re-measure the study's front through an executor of `executor` kind built for its backend, store the new
    runs and the verdicts, and return the report."""
    from tuner.executors import make_executor
    from tuner.study import NoiseTest, ReverifyOptions, reverify_study, study_space

    options = ReverifyOptions(budget=request.budget, repeats=request.repeats, reopen=request.reopen,
                              test=NoiseTest(noise_floor=request.noise_floor, alpha=request.alpha))
    space, meta = study_space(settings.storage_url, request.study)
    runner = make_executor(executor, settings=settings, cluster=space.cluster,
                           backend=request.backend(meta.backend, gpu=space.cluster.gpu), max_parallel=max_parallel)
    try:
        return reverify_study(settings.storage_url, request.study, runner, options,
                              artifacts_dir=settings.artifacts_dir)
    finally:
        runner.shutdown()
