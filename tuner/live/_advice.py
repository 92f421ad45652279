"""The advice a watch asks for when traffic moves: the frontier's recommendation for the new traffic.

`advise_traffic` is the ONE adapter between the watch and the frontier pipeline. Today that pipeline lives in the
`frontier` command (tuner/cli/_perf.py), so this function repeats the command's set-up and calls its helpers; when
the library's `advise(AdviseRequest)` lands (issue #50), its body becomes that one call and nothing else changes
(the watch, the service and the tests only see `AdviceRequest` and `Advice`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from tuner.errors import InfeasibleError
from tuner.frontier import PERCENTILES, AggregatedPoint, ComposedPoint
from tuner.workload import Workload


@dataclass(frozen=True)
class AdviceRequest:
    """What a watch knows: the model, the cluster's GPUs and budget, and the SLA."""

    model_path: str
    hardware: str
    max_gpus: int
    max_ttft_ms: float | None
    max_itl_ms: float | None
    percentile: str = "p90"
    mode: str = "both"  # both, disagg or agg (frontier's --mode)


@dataclass(frozen=True)
class Advice:
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


def _attainment(point: ComposedPoint | AggregatedPoint, request: AdviceRequest) -> float:
    if isinstance(point, AggregatedPoint):
        return point.instance.share_within(max_ttft_ms=request.max_ttft_ms, max_itl_ms=request.max_itl_ms)
    # PD: the prefill side's TTFT within what the decode side leaves of the bound, times the decode side's ITL
    prefill_bound = None if request.max_ttft_ms is None else max(0.0, request.max_ttft_ms - point.decode.ttft_ms_mean)
    return (point.prefill.share_within(max_ttft_ms=prefill_bound)
            * point.decode.share_within(max_itl_ms=request.max_itl_ms))


def advise_traffic(request: AdviceRequest, workload: Workload) -> Advice:
    """The frontier's recommendation for `workload` (open loop at its one rate) under the SLA: the deployment with
    the fewest GPUs that carries the rate. InfeasibleError (naming the bound or --gpus) when none does."""
    from tuner.backends.vllm import PairingContext, launch_rules, pairing_predicate
    from tuner.cli._perf import _rate_fronts, operating_deployment, recommend
    from tuner.export import RecipeContext, export_deployment
    from tuner.frontier import Constraints
    from tuner.hardware import get_gpu
    from tuner.models import load_model
    from tuner.perf import RooflineModel, candidate_topologies, default_calibration

    if request.percentile not in PERCENTILES:
        raise InfeasibleError(f"unknown percentile {request.percentile!r}", field="percentile",
                              fix="use p50, p90 or p99")
    spec = load_model(Path(request.model_path))
    gpu = get_gpu(request.hardware)
    perf = RooflineModel(spec, gpu, default_calibration(gpu.name))
    pairing = pairing_predicate(launch_rules(None), PairingContext(model=spec, architecture=gpu.architecture))
    constraints = Constraints(max_gpus=request.max_gpus, max_ttft_ms=request.max_ttft_ms,
                              max_itl_ms=request.max_itl_ms, percentile=request.percentile,  # type: ignore[arg-type]
                              pairing=pairing)
    depths = (0,)
    topologies = candidate_topologies(perf, request.max_gpus, mtp_depths=depths)
    _, fronts = _rate_fronts(perf, topologies, workload, constraints, request.mode, depths, lambda _t: None)
    pick = recommend(fronts)
    winner = pick.winner
    if winner is None:
        raise InfeasibleError("no deployment meets the SLA at this traffic", field="max_gpus",
                              fix="allow more GPUs or relax the SLA")
    context = RecipeContext(model_path=request.model_path, model_name=spec.name, gpu=gpu.name,
                            gpus_per_host=gpu.gpus_per_host, isl=workload.input_tokens.longest,
                            osl=workload.output_tokens.longest, prefix_caching=workload.prefix is not None,
                            model=spec)
    return Advice(deployment=winner.name, mode=winner.mode, num_gpus=winner.num_gpus, ttft_ms=winner.ttft_ms,
                  itl_ms=winner.itl_ms, total_tok_s_per_gpu=winner.total_tok_s_per_gpu,
                  predicted_attainment=_attainment(winner, request),
                  commands=export_deployment(operating_deployment(winner), "vllm", context))
