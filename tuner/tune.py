"""`tune`: run (or resume) a campaign, one typed request in: the model, the space, the backend, an SLA override and
the study's budget. `topotune tune` and the service build a `TuneRequest` and call `tune`; the service stores the
request itself (JSON) and runs it again from storage on resume."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, ValidationError, model_serializer

from tuner.backends import BackendConfig, SimulatedConfig
from tuner.errors import config_error
from tuner.metrics import Percentile
from tuner.space import ALL_PHASES, Phase, SearchSpace, StudyConstraints

if TYPE_CHECKING:
    from tuner.executors import Executor
    from tuner.settings import TunerSettings
    from tuner.study import CampaignResult, StopSignal
    from tuner.study._events import ProgressCallback


class SlaOverride(BaseModel):
    """SLA fields replacing the space's constraints, field by field: a field given replaces the space's (None
    lifts that bound), a field not given keeps it. Stored as the fields given only."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    max_ttft_ms: float | None = Field(None, gt=0)
    max_itl_ms: float | None = Field(None, gt=0)
    percentile: Percentile | None = None
    min_tok_s_per_user: float | None = Field(None, gt=0)
    min_accuracy: float | None = Field(None, ge=0, le=1)

    @model_serializer(mode="wrap")
    def _given_only(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if k in self.model_fields_set}

    def apply(self, constraints: StudyConstraints) -> StudyConstraints:
        given = self.model_dump()
        if given.get("percentile", "") is None:  # percentile cannot be lifted: None keeps the space's
            given.pop("percentile")
        return StudyConstraints.model_validate({**constraints.model_dump(), **given}) if given else constraints


class TuneRequest(BaseModel):
    """A campaign to run: `phases` None runs every phase the space defines."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_path: str = Field(min_length=1)
    space: SearchSpace
    backend: BackendConfig = Field(default_factory=SimulatedConfig)
    sla: SlaOverride = Field(default_factory=SlaOverride)
    trials: int = Field(40, ge=1, description="launched trials per phase (screened-out configs are free)")
    sampler: str = "auto"
    seed: int = Field(0, ge=0)
    warm_start: bool = True
    phases: tuple[Phase, ...] | None = None
    retry_risks: bool = False

    @classmethod
    def create(cls, **fields: Any) -> TuneRequest:
        """Build with a one-line error naming the request's field (`trials`, `sla.percentile`, ...)."""
        try:
            return cls(**fields)
        except ValidationError as exc:
            raise config_error(exc) from None

    @property
    def constrained_space(self) -> SearchSpace:
        """The space with the SLA override in place of its constraints."""
        constraints = self.sla.apply(self.space.constraints)
        return self.space if constraints == self.space.constraints else \
            self.space.model_copy(update={"constraints": constraints})

    @property
    def run_phases(self) -> tuple[str, ...]:
        return tuple(self.phases) if self.phases else ALL_PHASES


def tune(request: TuneRequest, settings: TunerSettings, *, executor: str | Executor = "ray", max_parallel: int = 1,
         on_event: ProgressCallback | None = None, stop: StopSignal | None = None, name: str = "") -> CampaignResult:
    """Run the request's campaign on `executor` (a kind, built here from the request's backend and shut down after,
    or an executor the caller owns) and return its result. Storage and artifacts come from `settings`."""
    from tuner.executors import make_executor
    from tuner.study import Campaign, StopSignal, TuneOptions

    space = request.constrained_space
    owned = isinstance(executor, str)
    runner = make_executor(executor, settings=settings, cluster=space.cluster, backend=request.backend,
                           max_parallel=max_parallel) if isinstance(executor, str) else executor
    try:
        campaign = Campaign(
            model_path=request.model_path, space=space, backend_name=request.backend.kind, executor=runner,
            storage_url=settings.storage_url,
            options=TuneOptions(trials=request.trials, sampler=request.sampler, seed=request.seed,
                                warm_start=request.warm_start),
            artifacts_dir=settings.artifacts_dir, on_event=on_event or (lambda _e: None), stop=stop or StopSignal(),
            phases=request.run_phases, name=name, retry_risks=request.retry_risks)
        return campaign.run()
    finally:
        if owned:
            runner.shutdown()

