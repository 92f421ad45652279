"""The answer under the SLA: the best deployment of each mode, the winner and its margin, and the deployment to
run at its operating point; each point as the JSON `frontier --json` and `POST /v1/advice` print."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tuner.advise._fronts import Fronts
from tuner.deployment import Deployment
from tuner.frontier import AggregatedPoint, ComposedPoint

Point = ComposedPoint | AggregatedPoint


@dataclass(frozen=True)
class Recommendation:
    """The best deployment of each mode under the SLA (most total tok/s/GPU) and which one wins, by how much."""

    disaggregated: ComposedPoint | None
    aggregated: AggregatedPoint | None

    @property
    def winner(self) -> Point | None:
        candidates = [p for p in (self.disaggregated, self.aggregated) if p is not None]
        return max(candidates, key=lambda p: p.total_tok_s_per_gpu) if candidates else None

    @property
    def margin(self) -> float | None:
        """Winner's tok/s/GPU over the other mode's best (None when one mode has no point)."""
        if self.disaggregated is None or self.aggregated is None:
            return None
        a, b = self.disaggregated.total_tok_s_per_gpu, self.aggregated.total_tok_s_per_gpu
        return max(a, b) / min(a, b) if min(a, b) > 0 else None

    def as_json(self) -> dict[str, object]:
        w = self.winner
        return {"winner": None if w is None else w.mode, "winner_num_gpus": None if w is None else w.num_gpus,
                "margin": self.margin,
                "disaggregated": None if self.disaggregated is None else point_json(self.disaggregated),
                "aggregated": None if self.aggregated is None else aggregated_json(self.aggregated)}


def recommend(fronts: Fronts) -> Recommendation:
    """Every front point already meets the SLA and the per-user floor: the most tok/s/GPU of each mode wins."""
    best_pd = max(fronts.front, key=lambda p: p.total_tok_s_per_gpu, default=None)
    best_agg = max(fronts.aggregated, key=lambda p: p.total_tok_s_per_gpu, default=None)
    return Recommendation(best_pd, best_agg)


def operating_deployment(point: Point) -> Deployment:
    """The deployment with --max-num-seqs at the point's running requests per DP rank: vLLM then admits no more
    than the batch that holds the SLA (the rest wait in the router's and the server's queues)."""
    serving = point.topology if isinstance(point, AggregatedPoint) else point.decode_topology
    running = (point.instance if isinstance(point, AggregatedPoint) else point.decode).running_requests
    per_rank = max(1, math.ceil(running / serving.dp - 1e-9))
    return point.deployment.with_decode_seqs(min(serving.max_num_seqs, per_rank))


def _rates_per_instance(**rates: float | None) -> dict[str, float]:
    """Open loop: the request rate each instance is offered (its side's share of the whole rate)."""
    return {k: round(v, 4) for k, v in rates.items() if v is not None}


def point_json(p: ComposedPoint) -> dict[str, object]:
    """A PD deployment of the front, as `frontier --json` prints it."""
    return {"deployment": p.name, "num_gpus": p.num_gpus, "prefill_topology": p.prefill_topology.name,
            "num_prefill": p.num_prefill, "prefill_concurrency": p.prefill.concurrency,
            "decode_topology": p.decode_topology.name, "decode_mtp": p.decode_topology.mtp,
            "num_decode": p.num_decode, "decode_concurrency": p.decode.concurrency,
            "total_tok_s_per_gpu": round(p.total_tok_s_per_gpu, 1),
            "output_tok_s_per_gpu": round(p.output_tok_s_per_gpu, 1), "tok_s_per_user": round(p.tok_s_per_user, 2),
            "ttft_ms": round(p.ttft_ms, 1), "itl_ms": round(p.itl_ms, 3), **_rates_per_instance(
                prefill_rps_per_instance=p.prefill.offered_rps, decode_rps_per_instance=p.decode.offered_rps)}


def aggregated_json(p: AggregatedPoint) -> dict[str, object]:
    """An aggregated deployment of the front, as `frontier --json` prints it."""
    return {"deployment": p.name, "num_gpus": p.num_gpus, "topology": p.topology.name, "mtp": p.topology.mtp,
            "num_instances": p.num_instances, "concurrency_per_instance": p.concurrency_per_instance,
            "total_tok_s_per_gpu": round(p.total_tok_s_per_gpu, 1),
            "output_tok_s_per_gpu": round(p.output_tok_s_per_gpu, 1), "tok_s_per_user": round(p.tok_s_per_user, 2),
            "ttft_ms": round(p.ttft_ms, 1), "itl_ms": round(p.itl_ms, 3),
            **_rates_per_instance(rps_per_instance=p.instance.offered_rps)}
