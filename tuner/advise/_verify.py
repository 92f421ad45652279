"""The replay decides `frontier`'s SLA answer: the best few deployments of the analytic fronts are replayed with the
real stream, and the answer is what the replay shows within the SLA (tuner/replay `verify_candidates`).

Open loop (a rate): candidates by fewest GPUs, then tok/s/GPU, each replayed at the offered rate (the trace's
timestamps rescaled, or Poisson). When none of them carries the rate, their knob variants are tried (the other
router policy, max_num_batched_tokens doubled and halved), then each shape is scaled up within the budget
(`fewest_instances_for_rate`); past the budget, the same search gives the "about N GPUs" hint. With a choice, the
choice one instance smaller is tried with the same knobs and each variant (at most `KNOB_REPLAYS`). Closed loop: by
tok/s/GPU, each at its own clients; when none holds the SLA, the best at fewer clients (bisected); the choice's knob
variants are kept when the replay shows them within the SLA at more tok/s/GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tuner.advise._fronts import Fronts
from tuner.advise._recommend import Point, operating_deployment
from tuner.deployment import Deployment
from tuner.frontier import AggregatedPoint
from tuner.perf import RooflineModel
from tuner.replay import ArrivalProcess, Candidate, Verified, fewest_instances_for_rate, verify_candidates
from tuner.replay import Sla as ReplaySla
from tuner.router import RouterPolicy
from tuner.topology import Role
from tuner.workload import Workload

VERIFY_TOP = 8  # front points replayed at most (each ~0.1-1 s, up to two deployments each)
VERIFY_TOP_CLOSED = 4  # closed loop: each replays 3 x its clients' requests
# Closed loop, by default (no `replay_verify`): the replay decides while the best point's clients are at most this
# (3 x clients requests per replay; 1,500 clients of a large MoE take ~2 s a replay at today's replay speed);
# past it the steady-state model answers and says so. `replay_verify` True replays any count.
AUTO_CLOSED_CLIENTS = 256
CLIENT_BISECTIONS = 4  # closed loop, nothing holds the SLA at its clients: the best point at fewer, bisected
KNOB_REPLAYS = 6  # knob variants replayed at most, on top of the candidates
HINT_BUDGET_FACTOR = 4  # the "about N GPUs" hint looks up to 4 x the budget
HINT_SHAPES = 8  # deployment shapes scaled when none carries the rate (one replay each that cannot)
SAMPLED_REQUESTS = 600  # a distribution's requests per replay (a trace is replayed whole)
# the router policy a knob search tries instead of the one replayed
OTHER_ROUTER: dict[RouterPolicy, RouterPolicy] = {RouterPolicy.CACHE_AWARE: RouterPolicy.ROUND_ROBIN,
                                                  RouterPolicy.ROUND_ROBIN: RouterPolicy.CACHE_AWARE,
                                                  RouterPolicy.LEAST_LOADED: RouterPolicy.CACHE_AWARE}


@dataclass(frozen=True)
class ReplayCheck:
    """How the replays are run: the traffic, the SLA, the arrivals (None: closed loop) and the router."""

    perf: RooflineModel
    traffic: Workload
    sla: ReplaySla
    percentile: str
    router: RouterPolicy
    arrival: ArrivalProcess | None

    @property
    def num_requests(self) -> int | None:
        return None if self.traffic.trace is not None else SAMPLED_REQUESTS

    def verify(self, candidates: list[Candidate], router: RouterPolicy | None = None) -> tuple[
            Verified | None, tuple[Verified, ...]]:
        found = verify_candidates(self.perf, candidates, self.traffic, sla=self.sla, percentile=self.percentile,
                                  arrival=self.arrival, router=router or self.router, num_requests=self.num_requests)
        return found.choice, found.checked

    def fewest(self, deployment: Deployment, max_gpus: int, floor_scale: int) -> tuple[
            Verified | None, tuple[Verified, ...]]:
        """The fewest copies of `deployment`'s smallest unit (its counts over their gcd) that carry the rate, more
        than `floor_scale` (known to fail); the budget's scale is replayed first, so a unit that cannot meet the
        SLA at any scale (too small a TP for the ITL) costs one replay."""
        assert self.arrival is not None and self.arrival.rate_rps is not None
        unit = deployment.unit
        found = fewest_instances_for_rate(
            self.perf, unit, self.traffic, rate_rps=self.arrival.rate_rps, sla=self.sla, percentile=self.percentile,
            max_gpus=max_gpus, arrival_kind="trace" if self.arrival.kind == "trace" else "poisson",
            router=self.router, num_requests=self.num_requests, start_scale=max_gpus // unit.num_gpus,
            floor_scale=floor_scale)
        return found.choice, found.checked


@dataclass(frozen=True)
class ReplayDecision:
    """What the replay decided: the deployment to run (None: nothing it checked meets the SLA), every replay made,
    the router policy the choice was replayed with, the knob variants tried, and, open loop with no choice within
    the budget, the fewest GPUs the replay shows carrying the rate within the SLA."""

    choice: Verified | None
    checked: tuple[Verified, ...]
    router: RouterPolicy
    searched: tuple[str, ...] = ()
    hint_gpus: int | None = None
    hint_deployment: str | None = None

    def as_json(self) -> dict[str, object]:
        from tuner.replay import VerifiedChoice

        return {**VerifiedChoice(self.choice, self.checked).as_json(), "router": self.router,
                "searched": list(self.searched), "fewest_gpus_hint": self.hint_gpus,
                "hint_deployment": self.hint_deployment}


def offered_arrival(traffic: Workload) -> ArrivalProcess | None:
    """Open loop: the offered rate as the replay sends it (the trace's rescaled timestamps, or Poisson)."""
    if not traffic.open_loop:
        return None
    return ArrivalProcess("trace" if traffic.arrival == "trace" else "poisson", rate_rps=traffic.request_rates[0])


def _clients(point: Point) -> int:
    if isinstance(point, AggregatedPoint):
        return point.num_instances * point.concurrency_per_instance
    return point.metrics.concurrency


def _ranked(fronts: Fronts, open_loop: bool) -> list[Point]:
    """Open loop: fewest GPUs first, then tok/s/GPU; closed loop: most tok/s/GPU first."""
    points: list[Point] = [*fronts.front, *fronts.aggregated]
    if open_loop:
        points.sort(key=lambda p: (p.num_gpus, -p.total_tok_s_per_gpu))
    else:
        points.sort(key=lambda p: -p.total_tok_s_per_gpu)
    return points


def auto_replay_skipped(fronts: Fronts, traffic: Workload) -> str | None:
    """Why the replay does not decide by default (None: it does): a closed loop past AUTO_CLOSED_CLIENTS."""
    points = _ranked(fronts, traffic.open_loop)
    if traffic.open_loop or not points or _clients(points[0]) <= AUTO_CLOSED_CLIENTS:
        return None
    return (f"closed loop at {_clients(points[0]):,} clients, past the {AUTO_CLOSED_CLIENTS} the replay checks by "
            "default (`replay_verify` replays it)")


def _candidates(fronts: Fronts, open_loop: bool, top: int) -> list[Candidate]:
    points = _ranked(fronts, open_loop)
    if not open_loop:
        top = min(top, VERIFY_TOP_CLOSED)
    candidates = []
    for p in points[:top]:
        # the operating deployment caps --max-num-seqs at the predicted batch; a burst past it queues in the
        # server, so the point's deployment with the serve option as given is tried next
        for deployment in dict.fromkeys((operating_deployment(p), p.deployment)):
            candidates.append(Candidate(deployment, p.total_tok_s_per_gpu, concurrency=_clients(p), label=p.mode))
    return candidates


def replay_verified(perf: RooflineModel, fronts: Fronts, traffic: Workload, *, max_ttft_ms: float | None,
                    max_itl_ms: float | None, percentile: str, max_gpus: int,
                    router: RouterPolicy = RouterPolicy.CACHE_AWARE,
                    knobs_given: frozenset[str] = frozenset(), top: int = VERIFY_TOP) -> ReplayDecision:
    """Replay the fronts' best `top` deployments (both modes) and keep the first within the SLA; open loop, grow
    the most efficient one when none carries the rate, then search the knobs that make the answer cheaper."""
    arrival = offered_arrival(traffic)
    check = ReplayCheck(perf, traffic, ReplaySla(max_ttft_ms=max_ttft_ms, max_itl_ms=max_itl_ms), percentile, router,
                        arrival)
    choice, checked = check.verify(_candidates(fronts, traffic.open_loop, top))
    decision = ReplayDecision(choice, checked, router)
    if arrival is None:
        if choice is None and checked:
            decision = _fewer_clients(check, decision)
        return _closed_loop_knobs(check, decision, knobs_given) if decision.choice is not None else decision
    if choice is None and checked:
        decision = _rescued_by_knobs(check, decision, knobs_given)
    if decision.choice is None and checked:
        decision = _grown(replace(check, router=decision.router), decision, max_gpus)
    if decision.choice is None:
        return decision
    return _cheaper_with_knobs(check, decision, knobs_given)


def _fewer_clients(check: ReplayCheck, decision: ReplayDecision) -> ReplayDecision:
    """Closed loop, none of the best points holds the SLA at its clients: the best one at fewer clients, bisected
    (CLIENT_BISECTIONS replays) for the most the replay shows within the SLA."""
    first = decision.checked[0].candidate.deployment.name  # the best point, its serve options as given (the last)
    best = [v for v in decision.checked if v.candidate.deployment.name == first][-1]
    low, high = 0, max(1, best.candidate.concurrency or 1)  # most clients known to pass (0: none yet), to fail
    found: Verified | None = None
    for _ in range(CLIENT_BISECTIONS):
        if high - low <= 1:
            break
        clients = (low + high) // 2
        choice, more = check.verify([Candidate(best.candidate.deployment, best.candidate.predicted_tok_s_per_gpu,
                                               concurrency=clients, label=f"{best.candidate.label} at fewer clients")])
        decision = replace(decision, checked=decision.checked + more)
        if choice is not None:
            low, found = clients, choice
        else:
            high = clients
    return replace(decision, choice=found)


def _rescued_by_knobs(check: ReplayCheck, decision: ReplayDecision, knobs_given: frozenset[str]) -> ReplayDecision:
    """No candidate carries the rate as given: the fewest-GPU ones (their serve options as given) under each knob
    variant, the first the replay shows within the SLA kept (at most KNOB_REPLAYS replays)."""
    budget = KNOB_REPLAYS
    searched: list[str] = []
    failed = list(dict.fromkeys(v.candidate.deployment.name for v in decision.checked))
    uncapped = {v.candidate.deployment.name: v.candidate.deployment for v in decision.checked}  # the last of each
    for name in failed:
        for words, deployment, router in _variants(uncapped[name], decision.router, knobs_given):
            if budget <= 0:
                return replace(decision, searched=tuple(searched))
            budget -= 1
            choice, decision = _knob_try(check, decision, searched, words, deployment, router)
            if choice is not None:
                return replace(decision, choice=choice, router=router, searched=tuple(searched))
    return replace(decision, searched=tuple(searched))


def _shapes(deployments: list[Deployment]) -> list[Deployment]:
    """One deployment per shape (its groups' roles, topologies and count ratio), in the order given, at most
    HINT_SHAPES: each is scaled on its own."""
    seen: dict[tuple, Deployment] = {}
    for d in deployments:
        key = tuple((g.role, g.topology.name, g.topology.mtp, g.count) for g in d.unit.groups)
        seen.setdefault(key, d)
    return list(seen.values())[:HINT_SHAPES]


def fewest_of(check: ReplayCheck, deployments: list[Deployment], max_gpus: int, past_gpus: int | None = None
              ) -> tuple[Verified | None, tuple[Verified, ...]]:
    """The fewest GPUs the replay shows carrying the rate within the SLA, each shape of `deployments` scaled up
    from just past `past_gpus` (None: past its own count, which failed) to `max_gpus`; a later shape is searched
    only below the best found, so a shape that cannot meet the ITL (too small a TP) costs a few replays at most."""
    best: Verified | None = None
    checked: tuple[Verified, ...] = ()
    for d in _shapes(deployments):
        bound = max_gpus if best is None else best.report.num_gpus - 1
        floor = (d.num_gpus if past_gpus is None else past_gpus) // d.unit.num_gpus
        if (floor + 1) * d.unit.num_gpus > bound:
            continue
        choice, more = check.fewest(d, bound, floor)
        checked += more
        if choice is not None and (best is None or choice.report.num_gpus < best.report.num_gpus):
            best = choice
    return best, checked


def _grown(check: ReplayCheck, decision: ReplayDecision, max_gpus: int) -> ReplayDecision:
    """No candidate carries the rate: the checked shapes (most tok/s/GPU predicted first, the serve options as
    given before the capped batch) scaled up within the budget; past it, the hint."""
    def rank(v: Verified) -> tuple[float, int]:
        seqs = sum(g.topology.max_num_seqs for g in v.candidate.deployment.groups)
        return -v.candidate.predicted_tok_s_per_gpu, -seqs

    deployments = [v.candidate.deployment for v in sorted(decision.checked, key=rank)]
    choice, more = fewest_of(check, deployments, max_gpus)
    decision = replace(decision, choice=choice, checked=decision.checked + more)
    if choice is not None:
        return decision
    return replay_hint(check, deployments, max_gpus, decision)


def replay_hint(check: ReplayCheck, deployments: list[Deployment], max_gpus: int,
                decision: ReplayDecision | None = None) -> ReplayDecision:
    """The fewest GPUs the replay shows carrying the rate within the SLA, scaling `deployments` from just past the
    budget up to HINT_BUDGET_FACTOR x it (none: the hint is left out)."""
    choice, more = fewest_of(check, deployments, HINT_BUDGET_FACTOR * max_gpus, past_gpus=max_gpus)
    base = decision or ReplayDecision(None, (), check.router)
    if choice is None:
        return replace(base, checked=base.checked + more)
    return replace(base, checked=base.checked + more, hint_gpus=choice.report.num_gpus,
                   hint_deployment=choice.report.deployment)


def _variants(deployment: Deployment, router: RouterPolicy, knobs_given: frozenset[str]
              ) -> list[tuple[str, Deployment, RouterPolicy]]:
    """The deployment under the knobs the analytic sweep leaves fixed: the other router policy (with more than one
    instance behind it), then --max-num-batched-tokens doubled and halved (unless the user set it)."""
    out = []
    fronts = sum(g.count for g in deployment.groups if g.role is not Role.DECODE)
    if fronts > 1:
        other = OTHER_ROUTER[router]
        out.append((f"router {other}", deployment, other))
    if "max_num_batched_tokens" not in knobs_given:
        current = deployment.groups[0].topology.max_num_batched_tokens
        for tokens in (current * 2, current // 2):
            if tokens >= 1024:
                groups = tuple(g.model_copy(update={"topology": g.topology.model_copy(
                    update={"max_num_batched_tokens": tokens})}) for g in deployment.groups)
                out.append((f"max_num_batched_tokens {tokens}", deployment.model_copy(update={"groups": groups}),
                            router))
    return out


def _knob_try(check: ReplayCheck, decision: ReplayDecision, searched: list[str], words: str,
              deployment: Deployment, router: RouterPolicy, *, concurrency: int | None = None
              ) -> tuple[Verified | None, ReplayDecision]:
    """One replay of the knob search: `deployment` under the variant `words` (noted in `searched`, labelled for the
    table), its check added to the decision's; the replay's choice if it meets the SLA."""
    searched.append(f"{deployment.name} with {words}")
    choice, more = check.verify([Candidate(deployment, concurrency=concurrency, label=f"knob search: {words}")],
                                router)
    return choice, replace(decision, checked=decision.checked + more)


def _one_smaller(deployment: Deployment) -> list[Deployment]:
    """The deployment with one instance fewer in one group (each group that has more than one)."""
    out = []
    for i, g in enumerate(deployment.groups):
        if g.count > 1:
            groups = list(deployment.groups)
            groups[i] = g.model_copy(update={"count": g.count - 1})
            out.append(deployment.model_copy(update={"groups": tuple(groups)}))
    return out


def _cheaper_with_knobs(check: ReplayCheck, decision: ReplayDecision, knobs_given: frozenset[str]
                        ) -> ReplayDecision:
    """Open loop: the choice one instance smaller, as given and under each knob variant; the first the replay shows
    within the SLA is the new choice, and the search goes on from it while replays are left."""
    budget = KNOB_REPLAYS
    searched: list[str] = []
    while budget > 0 and decision.choice is not None:
        found = None
        for smaller in _one_smaller(decision.choice.candidate.deployment):
            tries = [("the same knobs", smaller, decision.router), *_variants(smaller, decision.router, knobs_given)]
            for words, deployment, router in tries:
                if budget <= 0:
                    break
                budget -= 1
                choice, decision = _knob_try(check, decision, searched, words, deployment, router)
                if choice is not None:
                    found = (choice, router)
                    break
            if found is not None or budget <= 0:
                break
        if found is None:
            break
        decision = replace(decision, choice=found[0], router=found[1])
    return replace(decision, searched=tuple(searched))


def _closed_loop_knobs(check: ReplayCheck, decision: ReplayDecision, knobs_given: frozenset[str]) -> ReplayDecision:
    """Closed loop: the choice under each knob variant at its clients; one within the SLA at 1% more replayed
    tok/s/GPU replaces it."""
    choice = decision.choice
    assert choice is not None
    searched = []
    for words, deployment, router in _variants(choice.candidate.deployment, decision.router, knobs_given):
        found, decision = _knob_try(check, decision, searched, words, deployment, router,
                                    concurrency=choice.candidate.concurrency)
        best = decision.choice
        assert best is not None
        if found is not None and found.report.total_tok_s_per_gpu > 1.01 * best.report.total_tok_s_per_gpu:
            decision = replace(decision, choice=found, router=router)
    return replace(decision, searched=tuple(searched))
