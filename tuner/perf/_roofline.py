"""RooflineModel: physics-based prediction of a prefill or decode instance, with KV-capacity queueing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tuner.errors import ConfigError, DoesNotFitError
from tuner.hardware import GpuSpec
from tuner.memory import MemoryBreakdown, MemoryInputs, Mxfp4Backend, compute_memory
from tuner.metrics import ServingMetrics
from tuner.models import ModelSpec
from tuner.perf._aggregated import AggregatedPoint, BurstRun, solve_aggregated, solve_burst
from tuner.perf._base import PerformanceModel
from tuner.perf._calibration import Calibration
from tuner.perf._costs import InstanceCosts, instance_costs, redundant_experts
from tuner.perf._steps import (
    DecodeStep,
    MixedStep,
    PrefillStep,
    accepted_tokens,
    decode_step,
    mixed_step,
    prefill_step,
    request_step_us,
)
from tuner.topology import Role, Topology


@dataclass(frozen=True, slots=True)
class InstanceState:
    """Constants of one (topology, workload): per-GPU costs and the KV-capacity cap."""

    costs: InstanceCosts
    memory: MemoryBreakdown
    cap_per_rank: int  # requests one DP rank runs at once (KV cache, max-num-seqs, token budget)
    kv_cap_per_rank: int  # requests the KV cache alone holds (kv_occupancy scales this one only)


@dataclass(frozen=True, slots=True)
class Occupancy:
    """How `concurrency` clients spread over an instance: running requests and busy DP ranks."""

    running: int
    busy_ranks: int

    @property
    def per_rank(self) -> float:
        return self.running / self.busy_ranks


@dataclass(frozen=True)
class _Steady:
    """An aggregated instance at one load: what a steady-state point and a burst both start from."""

    state: InstanceState
    occupancy: Occupancy
    point: AggregatedPoint


@dataclass(frozen=True, slots=True)
class LatencyParts:
    """One request's latency at a load, split so a length mix can scale each part by its own request.

    TTFT = wait + prompt (its own prefill work; in a PD decode role, its KV transfer) + front end + first token.
    ITL averages a request's decode steps: `chunk_share` of them also carry a prefill chunk (aggregated).
    """

    wait_ms: float  # queueing ahead of the request (a closed loop's Little's-law wait)
    prompt_ms: float  # its own prompt at the typical length
    front_ms: float
    first_token_ms: float
    itl_plain_ms: float
    itl_chunk_ms: float
    chunk_share: float
    decode_steps: float  # decode steps of a typical request


def _new_tokens(isl: int, cached_tokens: float) -> int:
    """Prompt tokens computed: vLLM always recomputes at least the last one."""
    return max(1, round(isl - cached_tokens))


def flag_cap_per_rank(topo: Topology, role: Role) -> int:
    """Requests one DP rank may run by its flags alone: max-num-seqs and, outside prefill, the token budget
    (every running request's verified tokens must fit one step). The KV cache is the other, separate limit."""
    if role is Role.PREFILL:
        return topo.max_num_seqs
    return min(topo.max_num_seqs, topo.max_num_batched_tokens // (1 + topo.mtp))


def _cost_key(topo: Topology) -> tuple[object, ...]:
    """What instance_costs reads from the topology."""
    return (topo.tp, topo.dp, topo.ep, topo.mtp, topo.dbo, topo.all2all_backend, redundant_experts(topo),
            topo.kv_cache_dtype)


def _key(topo: Topology, isl: int, osl: int) -> tuple[object, ...]:
    return (*_cost_key(topo), topo.gpu_memory_utilization, topo.max_num_seqs, topo.max_num_batched_tokens,
            topo.max_cudagraph_capture_size, isl, osl)


class RooflineModel(PerformanceModel):
    """Decode: bytes over HBM vs FLOPs over peak, plus collectives and fixed costs. Prefill: chunked FLOPs.

    Per-topology constants are computed once and cached, so a concurrency level costs microseconds.
    """

    def __init__(self, model: ModelSpec, gpu: GpuSpec, calibration: Calibration | None = None, *,
                 cuda_graph_gib: float | None = None, mxfp4_backend: Mxfp4Backend | None = None,
                 kv_cache_memory_bytes: int | None = None) -> None:
        """`cuda_graph_gib` replaces the memory model's CUDA-graph reserve: a measured figure, or 0 for vLLM
        before 0.21, which sized the KV cache without reserving graph memory first. `mxfp4_backend` replaces
        vLLM's default MXFP4 MoE kernels (Marlin for vLLM before 0.12 on Hopper). `kv_cache_memory_bytes` is
        vLLM's --kv-cache-memory-bytes: the KV budget per GPU, exactly, instead of the utilization's."""
        super().__init__(model, gpu, calibration)
        self.cuda_graph_gib = cuda_graph_gib
        self.mxfp4_backend = mxfp4_backend
        self.kv_cache_memory_bytes = kv_cache_memory_bytes
        self._states: dict[tuple[object, ...], InstanceState] = {}
        self._costs: dict[tuple[object, ...], InstanceCosts] = {}

    def with_calibration(self, calibration: Calibration) -> RooflineModel:
        """Same model and GPU, other factors; shares the calibration-independent caches (fast refits)."""
        twin = RooflineModel(self.model, self.gpu, calibration, cuda_graph_gib=self.cuda_graph_gib,
                             mxfp4_backend=self.mxfp4_backend, kv_cache_memory_bytes=self.kv_cache_memory_bytes)
        twin._states = self._states
        twin._costs = self._costs
        return twin

    # -- constants -------------------------------------------------------------------------------
    def state(self, topo: Topology, role: Role, *, isl: int, osl: int) -> InstanceState:
        """Cached constants; raises TopologyError / DoesNotFitError for layouts that cannot serve."""
        mem_osl = 1 if role is Role.PREFILL else osl
        key = _key(topo, isl, mem_osl)
        found = self._states.get(key)
        if found is not None:
            return found
        topo.check(self.model)
        cost_key = _cost_key(topo)
        costs = self._costs.get(cost_key)
        if costs is None:
            costs = self._costs[cost_key] = instance_costs(self.model, self.gpu, topo)
        memory = compute_memory(self.model, self.gpu, topo,
                                MemoryInputs(isl=isl, osl=mem_osl, cuda_graph_gib=self.cuda_graph_gib,
                                             mxfp4_backend=self.mxfp4_backend,
                                             kv_cache_memory_bytes=self.kv_cache_memory_bytes))
        if not memory.fits:
            raise DoesNotFitError(memory.verdict(), shortfall_gib=memory.shortfall_gib,
                                  fix="shard over more GPUs (larger TP x DP with +EP) or shorten the requests")
        cap = flag_cap_per_rank(topo, role)
        # vLLM allocates KV blocks as tokens are computed and, when a step's blocks run out, preempts the newest
        # running request (vllm/v1/core/sched/scheduler.py): under a queue the running requests hold their
        # current context, isl + osl/2 on average, not isl + osl each, and a sliding-window layer only its window
        # (the blocks before it are freed); the prompt chunk being prefilled holds its window layers' blocks for
        # its step.
        layout = memory.layout
        held = layout.resident_blocks_per_request(isl + (mem_osl - 1) // 2)
        free = max(0, memory.num_gpu_blocks - layout.chunk_blocks_in_flight(min(isl, topo.max_num_batched_tokens)))
        kv_cap = int(free / held) if held else int(memory.max_concurrency)
        state = InstanceState(costs=costs, memory=memory, cap_per_rank=max(1, min(cap, kv_cap)),
                              kv_cap_per_rank=max(1, kv_cap))
        self._states[key] = state
        return state

    def capacity(self, topology: Topology, role: Role, *, isl: int, osl: int) -> int:
        return self.running_cap(self.state(topology, role, isl=isl, osl=osl)) * topology.dp

    def running_cap(self, state: InstanceState) -> int:
        """Requests one DP rank holds at once in practice: the KV-cache cap x `kv_occupancy`, max-num-seqs and
        the token budget.

        `kv_occupancy` describes how full vLLM keeps the KV cache under a queue (block-granular admission,
        preemption); it does not shrink max-num-seqs: with `--max-num-seqs 4` and room for hundreds of requests
        in the KV cache, vLLM runs exactly 4 (scaling both made one of 4 clients queue for a whole request).
        """
        return max(1, min(state.cap_per_rank, int(state.kv_cap_per_rank * self.calibration.kv_occupancy + 1e-9)))

    def occupancy(self, state: InstanceState, topo: Topology, concurrency: int) -> Occupancy:
        """running = min(concurrency, cap per DP rank x DP); the rest waits in the queue."""
        running = min(concurrency, self.running_cap(state) * topo.dp)
        return Occupancy(running=running, busy_ranks=min(topo.dp, running))

    # -- steps (public for breakdowns and tests) ---------------------------------------------------
    def decode_step(self, topo: Topology, running: int, *, isl: int, osl: int) -> DecodeStep:
        """The decode step of an instance with `running` requests (context = isl + osl / 2 on average)."""
        state = self.state(topo, Role.DECODE, isl=isl, osl=osl)
        occ = self.occupancy(state, topo, running)
        return decode_step(state.costs, self.gpu, self.calibration, requests_per_rank=occ.per_rank,
                           total_requests=occ.running, context_tokens=isl + osl / 2, mtp_depth=topo.mtp,
                           stream_interval=topo.stream_interval)

    def prefill_step(self, topo: Topology, running: int, *, isl: int, new_tokens: int | None = None) -> PrefillStep:
        """The prefill step of an instance with `running` prompts in flight (chunked by the token budget);
        `new_tokens` of each prompt are computed (the rest came from the prefix cache)."""
        state = self.state(topo, Role.PREFILL, isl=isl, osl=1)
        occ = self.occupancy(state, topo, running)
        new = isl if new_tokens is None else new_tokens
        tokens = min(topo.max_num_batched_tokens, occ.per_rank * new)
        return prefill_step(state.costs, self.gpu, self.calibration, tokens_per_rank=tokens,
                            busy_ranks=occ.busy_ranks, prompt_tokens=new)

    # -- predictions ---------------------------------------------------------------------------------
    def predict(self, topology: Topology, role: Role, *, isl: int, osl: int, concurrency: int,
                cached_tokens: float = 0.0) -> ServingMetrics:
        if isl < 1 or osl < 1 or concurrency < 1:
            raise ConfigError(f"isl, osl and concurrency must be >= 1 (got {isl}, {osl}, {concurrency})",
                              field="workload", fix="give positive token counts and concurrency")
        if role is Role.DECODE:
            return self._decode(topology, isl, osl, concurrency)
        if role is Role.PREFILL:
            return self._prefill(topology, isl, concurrency, _new_tokens(isl, cached_tokens))
        return self._aggregated(topology, isl, osl, concurrency, _new_tokens(isl, cached_tokens))

    def predict_with_parts(self, topology: Topology, role: Role, *, isl: int, osl: int, concurrency: int,
                           cached_tokens: float = 0.0) -> tuple[ServingMetrics, LatencyParts]:
        """`predict` and `latency_parts` together (an aggregated instance's steady state is solved once)."""
        if isl < 1 or osl < 1 or concurrency < 1:
            raise ConfigError(f"isl, osl and concurrency must be >= 1 (got {isl}, {osl}, {concurrency})",
                              field="workload", fix="give positive token counts and concurrency")
        new = _new_tokens(isl, cached_tokens)
        if role is Role.DECODE:
            return self._decode_parts(topology, isl, osl, concurrency)
        if role is Role.PREFILL:
            return self._prefill_parts(topology, isl, concurrency, new)
        return self._aggregated_parts(topology, isl, osl, concurrency, new)

    def latency_parts(self, topology: Topology, role: Role, *, isl: int, osl: int, concurrency: int,
                      cached_tokens: float = 0.0) -> LatencyParts:
        """What a request's TTFT and ITL are made of at this load (the spread of a length mix scales them)."""
        new = _new_tokens(isl, cached_tokens)
        if role is Role.DECODE:
            return self._decode_parts(topology, isl, osl, concurrency)[1]
        if role is Role.PREFILL:
            return self._prefill_parts(topology, isl, concurrency, new)[1]
        return self._aggregated_parts(topology, isl, osl, concurrency, new)[1]

    def _decode_parts(self, topology: Topology, isl: int, osl: int,
                      concurrency: int) -> tuple[ServingMetrics, LatencyParts]:
        """A decode point and its latency parts from one step (TTFT: wait, KV transfer, first step)."""
        state = self.state(topology, Role.DECODE, isl=isl, osl=osl)
        m = self._decode(topology, isl, osl, concurrency)
        transfer = self.kv_transfer_ms(state, isl)
        steps = max(osl - 1, 0) / accepted_tokens(topology.mtp, self.calibration.mtp_acceptance)
        return m, LatencyParts(wait_ms=max(0.0, m.ttft_ms_mean - transfer - m.itl_ms_mean), prompt_ms=transfer,
                               front_ms=0.0, first_token_ms=m.itl_ms_mean, itl_plain_ms=m.itl_ms_mean,
                               itl_chunk_ms=m.itl_ms_mean, chunk_share=0.0, decode_steps=steps)

    def _prefill_parts(self, topology: Topology, isl: int, concurrency: int,
                       new: int) -> tuple[ServingMetrics, LatencyParts]:
        """A prefill point and its latency parts from one step (TTFT: wait, its own chunks, front end)."""
        front = self.front_end_ms(isl)
        m, step, occ = self._prefill_solved(topology, isl, concurrency, new)
        prompt = step.step_ms * max(1.0, occ.per_rank * new / topology.max_num_batched_tokens)
        return m, LatencyParts(wait_ms=max(0.0, m.ttft_ms_mean - front - prompt), prompt_ms=prompt, front_ms=front,
                               first_token_ms=0.0, itl_plain_ms=0.0, itl_chunk_ms=0.0, chunk_share=0.0,
                               decode_steps=0.0)

    def _aggregated_parts(self, topology: Topology, isl: int, osl: int, concurrency: int,
                          new: int) -> tuple[ServingMetrics, LatencyParts]:
        front = self.front_end_ms(isl)
        steady = self._steady(topology, concurrency, isl, osl, new)
        m = self._aggregated(topology, isl, osl, concurrency, new, steady)
        point = steady.point
        # the mean step mixes chunk and plain steps: the plain one falls out of it (no step priced again)
        share = point.chunk_share
        plain = ((point.mean_step_ms - share * point.chunk_step_ms) / (1.0 - share) if share < 1.0
                 else point.chunk_step_ms)
        accepted = accepted_tokens(topology.mtp, self.calibration.mtp_acceptance)
        prompt = point.prefill_steps * point.chunk_step_ms
        return m, LatencyParts(wait_ms=max(0.0, m.ttft_ms_mean - front - prompt), prompt_ms=prompt,
                               front_ms=front, first_token_ms=0.0, itl_plain_ms=plain / accepted,
                               itl_chunk_ms=point.chunk_step_ms / accepted, chunk_share=point.chunk_share,
                               decode_steps=point.decode_steps)

    def service_capacity(self, topology: Topology, role: Role, *, isl: int, osl: int,
                         cached_tokens: float = 0.0) -> tuple[float, float]:
        """(requests served at once at capacity, requests/s then): an open-loop queue's servers and its rate.
        A prefill instance serves prompts through its token budget, so its servers are budget / prompt per rank."""
        new = _new_tokens(isl, cached_tokens)
        if role is Role.PREFILL:
            state = self.state(topology, Role.PREFILL, isl=isl, osl=1)
            slots = topology.dp * max(1.0, topology.max_num_batched_tokens / new)
            level = max(1, int(min(state.cap_per_rank * topology.dp, 4 * slots)))
            return slots, self._prefill(topology, isl, level, new).request_throughput_rps
        full = self.capacity(topology, role, isl=isl, osl=osl)
        rate = (self._decode(topology, isl, osl, full) if role is Role.DECODE
                else self._aggregated(topology, isl, osl, full, new)).request_throughput_rps
        return float(full), rate

    def front_end_ms(self, isl: int) -> float:
        """Time to first token spent outside the GPU: API server, tokenizer, scheduler admission."""
        cal = self.calibration
        return cal.request_overhead_ms + cal.tokenize_us_per_token * 1e-3 * isl

    def front_end_output_ms(self) -> float:
        """Time the front end spends on one request's output of an engine step (the replay's output lag)."""
        return self.calibration.front_end_output_us * 1e-3

    def front_end_core_ms(self, stream_interval: int) -> tuple[float, float]:
        """The part of an engine step that runs on its front end's core (`front_end_core_share` of the step's host
        time): (per step, per decoding request), milliseconds; the replay shares that core with the front end."""
        cal = self.calibration
        share = cal.front_end_core_share
        return share * cal.step_overhead_ms, share * request_step_us(cal, stream_interval) * 1e-3

    def _mixed(self, topo: Topology, isl: int, osl: int, busy: int,
               new: int | None = None) -> Callable[[float, float], MixedStep]:
        state = self.state(topo, Role.BOTH, isl=isl, osl=osl)
        prompt = isl if new is None else new
        costs, cal = state.costs, self.calibration

        def step(decode_requests: float, chunk_tokens: float) -> MixedStep:
            return mixed_step(costs, self.gpu, cal, decode_requests_per_rank=decode_requests,
                              total_decode_requests=decode_requests * busy, context_tokens=isl + osl / 2,
                              mtp_depth=topo.mtp, chunk_tokens_per_rank=chunk_tokens, busy_ranks=busy,
                              prompt_tokens=prompt, stream_interval=topo.stream_interval)

        return step

    def aggregated_point(self, topo: Topology, concurrency: int, *, isl: int, osl: int) -> AggregatedPoint:
        """The chunked-prefill steady state of an aggregated instance with `concurrency` clients."""
        return self._steady(topo, concurrency, isl, osl).point

    def burst_run(self, topo: Topology, prompts: int, *, isl: int, osl: int) -> BurstRun:
        """`prompts` requests sent at once to an aggregated instance, run to the last token (per DP rank)."""
        return self._burst(topo, prompts, isl, osl)[1]

    def _steady(self, topo: Topology, concurrency: int, isl: int, osl: int, new: int | None = None) -> _Steady:
        """State, occupancy and steady point of an aggregated instance, computed once per prediction; `new` of
        each prompt's tokens are prefilled (the rest are prefix-cache hits)."""
        state = self.state(topo, Role.BOTH, isl=isl, osl=osl)
        occ = self.occupancy(state, topo, concurrency)
        prompt = isl if new is None else new
        accepted = accepted_tokens(topo.mtp, self.calibration.mtp_acceptance)
        point = solve_aggregated(self._mixed(topo, isl, osl, occ.busy_ranks, prompt),
                                 requests_per_rank=occ.per_rank, isl=prompt, osl=osl, accepted=accepted,
                                 tokens_per_request=1 + topo.mtp, token_budget=topo.max_num_batched_tokens)
        return _Steady(state, occ, point)

    def _burst(self, topo: Topology, prompts: int, isl: int, osl: int) -> tuple[_Steady, BurstRun]:
        steady = self._steady(topo, prompts, isl, osl)
        run = solve_burst(self._mixed(topo, isl, osl, steady.occupancy.busy_ranks), steady.point,
                          prompts=prompts / steady.occupancy.busy_ranks, isl=isl,
                          token_budget=topo.max_num_batched_tokens, tokens_per_request=1 + topo.mtp)
        return steady, run

    def predict_burst(self, topology: Topology, *, isl: int, osl: int, prompts: int) -> ServingMetrics:
        """What `vllm bench serve --request-rate inf --num-prompts N` measures on an aggregated instance:
        tokens over the run's duration (admission at the steady state's pace, then the decode-only tail), the
        mean TPOT over requests and the mean TTFT. `concurrency` in the result is the prompt count."""
        if isl < 1 or osl < 1 or prompts < 1:
            raise ConfigError(f"isl, osl and prompts must be >= 1 (got {isl}, {osl}, {prompts})",
                              field="workload", fix="give positive token counts and prompts")
        steady, run = self._burst(topology, prompts, isl, osl)
        rps = prompts / (run.duration_ms / 1e3)
        itl_ms = run.tpot_ms / accepted_tokens(topology.mtp, self.calibration.mtp_acceptance)
        return ServingMetrics.from_rates(
            concurrency=prompts, num_gpus=topology.num_gpus, isl=isl, osl=osl, request_rps=rps,
            ttft_ms=run.ttft_ms + self.front_end_ms(isl), itl_ms=itl_ms,
            max_concurrency=steady.state.memory.max_concurrency_instance, running=steady.occupancy.running)

    def _aggregated(self, topo: Topology, isl: int, osl: int, concurrency: int,
                    new: int | None = None, steady: _Steady | None = None) -> ServingMetrics:
        steady = steady or self._steady(topo, concurrency, isl, osl, new)
        occ, point = steady.occupancy, steady.point
        gpu_rps = point.requests_per_s * occ.busy_ranks
        in_system_ms = max(concurrency / gpu_rps * 1e3, point.service_ms)  # Little's law, queue included
        front_ms = self.front_end_ms(isl)
        rps = concurrency / (in_system_ms + front_ms) * 1e3  # closed loop: clients also wait on the front end
        ttft_ms = in_system_ms - point.service_ms + front_ms + point.prefill_steps * point.chunk_step_ms
        itl_ms = point.mean_step_ms / accepted_tokens(topo.mtp, self.calibration.mtp_acceptance)
        return ServingMetrics.from_rates(
            concurrency=concurrency, num_gpus=topo.num_gpus, isl=isl, osl=osl, request_rps=rps, ttft_ms=ttft_ms,
            itl_ms=itl_ms, max_concurrency=steady.state.memory.max_concurrency_instance, running=occ.running)

    def _decode(self, topo: Topology, isl: int, osl: int, concurrency: int) -> ServingMetrics:
        state = self.state(topo, Role.DECODE, isl=isl, osl=osl)
        occ = self.occupancy(state, topo, concurrency)
        step = decode_step(state.costs, self.gpu, self.calibration, requests_per_rank=occ.per_rank,
                           total_requests=occ.running, context_tokens=isl + osl / 2, mtp_depth=topo.mtp,
                           stream_interval=topo.stream_interval)
        itl_ms = step.itl_ms
        busy_s = osl * itl_ms / 1e3  # one request's decode time once it runs
        rps = occ.running / busy_s
        wait_ms = max(0.0, concurrency / rps - busy_s) * 1e3  # Little's law: the queue ahead of the KV cache
        transfer_ms = self.kv_transfer_ms(state, isl)
        return ServingMetrics.from_rates(
            concurrency=concurrency, num_gpus=topo.num_gpus, isl=isl, osl=osl, request_rps=rps,
            ttft_ms=wait_ms + transfer_ms + itl_ms, itl_ms=itl_ms,
            max_concurrency=state.memory.max_concurrency_instance, running=occ.running)

    def kv_transfer_ms(self, state: InstanceState, isl: int) -> float:
        """The prompt's KV (and recurrent state) over the prefill -> decode link."""
        t = state.costs.target
        kv_bytes = isl * (t.kv_bytes_per_token + t.window_kv_bytes_per_token + t.index_kv_bytes_per_token)
        link_bytes_s = state.costs.kv_link_bytes_s * self.calibration.kv_transfer_efficiency
        return (kv_bytes + t.state_bytes) / link_bytes_s * 1e3

    def _prefill(self, topo: Topology, isl: int, concurrency: int, new: int | None = None) -> ServingMetrics:
        return self._prefill_solved(topo, isl, concurrency, isl if new is None else new)[0]

    def _prefill_solved(self, topo: Topology, isl: int, concurrency: int,
                        new: int) -> tuple[ServingMetrics, PrefillStep, Occupancy]:
        state = self.state(topo, Role.PREFILL, isl=isl, osl=1)
        occ = self.occupancy(state, topo, concurrency)
        tokens = min(topo.max_num_batched_tokens, occ.per_rank * new)
        step = prefill_step(state.costs, self.gpu, self.calibration, tokens_per_rank=tokens,
                            busy_ranks=occ.busy_ranks, prompt_tokens=new)
        rps = occ.busy_ranks * tokens / new / (step.step_ms / 1e3)
        ttft_ms = concurrency / rps * 1e3 + self.front_end_ms(isl)  # Little's law: queued or running
        return ServingMetrics.from_rates(
            concurrency=concurrency, num_gpus=topo.num_gpus, isl=isl, osl=1, request_rps=rps, ttft_ms=ttft_ms,
            itl_ms=0.0, max_concurrency=state.memory.max_concurrency_instance, running=occ.running), step, occ
