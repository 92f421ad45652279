"""`advise`: the deployment to run for a model, hardware, traffic and SLA, with both fronts it was chosen from.
`topotune frontier`, `POST /v1/advice` and the service's pages all call it."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property

from pydantic import ValidationError

from tuner.advise._fronts import Fronts, NoProgress, ReplayHint, SweepProgress, closed_loop_fronts, rate_fronts
from tuner.advise._recommend import (
    Point,
    Recommendation,
    aggregated_json,
    operating_deployment,
    point_clients,
    point_json,
    recommend,
    why_it_wins,
)
from tuner.advise._request import AdviseRequest, Sla
from tuner.advise._verify import (
    ReplayCheck,
    ReplayDecision,
    auto_replay_skipped,
    offered_arrival,
    replay_hint,
    replay_verified,
)
from tuner.deployment import Deployment
from tuner.errors import ConfigError
from tuner.export import RecipeContext, export_deployment, simulated_label
from tuner.frontier import Constraints, binding_bound
from tuner.hardware import GpuSpec, get_gpu
from tuner.models import ModelSpec, load_model
from tuner.operating_point import RouterChoice, choose_router_policy
from tuner.perf import Calibration, RooflineModel, calibrated, candidate_topologies
from tuner.replay import Sla as ReplaySla
from tuner.router import RouterPolicy
from tuner.topology import Topology, knob_default
from tuner.workload import Workload, workload_error


@dataclass(frozen=True)
class Advice:
    """The answer: both fronts, the recommendation and the deployment to run at its operating point, with what
    they were computed for (the traffic as offered, the limits, the pairing rules, the calibration)."""

    request: AdviseRequest
    model: ModelSpec = field(repr=False)
    gpu: GpuSpec = field(repr=False)
    traffic: Workload
    constraints: Constraints
    pairing_rules: str  # "vLLM 0.32.0 NIXL rules": the pairs vLLM refuses were not composed
    vllm_version: str  # the vLLM whose rules the plan follows ("0.32.0")
    calibration: Calibration
    num_topologies: int
    num_instance_points: int
    fronts: Fronts
    recommendation: Recommendation
    elapsed_s: float
    # replay verification (tuner/replay), with `replay_verify`: the best deployments replayed, the first within the
    # SLA decides the deployment to run
    verification: ReplayDecision | None = None
    replay_skipped: str | None = None  # why the replay did not decide by default (a closed loop past its bound)

    @property
    def offered_rps(self) -> float | None:
        """Open loop: the one rate every deployment carries; None for a closed loop."""
        return self.traffic.request_rates[0] if self.traffic.open_loop else None

    @property
    def operating_deployment(self) -> Deployment | None:
        """The winner with --max-num-seqs at its operating point; None when nothing meets the limits."""
        if self.verification is not None:
            choice = self.verification.choice
            return None if choice is None else choice.candidate.deployment
        winner = self.recommendation.winner
        return None if winner is None else operating_deployment(winner)

    @property
    def setting(self) -> str:
        """What was asked, in one line: the model, the budget, the traffic and the offered rate."""
        rate = self.offered_rps
        return (f"{self.model.name} on up to {self.request.gpus} x {self.gpu.name}, "
                f"{self.traffic.describe(load=False)}"
                + (f", {rate:.4g} req/s offered ({self.traffic.arrival} arrivals)" if rate is not None else ""))

    @property
    def title(self) -> str:
        """The chart's and the PD table's title."""
        rate = self.offered_rps
        return (f"{self.model.name} on up to {self.request.gpus} x {self.gpu.name}, {self.traffic.isl}/"
                f"{self.traffic.osl}" + (f" at {rate:.4g} req/s" if rate is not None else "")
                + f": combined PD Pareto front ({self.num_topologies} topologies, {self.num_instance_points} "
                  f"instance points, {len(self.fronts.points)} deployments)")

    @property
    def model_path(self) -> str:
        """The model's path as asked (its name when the request carried a model already read)."""
        model = self.request.model
        return model.name if isinstance(model, ModelSpec) else str(model)

    @property
    def decided_by(self) -> str:
        """Which model decided the answer: "replay" (request by request through vLLM's scheduler) or "steady-state
        model" (the analytic fronts alone: no SLA, or `replay_verify` off)."""
        if self.verification is not None:
            return "replay"
        return "steady-state model" + (f" ({self.replay_skipped})" if self.replay_skipped else "")

    @property
    def recommended_num_gpus(self) -> int | None:
        """The GPUs of the deployment the answer runs (the replay's choice when it decided)."""
        if self.verification is not None:
            choice = self.verification.choice
            return None if choice is None else choice.report.num_gpus
        winner = self.recommendation.winner
        return None if winner is None else winner.num_gpus

    def _replay_reason(self, limits: str) -> str:
        decision, rate = self.verification, self.offered_rps
        assert decision is not None
        choice = decision.choice
        if choice is None:
            hint = (f"; it shows {decision.hint_deployment} on {decision.hint_gpus} GPUs carrying it"
                    if decision.hint_gpus else "")
            return (f"the replay shows no deployment it checked within {limits} on up to {self.request.gpus} GPUs"
                    + hint)
        r, pct = choice.report, self.request.sla.percentile
        mode = "disaggregated" if choice.candidate.deployment.is_disaggregated else "aggregated"
        replayed = (f"replayed: TTFT {r.ttft_ms.at(pct):,.0f} ms, ITL {r.itl_ms.at(pct):.1f} ms at {pct}, "
                    f"{r.sla_attainment:.0%} of requests within the SLA")
        if rate is not None:
            return (f"{mode} {r.deployment} carries {rate:.4g} req/s under {limits} on the fewest GPUs the replay "
                    f"shows doing it ({r.num_gpus} of up to {self.request.gpus}; {replayed})")
        return (f"{mode} {r.deployment} gives the most tok/s/GPU the replay shows within {limits} "
                f"({r.total_tok_s_per_gpu:,.0f} at {choice.candidate.concurrency} clients; {replayed})")

    @property
    def reason(self) -> str:
        """Why the winner, in one line: what it is best at, under which limits, by how much, and what binds."""
        pick, sla, rate = self.recommendation, self.request.sla, self.offered_rps
        if self.verification is not None:
            return self._replay_reason(f"{sla.describe()} at {sla.percentile}")
        winner = pick.winner
        limits = f"{sla.describe()} at {sla.percentile}"
        if winner is None:
            return f"no deployment meets {limits}"
        other = "aggregated" if winner.mode == "disaggregated" else "disaggregated"
        if rate is not None:
            why = (f"{winner.mode} {winner.name} carries {rate:.4g} req/s under {limits} on the fewest GPUs "
                   f"({winner.num_gpus} of up to {self.request.gpus})")
            margin = f"; the best {other} deployment needs x{pick.margin:.2f} its GPUs" if pick.margin else ""
        else:
            why = (f"{winner.mode} {winner.name} gives the most tok/s/GPU ({winner.total_tok_s_per_gpu:,.0f}) of "
                   f"every deployment of up to {self.request.gpus} GPUs under {limits}")
            margin = f", x{pick.margin:.2f} the best {other} one" if pick.margin else ""
        if pick.margin is None:
            margin = f"; no {other} deployment meets the limits" if self.request.serve.mode == "both" else ""
        binds = binding_bound(winner.ttft_ms, winner.itl_ms, max_ttft_ms=sla.max_ttft_ms,
                              max_itl_ms=self.constraints.max_itl_for_users_ms)
        return why + margin + (f"; {binds}" if binds else "")

    @property
    def why(self) -> str:
        """Why the winner wins, in a platform engineer's words (which side binds and what the winner does)."""
        return why_it_wins(self.recommendation, self.constraints)

    @cached_property
    def recipe_context(self) -> RecipeContext:
        """What the recommendation deploys (#46: its operating point): the traffic's typical request, its longest
        for --max-model-len, prefix caching and the router policy its prefixes call for."""
        weights = self.request.weights
        context = RecipeContext.for_traffic(
            self.traffic, model_path=weights or self.model_path, model_name=self.model.name, gpu=self.gpu.name,
            gpus_per_host=self.gpu.gpus_per_host,
            model=self.model if weights is None or isinstance(self.request.model, ModelSpec) else None,
            vllm_version=self.vllm_version, verified_on=simulated_label(f"vLLM {self.vllm_version}"))
        policy = self.verification.router if self.verification is not None else context.router.policy
        if policy != context.router.policy:  # the replay's knob search kept the other policy
            return replace(context, router=RouterChoice(policy=policy, reason=(
                f"the replay shows {policy} carrying the traffic on fewer GPUs or at more tok/s/GPU than "
                f"{context.router.policy} (searched by `frontier`)")))
        return context

    def operating_point(self, point: Point) -> dict[str, object]:
        """What `plan --from` / `export --from` deploy for a front point; its benchmark runs the point's clients
        (closed loop; an open-loop point's load is its rate, in the JSON beside it)."""
        concurrency = () if self.offered_rps is not None else (point_clients(point),)
        return self.recipe_context.operating_point(operating_deployment(point), "frontier",
                                                   concurrency=concurrency).as_json()

    def recommended_point(self) -> dict[str, object] | None:
        """The operating point the recommendation deploys: the replay's choice when it verified the front (what
        `commands` runs), else the analytic winner's; None when nothing meets the limits."""
        if self.verification is not None:
            choice = self.verification.choice
            if choice is None:
                return None
            clients = choice.candidate.concurrency
            concurrency = () if self.offered_rps is not None or clients is None else (clients,)
            return self.recipe_context.operating_point(choice.candidate.deployment, "frontier (replay-verified)",
                                                       concurrency=concurrency).as_json()
        winner = self.recommendation.winner
        return None if winner is None else self.operating_point(winner)

    @cached_property
    def commands(self) -> str | None:
        """The `vllm serve` commands of the operating deployment (None when nothing meets the limits)."""
        deployment = self.operating_deployment
        return None if deployment is None else export_deployment(deployment, "vllm", self.recipe_context)

    def _recommendation_json(self) -> dict[str, object]:
        """The analytic best of each mode and, when the replay decided, the winner it kept (mode and GPUs)."""
        body = {**self.recommendation.as_json(), "why": self.why, "tie": self.recommendation.tie,
                "operating_point": self.recommended_point(), "decided_by": self.decided_by}
        if self.verification is not None:
            choice = self.verification.choice
            body["winner"] = None if choice is None else (
                "disaggregated" if choice.candidate.deployment.is_disaggregated else "aggregated")
            body["winner_num_gpus"] = self.recommended_num_gpus
        return body

    def as_json(self) -> dict[str, object]:
        """What `topotune frontier --json` prints; its `recommendation` is what `POST /v1/advice` answers."""
        traffic, sla, rate = self.traffic, self.request.sla, self.offered_rps
        load: dict[str, object] = {}
        if rate is not None:
            load = {"offered_rps": rate, "arrival": traffic.arrival,
                    "offered_tok_s": round(rate * (traffic.isl + traffic.osl), 1)}
        fronts = self.fronts
        return {"model": self.model.name, "gpu": self.gpu.name, "gpus": self.request.gpus, "isl": traffic.isl,
                "osl": traffic.osl, "mode": self.request.serve.mode, "workload": traffic.describe(), **load,
                "constraints": {"max_ttft_ms": sla.max_ttft_ms, "max_itl_ms": sla.max_itl_ms,
                                "percentile": sla.percentile, "min_tok_s_per_user": sla.min_tok_s_user,
                                "pairing": self.pairing_rules},
                "recommendation": self._recommendation_json(),
                "calibration": self.calibration.model_dump(), "num_topologies": self.num_topologies,
                "num_instance_points": self.num_instance_points, "num_deployments": len(fronts.points),
                "elapsed_s": round(self.elapsed_s, 3),
                "front": [{**point_json(p), "operating_point": self.operating_point(p)}
                          for p in reversed(fronts.front)],
                "aggregated_front": [{**aggregated_json(p), "operating_point": self.operating_point(p)}
                                     for p in reversed(fronts.aggregated)],
                "winners": [asdict(w) for w in fronts.winners],
                **({"replay_verification": self.verification.as_json()} if self.verification is not None else {})}


def advise(request: AdviseRequest, *, progress: SweepProgress | None = None) -> Advice:
    """Sweep every candidate topology as PD prefill/decode and as aggregated instances, compose both fronts under
    the SLA and recommend. Raises ConfigError / InfeasibleError naming the request's field (`gpus`,
    `sla.max_ttft_ms`, ...) and what would be enough."""
    started = time.perf_counter()
    progress = progress or NoProgress()
    traffic = offered_traffic(request)
    spec = request.model if isinstance(request.model, ModelSpec) else load_model(request.model)
    gpu = get_gpu(request.hardware, request.hardware_file)
    perf = RooflineModel(spec, gpu, calibrated(gpu.name, request.calibration))
    from tuner.backends.vllm import PairingContext, launch_rules, pairing_predicate

    rules = launch_rules(request.serve.vllm_version)
    pairing = pairing_predicate(rules, PairingContext(model=spec, architecture=gpu.architecture))
    sla = request.sla
    constraints = Constraints(max_gpus=request.gpus, max_ttft_ms=sla.max_ttft_ms, max_itl_ms=sla.max_itl_ms,
                              min_tok_s_per_user=sla.min_tok_s_user, percentile=sla.percentile, pairing=pairing)
    depths = tuple(range(request.serve.max_mtp + 1)) if spec.num_mtp_layers else (0,)
    engine = request.serve.engine()
    Topology.create(**engine)  # one clear message for bad engine settings
    topologies = candidate_topologies(perf, request.gpus, mtp_depths=depths, **engine)
    if not topologies:
        raise ConfigError(f"no topology of up to {request.gpus} GPUs is valid for {spec.name}", field="gpus",
                          fix="allow more GPUs")
    serving = request.serve.mode
    progress.start(len(topologies))
    decides = request.replay_decides
    router = choose_router_policy(traffic).policy  # the policy the operating point deploys
    if traffic.open_loop:
        hint = _replay_hint(perf, traffic, sla, router) if decides else None
        curves, fronts = rate_fronts(perf, topologies, traffic, constraints, serving, depths, progress, hint)
    else:
        curves, fronts = closed_loop_fronts(perf, topologies, traffic, constraints, serving, depths, progress)
    verification, skipped = None, None
    if decides and request.replay_verify is None:
        skipped = auto_replay_skipped(fronts, traffic)
        decides = skipped is None
    if decides:  # the replay decides among the best deployments (tuner/advise/_verify.py)
        verification = replay_verified(perf, fronts, traffic, max_ttft_ms=sla.max_ttft_ms, max_itl_ms=_itl_bound(sla),
                                       percentile=sla.percentile, max_gpus=request.gpus, router=router,
                                       knobs_given=frozenset(k for k, v in request.serve.knobs.items()
                                                             if v != knob_default(k)))
    return Advice(request=request, model=spec, gpu=gpu, traffic=traffic, constraints=constraints,
                  pairing_rules=f"vLLM {rules.version} NIXL rules", vllm_version=str(rules.version),
                  calibration=perf.calibration,
                  num_topologies=len(topologies), num_instance_points=curves.num_points, fronts=fronts,
                  recommendation=recommend(fronts), elapsed_s=time.perf_counter() - started,
                  verification=verification, replay_skipped=skipped)


def _itl_bound(sla: Sla) -> float | None:
    """The ITL the replay holds a deployment to: the SLA's, or 1000 / the per-user floor when tighter."""
    itl = sla.max_itl_ms
    if sla.min_tok_s_user:
        itl = min(itl or float("inf"), 1000.0 / sla.min_tok_s_user)
    return itl


def _replay_hint(perf: RooflineModel, traffic: Workload, sla: Sla, router: RouterPolicy) -> ReplayHint:
    """The "about N GPUs" of an error, from the replay: the fewest GPUs it shows carrying the rate in the SLA."""
    def hint(deployments: list[Deployment], max_gpus: int) -> tuple[int, str] | None:
        check = ReplayCheck(perf, traffic, ReplaySla(max_ttft_ms=sla.max_ttft_ms, max_itl_ms=_itl_bound(sla)),
                            sla.percentile, router, offered_arrival(traffic))
        found = replay_hint(check, deployments, max_gpus)
        return None if found.hint_gpus is None else (found.hint_gpus, found.hint_deployment or "")

    return hint


def offered_traffic(request: AdviseRequest) -> Workload:
    """The traffic the advice answers for: closed loop (its own ladder), or open loop at one rate: `request_rate`,
    `arrival` trace alone (the trace's own rate), or the workload's own single request rate."""
    workload, rate, arrival = request.workload, request.request_rate, request.arrival
    if rate is not None:
        try:
            return Workload.model_validate({**workload.model_dump(), "concurrency": (1,),
                                            "arrival": arrival or "poisson", "request_rates": (rate,)})
        except ValidationError as exc:
            raise workload_error(exc, "workload") from None
    if arrival == "trace":
        own = workload.trace.arrival_rps if workload.trace is not None else None
        if not own:
            raise ConfigError("`arrival` trace needs a trace with timestamps (its own rate)", field="arrival",
                              fix="give `workload` a JSONL trace with timestamps, or a `request_rate`")
        return workload.model_copy(update={"arrival": "trace", "request_rates": (own,)})
    if arrival == "poisson":
        raise ConfigError("`arrival` poisson needs a rate", field="request_rate",
                          fix="give `request_rate` R (requests/s)")
    if workload.open_loop and len(workload.request_rates) > 1:
        rates = ", ".join(f"{r:g}" for r in workload.request_rates)
        raise ConfigError(f"the workload offers several request rates ({rates}); a frontier answers for one",
                          field="request_rate", fix="give the one rate to carry with `request_rate`")
    return workload
