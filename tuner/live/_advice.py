"""The advice a watch asks for when traffic moves: the frontier's recommendation for the new traffic.

`advise_traffic` is the one adapter between the watch and the use-case layer: it asks `tuner.advise.advise` (what
`topotune frontier` and `POST /v1/advice` answer) and keeps what a watch shows of the answer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from tuner.errors import InfeasibleError, TopotuneError
from tuner.frontier import AggregatedPoint, ComposedPoint
from tuner.workload import Workload


@dataclass(frozen=True)
class WatchAdviceRequest:
    """What a watch knows: the model, the cluster's GPUs and budget, and the SLA."""

    model_path: str
    hardware: str
    max_gpus: int
    max_ttft_ms: float | None
    max_itl_ms: float | None
    percentile: str = "p90"
    mode: str = "both"  # both, disagg or agg (frontier's --mode)


# The advise request's fields under the watch's names (WatchAdviceRequest, the watch API's body)
WATCH_FIELDS: dict[str, str] = {"sla.percentile": "percentile", "sla.max_ttft_ms": "max_ttft_ms",
                                "sla.max_itl_ms": "max_itl_ms", "gpus": "max_gpus", "model": "model_path",
                                "serve.mode": "mode"}


@dataclass(frozen=True)
class WatchAdvice:
    """The recommended deployment for a traffic, what the model predicts for it, and how to start it."""

    deployment: str
    mode: str
    num_gpus: int
    ttft_ms: float  # at the request's percentile
    itl_ms: float
    total_tok_s_per_gpu: float
    predicted_attainment: float  # share of requests within the SLA, as the model predicts it
    commands: str  # the `vllm serve` commands (frontier's recommendation), never run by topotune

    def as_json(self) -> dict[str, object]:
        return asdict(self)


def _attainment(point: ComposedPoint | AggregatedPoint, request: WatchAdviceRequest) -> float:
    if isinstance(point, AggregatedPoint):
        return point.instance.share_within(max_ttft_ms=request.max_ttft_ms, max_itl_ms=request.max_itl_ms)
    # PD: the prefill side's TTFT within what the decode side leaves of the bound, times the decode side's ITL
    prefill_bound = None if request.max_ttft_ms is None else max(0.0, request.max_ttft_ms - point.decode.ttft_ms_mean)
    return (point.prefill.share_within(max_ttft_ms=prefill_bound)
            * point.decode.share_within(max_itl_ms=request.max_itl_ms))


def advise_traffic(request: WatchAdviceRequest, workload: Workload) -> WatchAdvice:
    """The library's advice (tuner.advise) for `workload` (open loop at its one rate) under the SLA: the deployment
    with the fewest GPUs that carries the rate. InfeasibleError (naming the bound or the budget) when none does."""
    from tuner.advise import AdviseRequest, ServeOptions, Sla, advise

    try:  # the SLA is checked once, by `Sla`; its errors are renamed to the watch's own fields
        answer = advise(AdviseRequest(
            model=Path(request.model_path), workload=workload, hardware=request.hardware, gpus=request.max_gpus,
            sla=Sla(max_ttft_ms=request.max_ttft_ms, max_itl_ms=request.max_itl_ms,
                    percentile=request.percentile),  # type: ignore[arg-type]
            serve=ServeOptions(mode=request.mode, max_mtp=0)))  # type: ignore[arg-type]
    except TopotuneError as exc:
        raise exc.renamed(WATCH_FIELDS) from exc
    winner = answer.recommendation.winner
    if winner is None or answer.commands is None:
        raise InfeasibleError("no deployment meets the SLA at this traffic", field="max_gpus",
                              fix="allow more GPUs or relax the SLA")
    return WatchAdvice(deployment=winner.name, mode=winner.mode, num_gpus=winner.num_gpus, ttft_ms=winner.ttft_ms,
                  itl_ms=winner.itl_ms, total_tok_s_per_gpu=winner.total_tok_s_per_gpu,
                  predicted_attainment=_attainment(winner, request), commands=answer.commands)
