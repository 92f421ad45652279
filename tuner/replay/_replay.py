"""Replay a request stream through a deployment: instances of engines, a router, and one event loop.

The loop always moves the earliest thing next: a request reaching a router (sent + the front end's time, as
`RooflineModel.front_end_ms` prices it) or the engine whose clock is earliest running
its next step. An engine running decode steps in closed form stops at the first step end past the next arrival
(and, when answers feed new requests: a closed loop, sessions, PD transfers, past the earliest other busy engine),
so a request is never admitted later than the step boundary after it arrives.

PD: a prefill instance runs the prompt (the answer's first token is its output, max_tokens 1 as vLLM's PD proxy
sends it); the request then queues at a decode instance, which allocates the prompt's blocks, pulls its KV over
the prefill-decode link (`RooflineModel.kv_transfer_ms`: scale-up within an NVLink domain, else scale-out), and
decodes; the client's first token is the decode side's first step.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tuner.deployment import Deployment, InstanceGroup
from tuner.errors import ConfigError, InfeasibleError
from tuner.memory import KVLayout
from tuner.models import LayerKind
from tuner.perf import RooflineModel
from tuner.replay._arrivals import (
    MAX_REPLAY_REQUESTS,
    ArrivalProcess,
    Sessions,
    arrival_times_ms,
    sampled_requests,
    trace_requests,
)
from tuner.replay._engine import Engine, SchedulerLimits
from tuner.replay._gaps import token_gap_percentiles
from tuner.replay._pricing import StepPricer
from tuner.replay._report import (
    Percentiles,
    ReplayReport,
    RequestRecord,
    Sla,
    TimelinePoint,
    downsample,
    queue_trend,
)
from tuner.replay._requests import EngineRequest, RequestSpec
from tuner.replay._router import DpBalancer, Router, check_router
from tuner.router import RouterPolicy
from tuner.topology import Role
from tuner.workload import Workload

DEFAULT_SAMPLED_REQUESTS = 1000
MAX_REPLAY_GPUS = 16_384  # every rank is an engine object: a fleet past this is a slice's traffic replayed


@dataclass(frozen=True)
class ReplayPlan:
    """What to replay: the deployment, the traffic and how it is sent, the router, and what to measure."""

    deployment: Deployment
    workload: Workload
    arrival: ArrivalProcess
    router: RouterPolicy = RouterPolicy.CACHE_AWARE
    num_requests: int | None = None  # a trace: all of it (or its first N); distributions: 1,000
    warmup_share: float = 0.0
    sessions: Sessions | None = None
    sla: Sla = field(default_factory=Sla)
    seed: int = 0
    long_prefill_token_threshold: int = 0
    prefix_caching: bool = True
    max_horizon_s: float | None = None  # None: 10 x the sending window + 600 s (open loop)

    def __post_init__(self) -> None:
        if self.num_requests is not None and not 1 <= self.num_requests <= MAX_REPLAY_REQUESTS:
            raise ConfigError(f"{self.num_requests:,} requests; a replay takes 1..{MAX_REPLAY_REQUESTS:,}",
                              field="num_requests", fix="replay a representative window of the traffic")
        if not 0.0 <= self.warmup_share < 1.0:
            raise ConfigError(f"warm-up share must be in [0, 1), got {self.warmup_share:g}", field="warmup_share",
                              fix="give the share of requests replayed before measuring, e.g. 0.1")
        if self.deployment.num_gpus > MAX_REPLAY_GPUS:
            raise ConfigError(f"{self.deployment.num_gpus:,} GPUs; a replay simulates up to {MAX_REPLAY_GPUS:,}",
                              field="deployment", fix="replay one slice of the fleet (the router's share of the "
                              "traffic through fewer instances)")
        object.__setattr__(self, "router", check_router(self.router))  # either spelling in, the enum kept


@dataclass
class _Instance:
    group: InstanceGroup
    engines: list[Engine]
    balancer: DpBalancer
    in_flight: int = 0


def _state_blocks(layout: KVLayout) -> tuple[int, int]:
    """(token blocks per rank, extra blocks a request holds for its recurrent state): vLLM's pool holds
    num_gpu_blocks block ids shared by every KV-cache group; a token block costs one id per attention group, a
    GDN/Mamba layer group one id per request (1 + speculative blocks, mamba_cache_mode "none")."""
    kinds = layout.num_groups_by_kind
    token_groups = sum(n for k, n in kinds.items()
                       if k in (LayerKind.FULL_ATTENTION, LayerKind.MLA, LayerKind.SLIDING_WINDOW)) or 1
    state_groups = sum(n for k, n in kinds.items() if k in (LayerKind.LINEAR_ATTENTION, LayerKind.MAMBA))
    state = -(-state_groups * (1 + layout.num_spec_tokens) // token_groups) if state_groups else 0
    return token_groups, state


def _instances(perf: RooflineModel, plan: ReplayPlan, isl: int, osl: int) -> list[_Instance]:
    out = []
    for group in plan.deployment.groups:
        topo = group.topology
        state = perf.state(topo, group.role, isl=isl, osl=osl)
        memory = state.memory
        token_groups, state_blocks = _state_blocks(memory.layout)
        pricer = StepPricer(state.costs, perf.gpu, perf.calibration, topo, group.role)
        limits = SchedulerLimits(max_num_seqs=topo.max_num_seqs, max_num_batched_tokens=topo.max_num_batched_tokens,
                                 long_prefill_token_threshold=plan.long_prefill_token_threshold,
                                 block_size=memory.layout.block_size,
                                 num_blocks=max(1, memory.num_gpu_blocks // token_groups - 1),  # vLLM's null block
                                 mtp=topo.mtp, prefix_caching=plan.prefix_caching, state_blocks=state_blocks,
                                 stream_interval=topo.stream_interval)
        transfer: Callable[[EngineRequest], float] | None = None
        if group.role is Role.DECODE:
            def transfer(r: EngineRequest, _s=state) -> float:
                return perf.kv_transfer_ms(_s, r.prompt_tokens)
        for i in range(group.count):
            engines = [Engine(f"{group.role.value} instance {i} rank {rank}", pricer, limits, transfer_ms=transfer,
                              front_output_ms=perf.front_end_output_ms(),
                              shared_host_ms=perf.front_end_core_ms(topo.stream_interval))
                       for rank in range(topo.dp)]
            out.append(_Instance(group, engines, DpBalancer(topo.dp)))
    return out


def _requests(plan: ReplayPlan, block_size: int) -> tuple[list[RequestSpec], bool]:
    """The stream's requests, and whether their arrival times come from the trace."""
    w = plan.workload
    if w.trace is not None:
        specs = trace_requests(w.trace.path, block_size, plan.num_requests, w.trace.block_tokens)
        if plan.sessions is not None:
            raise ConfigError("a trace carries its own turns (hash_ids re-send the history)", field="turns",
                              fix="drop `turns` with a trace, or replay a distribution as sessions")
        return specs, all(s.arrival_ms is not None for s in specs)
    count = plan.num_requests or DEFAULT_SAMPLED_REQUESTS
    return sampled_requests(w, count, block_size, plan.seed, plan.sessions), False


def replay(perf: RooflineModel, plan: ReplayPlan) -> ReplayReport:
    """Replay the plan's traffic through its deployment, event by event; a report of what it measured."""
    w = plan.workload
    isl, osl = w.isl, w.osl
    instances = _instances(perf, plan, isl, osl)
    block_size = instances[0].engines[0].limits.block_size
    specs, _ = _requests(plan, block_size)
    if len(specs) > MAX_REPLAY_REQUESTS:
        raise ConfigError(f"more than {MAX_REPLAY_REQUESTS:,} requests", field="num_requests",
                          fix="replay a representative window of the traffic")
    return _Run(perf, plan, instances, specs).run()


class _Run:
    """One replay's mutable state: the event heap, the engines, the clients."""

    def __init__(self, perf: RooflineModel, plan: ReplayPlan, instances: list[_Instance],
                 specs: list[RequestSpec]) -> None:
        self.perf = perf
        self.plan = plan
        self.instances = instances
        self.pd = plan.deployment.is_disaggregated
        self.front = [i for i in instances if i.group.role is not Role.DECODE]
        self.back = [i for i in instances if i.group.role is Role.DECODE]
        self.router = Router(plan.router, len(self.front))
        self.decode_router = Router(plan.router, len(self.back)) if self.back else None
        self.engines = [e for i in instances for e in i.engines]
        self.engine_instance = {id(e): i for i in instances for e in i.engines}
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.requests: list[EngineRequest] = []
        self.sent_order: list[tuple[float, int]] = []  # (sent, in flight then) for the queue trend
        self.in_flight = 0
        self.specs = specs
        # sessions (or single requests) in send order; a closed loop's clients pull them one by one
        groups: list[list[RequestSpec]] = []
        for s in specs:
            if s.session is not None and groups and groups[-1][0].session == s.session:
                groups[-1].append(s)
            else:
                groups.append([s])
        self.groups = groups
        self.next_group = 0
        self.warmup = math.ceil(plan.warmup_share * len(specs))
        # Engines whose answers can send a request to an engine before its stretch ends: a PD decode rank hears
        # from the prefill ranks; with a closed loop or sessions, an answer anywhere sends the next request
        # through the router, so the router's engines hear from every answering engine.
        front_engines = [e for i in self.front for e in i.engines]
        back_engines = [e for i in self.back for e in i.engines]
        answering = back_engines if self.pd else front_engines
        loops = (not plan.arrival.open_loop) or plan.sessions is not None
        self.feeds: dict[int, list[Engine]] = {}
        for e in self.engines:
            sources = list(front_engines) if e in back_engines else []
            if loops and e in front_engines:
                sources += answering
            self.feeds[id(e)] = [s for s in sources if s is not e]
        self.horizon_ms = math.inf
        self.last_send_ms = 0.0

    # -- events ------------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: object) -> None:
        heapq.heappush(self.heap, (t, self.seq, kind, payload))
        self.seq += 1

    def _send(self, spec: RequestSpec, t: float, rest: tuple[RequestSpec, ...]) -> None:
        r = EngineRequest(rid=len(self.requests), spec=spec, sent_ms=t, prompt_tokens=spec.prompt_tokens,
                          output_tokens=1 if self.pd else spec.output_tokens, units=spec.units)
        r.warmup = len(self.requests) < self.warmup
        r.rest = rest
        self.requests.append(r)
        self.in_flight += 1
        self.sent_order.append((t, self.in_flight))
        self._push(t + self.perf.front_end_ms(spec.prompt_tokens), 0, r)

    def _start_group(self, t: float) -> None:
        if self.next_group >= len(self.groups):
            return
        group = self.groups[self.next_group]
        self.next_group += 1
        self._send(group[0], t, tuple(group[1:]))

    def _route(self, r: EngineRequest, t: float) -> None:
        if r.remote:
            index = self.decode_router.pick(r.spec, [i.in_flight for i in self.back])  # type: ignore[union-attr]
            inst = self.back[index]
        else:
            index = self.router.pick(r.spec, [i.in_flight for i in self.front])
            inst = self.front[index]
        inst.in_flight += 1
        r.instance = index
        engine = inst.engines[inst.balancer.pick(inst.engines)]
        engine.add(r, t)

    def _finished(self, engine: Engine, r: EngineRequest) -> None:
        inst = self.engine_instance[id(engine)]
        inst.in_flight -= 1
        t = r.finish_ms or engine.clock
        if r.finish_seen_ms is not None and not (self.pd and not r.remote):
            t = r.finish_seen_ms  # the client sees the end once the front end hands it on
        if self.pd and not r.remote:
            # the prefill side is done: the request moves to a decode instance with its KV
            r.prefill_done_ms = t
            d = EngineRequest(rid=r.rid, spec=r.spec, sent_ms=r.sent_ms, prompt_tokens=r.prompt_tokens,
                              output_tokens=r.spec.output_tokens, units=r.units, remote=True,
                              hit_tokens=r.hit_tokens, warmup=r.warmup, preemptions=r.preemptions)
            d.rest = r.rest
            d.front = r
            self.requests[r.rid] = d
            self._push(t, 0, d)
            return
        self.in_flight -= 1
        rest = r.rest
        if rest:
            self._send(rest[0], t + rest[0].think_ms, rest[1:])
        elif not self.plan.arrival.open_loop:
            self._start_group(t)

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> ReplayReport:
        plan = self.plan
        if plan.arrival.open_loop:
            trace_times = [g[0].arrival_ms for g in self.groups] if plan.arrival.kind == "trace" else None
            times = arrival_times_ms(len(self.groups), plan.arrival, trace_times, plan.seed)
            for t, _ in zip(times, self.groups, strict=True):
                self._push(t, 1, None)
            self.last_send_ms = times[-1] if times else 0.0
            horizon_s = plan.max_horizon_s if plan.max_horizon_s is not None else 10 * self.last_send_ms / 1e3 + 600
            self.horizon_ms = horizon_s * 1e3
        else:
            for _ in range(plan.arrival.concurrency):
                self._start_group(0.0)
            if plan.max_horizon_s is not None:
                self.horizon_ms = plan.max_horizon_s * 1e3
        self._loop()
        return self._report()

    def _loop(self) -> None:
        engines = self.engines
        heap = self.heap
        heappop = heapq.heappop
        feeds = [self.feeds[id(e)] for e in engines]
        horizon_ms = self.horizon_ms
        inf = math.inf
        while True:
            busy = None
            earliest = inf
            index = 0
            for i, e in enumerate(engines):  # the earliest engine with work (Engine.has_work, inline: per step)
                if (e.running or e.waiting or e.transferring) and e.clock < earliest:
                    busy, earliest, index = e, e.clock, i
            if busy is None or (heap and heap[0][0] <= earliest):
                if not heap:
                    break
                t, _, kind, payload = heappop(heap)
                if kind == 1:
                    self._start_group(t)
                else:
                    self._route(payload, t)  # type: ignore[arg-type]
                continue
            if earliest > horizon_ms:
                self._stop(earliest)
            limit = heap[0][0] if heap else inf
            for e in feeds[index]:
                if (e.running or e.waiting or e.transferring) and e.clock < limit:
                    limit = e.clock
            finished = busy.advance(limit)
            if finished:
                for r in finished:
                    self._finished(busy, r)

    def _stop(self, t_ms: float) -> None:
        done = [r for r in self.requests if r.finish_ms is not None and not r.warmup]
        ttft = Percentiles.of([r.first_token_ms - r.sent_ms for r in done if r.first_token_ms is not None])
        raise InfeasibleError(
            f"replay stopped at {t_ms / 1e3:,.0f} s simulated, far past the last request sent at "
            f"{self.last_send_ms / 1e3:,.0f} s: {len(done):,} of {len(self.specs):,} requests answered "
            f"(TTFT p50 {ttft.p50:,.0f} ms, p90 {ttft.p90:,.0f} ms so far), {self.in_flight:,} in flight; the "
            "offered load is far past what the deployment carries", field="max_horizon_s",
            fix="lower `request_rate`, add instances, or raise `max_horizon_s` to replay the backlog to its end")

    # -- the report --------------------------------------------------------------------------------
    def _report(self) -> ReplayReport:
        plan = self.plan
        records = []
        for r in self.requests:
            if r.warmup or r.finish_ms is None:
                continue
            first = r.first_token_ms if r.first_token_ms is not None else r.finish_ms
            seen = r.first_seen_ms if r.first_seen_ms is not None else first  # through the front end's lag
            ttft = seen - r.sent_ms
            e2e = (r.finish_seen_ms if r.finish_seen_ms is not None else r.finish_ms) - r.sent_ms
            itl = (e2e - ttft) / (r.output_tokens - 1) if r.output_tokens > 1 else None
            front = r.front
            scheduled = r.scheduled_ms if r.scheduled_ms is not None else first
            preemptions = r.preemptions + (front.preemptions if front is not None else 0)
            records.append(RequestRecord(
                sent_ms=r.sent_ms, ttft_ms=ttft, itl_ms=itl, e2e_ms=e2e, prompt_tokens=r.prompt_tokens,
                output_tokens=r.output_tokens, hit_share=r.hit_tokens / r.prompt_tokens, preemptions=preemptions,
                instance=front.instance if front is not None else r.instance, queued_ms=scheduled - r.queued_ms,
                prefill_ms=first - scheduled))
        if not records:
            raise ConfigError("no request was measured", field="warmup_share", fix="lower `warmup_share`")
        start = min(r.sent_ms for r in records)
        end = max(r.sent_ms + r.e2e_ms for r in records)
        duration_s = max(1e-9, (end - start) / 1e3)
        out_tokens = sum(r.output_tokens for r in records)
        in_tokens = sum(r.prompt_tokens for r in records)
        met = [r for r in records if plan.sla.met(r)]
        hit = sum(r.hit_share * r.prompt_tokens for r in records) / in_tokens
        sent = sorted(self.sent_order)
        return ReplayReport(
            deployment=plan.deployment.name, arrival=plan.arrival.describe(), requests=tuple(records),
            warmup_requests=self.warmup, ttft_ms=Percentiles.of([r.ttft_ms for r in records]),
            itl_ms=Percentiles.of([r.itl_ms for r in records if r.itl_ms is not None]),
            token_gap_ms=token_gap_percentiles([e.gaps for e in self.engines]),
            e2e_ms=Percentiles.of([r.e2e_ms for r in records]), duration_s=duration_s,
            request_rps=len(records) / duration_s, output_tok_s=out_tokens / duration_s,
            total_tok_s=(in_tokens + out_tokens) / duration_s, num_gpus=plan.deployment.num_gpus, sla=plan.sla,
            sla_attainment=len(met) / len(records), goodput_rps=len(met) / duration_s, prefix_hit_share=hit,
            preemptions=sum(e.preemptions for e in self.engines),
            queue=queue_trend([s for s, _ in sent], [n for _, n in sent]),
            timeline=self._timeline(end), steps=sum(e.steps for e in self.engines))

    def _timeline(self, end_ms: float, points: int = 600) -> tuple[TimelinePoint, ...]:
        """The deployment's queue, running batch and KV use on a regular grid (each rank's last sample before
        a grid time; KV use averaged over the ranks that hold the decode side)."""
        grid = np.linspace(0.0, end_ms, points)
        waiting = np.zeros(points)
        running = np.zeros(points)
        kv = np.zeros(points)
        kv_ranks = [e for e in self.engines if not self.pd or self.engine_instance[id(e)].group.role is Role.DECODE]
        for e in self.engines:
            t, w, r, k = e.sample_arrays()
            if not len(t):
                continue
            idx = np.searchsorted(t, grid, side="right") - 1
            ok = idx >= 0
            waiting[ok] += w[idx[ok]]
            running[ok] += r[idx[ok]]
            if e in kv_ranks:
                kv[ok] += k[idx[ok]] / len(kv_ranks)
        return downsample([TimelinePoint(float(g / 1e3), int(wv), int(rv), float(kv_)) for g, wv, rv, kv_ in
                           zip(grid, waiting, running, kv, strict=True)], points)
