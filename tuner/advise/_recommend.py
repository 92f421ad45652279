"""The answer under the SLA: the best deployment of each mode, the winner and its margin, and the deployment to
run at its operating point; each point as the JSON `frontier --json` and `POST /v1/advice` print."""

from __future__ import annotations

from dataclasses import dataclass

from tuner.advise._fronts import Fronts
from tuner.deployment import Deployment
from tuner.frontier import AggregatedPoint, ComposedPoint, Constraints
from tuner.operating_point import at_running_requests

Point = ComposedPoint | AggregatedPoint

# Two modes within 1% of each other's tok/s/GPU: a tie, not a win (the model's own error is larger).
TIE_MARGIN = 1.01


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
    def tie(self) -> bool:
        """Both modes within TIE_MARGIN of each other's tok/s/GPU: a tie, not a win."""
        return self.margin is not None and self.margin < TIE_MARGIN

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
    running = (point.instance if isinstance(point, AggregatedPoint) else point.decode).running_requests
    return at_running_requests(point.deployment, running)


def point_clients(point: Point) -> int:
    """The clients a closed-loop point's benchmark runs (every instance's concurrency)."""
    if isinstance(point, ComposedPoint):
        return point.num_decode * point.decode.concurrency
    return point.num_instances * point.instance.concurrency


def why_it_wins(pick: Recommendation, c: Constraints) -> str:
    """Why the winner wins, in a platform engineer's words: which side of the work binds and what the winner does
    about it, with the figures the tables print."""
    w = pick.winner
    if w is None:
        return ""
    itl = f"ITL {w.itl_ms:.1f} ms ({c.percentile})"
    bound = c.max_itl_for_users_ms
    floor = bound is not None and bound != c.max_itl_ms  # the per-user speed floor binds, not the ITL bound
    limit = (f" under the {bound:g} ms limit" + (f" (1000 / the {c.min_tok_s_per_user:g} tok/s/user floor)" if floor
                                                 else "")) if bound else ""
    other: Point | None
    if isinstance(w, ComposedPoint):
        per_rank = w.decode.running_requests / max(1, w.decode_topology.dp)
        mtp = f" with MTP{w.decode_topology.mtp}" if w.decode_topology.mtp else ""
        text = (f"decode-bound: {itl}{limit} holds at {per_rank:.0f} running requests per decode rank only on a "
                f"dedicated decode {w.decode_topology.name}{mtp}; {w.num_prefill} prefill "
                f"{w.prefill_topology.name} instance(s) take the prompts, so no prompt stalls a decode step")
        other, versus = pick.aggregated, "aggregated {}, whose decode steps wait for chunked prompts, reaches"
    else:
        text = (f"every GPU serves prompts and answers: {w.num_instances} x {w.topology.name} replicas keep "
                f"{itl}{limit} with chunked prefill at {w.instance.concurrency} requests each, and no GPU waits for "
                f"KV transfers")
        other, versus = pick.disaggregated, "splitting prefill from decode, {}, leaves one side's GPUs short of work:"
    if other is not None:
        text += f" ({versus.format(other.name)} {other.total_tok_s_per_gpu:,.0f} tok/s/GPU)"
    return text


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
