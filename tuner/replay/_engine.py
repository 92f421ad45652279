"""One DP rank of one vLLM instance, stepped as vLLM 0.32's V1 scheduler steps it.

Each rule cites vLLM 0.32's source (vllm/v1/core/sched/scheduler.py `Scheduler.schedule` unless named):
- Running requests first, in order, each given `num_tokens_with_spec - num_computed_tokens` tokens (a decode:
  1 + the MTP drafts; a prefill: the rest of its prompt), capped by `long_prefill_token_threshold` when more than
  one request is eligible, and by the step's token budget (`max_num_scheduled_tokens` = max-num-batched-tokens).
- A running request whose blocks cannot be allocated (`KVCacheManager.allocate_slots` returns None) preempts the
  last running request (`self.running.pop()`, FCFS policy), again until it fits or is itself the victim;
  `_preempt_request` frees the victim's blocks, resets `num_computed_tokens` to 0 and puts it at the *front* of
  the waiting queue (`prepend_request`): it is recomputed (prompt plus the tokens it had generated), reusing its
  own blocks still in the prefix cache.
- Waiting requests are admitted only when no request was preempted this step, while the budget lasts and
  running < max-num-seqs (`max_num_active_reqs`), FCFS: the first one that does not fit stops admission
  (`break`). A new request first looks up its prefix-cache hit (`_get_local_prefix_cache_hit` ->
  `get_computed_blocks`); admission needs blocks for its whole sequence (`full_sequence_must_fit`, the default
  `scheduler_reserve_full_isl=True` in vllm/config/scheduler.py), cached blocks nobody holds included
  (kv_cache_manager.py `allocate_slots`), then allocates this chunk's slots plus the MTP lookahead
  (`num_lookahead_tokens`).
- A step whose chunk completes the prompt samples a token (the first token); a decode step gains 1 + the
  expected accepted drafts (vllm/v1/core/sched/scheduler.py `update_from_output`: rejected drafts are dropped).
- Full blocks are cached as they are computed (`cache_blocks` in `allocate_slots`), so a request arriving while
  a shared prefix is being prefilled can already hit its finished blocks.

Between events (an arrival, a completion, a chunk, the KV running out) a batch of decoding requests is advanced
in closed form: k steps at once, the step time linear in the growing context (priced at both ends).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from tuner.errors import ConfigError
from tuner.replay._kvcache import BlockPool
from tuner.replay._pricing import StepPricer
from tuner.replay._requests import ReplayRequest

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class SchedulerLimits:
    """The scheduler's flags for one DP rank."""

    max_num_seqs: int
    max_num_batched_tokens: int
    long_prefill_token_threshold: int = 0
    block_size: int = 16
    num_blocks: int = 1
    mtp: int = 0
    prefix_caching: bool = True
    state_blocks: int = 0  # blocks a request holds for its GDN/Mamba state, whatever its length


@dataclass(frozen=True, slots=True)
class Sample:
    """The engine's state at the end of a step (or of a closed-form stretch of steps)."""

    t_ms: float
    waiting: int
    running: int
    kv_used: float  # share of the KV blocks running requests hold


class Engine:
    """The scheduler and KV cache of one DP rank; `advance` runs the next step (or stretch)."""

    def __init__(self, name: str, pricer: StepPricer, limits: SchedulerLimits, *,
                 transfer_ms: Callable[[ReplayRequest], float] | None = None) -> None:
        self.name = name
        self.pricer = pricer
        self.limits = limits
        self.pool = BlockPool(limits.num_blocks)
        self.clock = 0.0
        self.waiting: deque[ReplayRequest] = deque()
        self.running: list[ReplayRequest] = []
        self.transferring: list[ReplayRequest] = []  # PD decode: blocks held, KV on its way
        self.transfer_ms = transfer_ms
        self.samples: list[Sample] = []
        self.steps = 0
        self.busy_ms = 0.0
        self.preemptions = 0
        self.prompt_tokens_queried = 0
        self.prompt_tokens_hit = 0
        self.accepted = pricer.accepted
        self._q = 1 + limits.mtp  # tokens a decode schedules: the sampled one plus the drafts
        self._lookahead = limits.mtp
        self.log: list[dict[int, float]] | None = None  # each step's batch {request id: tokens}, when set
        self._bs = limits.block_size
        self._state = limits.state_blocks
        self._stretch_context = 0.0

    # -- state -------------------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.transferring)

    @property
    def waiting_count(self) -> int:
        return len(self.waiting)

    @property
    def running_count(self) -> int:
        return len(self.running) + len(self.transferring)

    @property
    def kv_usage(self) -> float:
        return self.pool.used_blocks / self.pool.num_blocks if self.pool.num_blocks else 0.0

    def add(self, request: ReplayRequest, t_ms: float) -> None:
        """A request reaches this rank's waiting queue at `t_ms`."""
        if not self.has_work:
            self.clock = max(self.clock, t_ms)
        self.waiting.append(request)

    # -- blocks ------------------------------------------------------------------------------------
    def _blocks_for(self, tokens: float) -> int:
        return -int(-(tokens - _EPS) // self.limits.block_size) if tokens > 0 else 0

    def _grow(self, r: ReplayRequest, slots: float) -> bool:
        if slots <= (r.blocks - self._state) * self._bs + _EPS and r.blocks:
            return True
        need = self._blocks_for(slots) + self._state - r.blocks
        if need <= 0:
            return True
        if not self.pool.take(need):
            return False
        r.blocks += need
        r.own_blocks += need
        return True

    def _publish(self, r: ReplayRequest) -> None:
        """Cache the request's units its computed tokens now cover (vLLM caches full blocks as computed)."""
        units = r.units
        bs = self.limits.block_size
        while r.published < len(units):
            key, blocks = units[r.published]
            end = r.published_end + blocks * bs
            if end > r.computed + _EPS:
                return
            if self.limits.prefix_caching:
                unit = self.pool.publish(key, blocks)
                if unit is not None:
                    r.held.append(unit)
                    r.own_blocks -= blocks
            r.published += 1
            r.published_end = end

    def _free(self, r: ReplayRequest) -> None:
        self.pool.release(r.held, r.own_blocks)
        r.held = []
        r.blocks = r.own_blocks = 0
        r.published = r.published_end = 0

    def _preempt(self) -> ReplayRequest:
        victim = self.running.pop()
        self._free(victim)
        victim.computed = 0.0
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    # -- one step ----------------------------------------------------------------------------------
    def advance(self, limit_ms: float) -> list[ReplayRequest]:
        """Run the next step, or a closed-form stretch of decode steps ending at the first step end at or after
        `limit_ms` (or at the next event); returns the requests that finished."""
        if self.transferring:
            self._land_transfers()
        running = self.running
        quiet = running and (not self.waiting or len(running) >= self.limits.max_num_seqs
                             or not self._admissible(self.waiting[0]))
        if quiet:
            k = self._stretch_length(limit_ms)
            if k >= 2:
                return self._stretch(k)
        return self._step(limit_ms)

    def _land_transfers(self) -> None:
        still = []
        for r in self.transferring:
            if r.ready_ms <= self.clock + _EPS:
                self.running.append(r)
            else:
                still.append(r)
        self.transferring = still

    def _admissible(self, r: ReplayRequest) -> bool:
        """Whether the head of the queue would be admitted now (blocks only; the caller checked the rest)."""
        if r.remote:
            return self._blocks_for(r.prompt_tokens + 1) + self.limits.state_blocks <= self.pool.available_blocks
        hits = self._hits(r)
        hit_blocks = sum(u.blocks for u in hits)
        full = (self._blocks_for(r.num_tokens) - hit_blocks + self.pool.evictable_among(hits)
                + self.limits.state_blocks)
        return full <= self.pool.available_blocks

    def _hits(self, r: ReplayRequest) -> list:
        if not self.limits.prefix_caching or not r.units:
            return []
        return self.pool.lookup(r.units, int(r.num_tokens - 1) // self.limits.block_size)

    def _step(self, limit_ms: float) -> list[ReplayRequest]:
        lim = self.limits
        budget = lim.max_num_batched_tokens
        threshold = lim.long_prefill_token_threshold if len(self.running) + len(self.waiting) > 1 else 0
        scheduled: list[tuple[ReplayRequest, float, bool]] = []
        preempted = False
        running = self.running
        i = 0
        q, lookahead, bs, state = float(self._q), self._lookahead, self._bs, self._state
        while i < len(running) and budget > 0:
            r = running[i]
            tokens = r.prompt_tokens + r.generated
            decoding = tokens - r.computed <= 1.0 + _EPS
            new = q if decoding else math.ceil(tokens - r.computed - _EPS)
            if 0 < threshold < new:
                new = threshold
            if new > budget:
                new = budget
            slots = r.computed + new + lookahead
            if decoding and r.blocks and slots <= (r.blocks - state) * bs + _EPS:  # no new block: the common case
                scheduled.append((r, new, True))
                budget -= new
                i += 1
                continue
            fits = True
            while not self._grow(r, slots):
                victim = self._preempt()
                preempted = True
                if victim is r:
                    fits = False
                    break
            if not fits:
                break
            scheduled.append((r, new, decoding))
            budget -= new
            i += 1
        if not preempted:
            budget = self._admit(budget, threshold, scheduled)
        if not scheduled:
            return self._idle(limit_ms)
        return self._execute(scheduled)

    def _admit(self, budget: float, threshold: int, scheduled: list) -> float:
        lim, pool, bs = self.limits, self.pool, self.limits.block_size
        waiting = self.waiting
        while budget > 0 and waiting and len(self.running) < lim.max_num_seqs:
            r = waiting[0]
            if r.remote:  # PD decode: all the prompt's blocks now, then the KV transfer (no tokens this step)
                if not self._grow(r, r.prompt_tokens + 1):
                    break
                waiting.popleft()
                r.computed = r.prompt_tokens - 1.0
                r.ready_ms = self.clock + (self.transfer_ms(r) if self.transfer_ms else 0.0)
                self.transferring.append(r)
                continue
            hits = self._hits(r) if r.computed == 0 else []
            hit_blocks = sum(u.blocks for u in hits)
            hit_tokens = hit_blocks * bs
            new = math.ceil(r.num_tokens - hit_tokens - _EPS)
            if 0 < threshold < new:
                new = threshold
            new = min(new, budget)
            full = (self._blocks_for(r.num_tokens) - hit_blocks + pool.evictable_among(hits)
                    + lim.state_blocks)
            if full > pool.available_blocks:
                break
            pool.hold(hits)
            r.held = list(hits)
            r.blocks = hit_blocks
            r.own_blocks = 0
            r.computed = float(hit_tokens)
            r.published = len(hits)
            r.published_end = hit_tokens
            if not self._grow(r, hit_tokens + new + self._lookahead):
                pool.release(r.held, r.own_blocks)
                r.held, r.blocks, r.own_blocks, r.computed = [], 0, 0, 0.0
                r.published = r.published_end = 0
                break
            if r.preemptions == 0:
                r.hit_tokens = hit_tokens
                self.prompt_tokens_queried += r.prompt_tokens
                self.prompt_tokens_hit += hit_tokens
            waiting.popleft()
            self.running.append(r)
            scheduled.append((r, float(new), False))
            budget -= new
        return budget

    def _idle(self, limit_ms: float) -> list[ReplayRequest]:
        """Nothing could run: wait for a KV transfer to land, or the request can never fit."""
        if self.transferring:
            self.clock = max(self.clock, min(min(r.ready_ms for r in self.transferring), max(limit_ms, self.clock)))
            return []
        if self.waiting and not self.running:
            r = self.waiting[0]
            raise ConfigError(
                f"a request of {r.prompt_tokens:,} prompt tokens needs {self._blocks_for(r.num_tokens):,} KV blocks; "
                f"{self.name} has {self.pool.num_blocks:,}", field="workload",
                fix="shorten the longest requests or give the instance more KV cache (more GPUs, higher "
                    "--gpu-memory-utilization)")
        return []

    def _execute(self, scheduled: list[tuple[ReplayRequest, float, bool]]) -> list[ReplayRequest]:
        decode_n = 0
        context = 0.0
        chunk = 0.0
        chunk_context = 0.0
        for r, new, decoding in scheduled:
            if decoding:
                decode_n += 1
                context += r.prompt_tokens + r.generated
            else:
                chunk += new
                chunk_context += new * (r.computed + new / 2)
        if self.log is not None:
            self.log.append({r.rid: new for r, new, _ in scheduled})
        ms = self.pricer.step_ms(decode_n, context / decode_n if decode_n else 0.0, chunk,
                                 chunk_context / chunk if chunk else 0.0)
        self.clock += ms
        self.busy_ms += ms
        self.steps += 1
        now = self.clock
        a = self.accepted
        finished = []
        for r, new, decoding in scheduled:
            if decoding:
                r.generated += a if r.generated >= 1 else 1.0
                r.computed = r.prompt_tokens + r.generated - 1.0
            else:
                r.computed += new
                if r.computed < r.prompt_tokens + r.generated - _EPS:
                    self._publish(r)
                    continue
                r.generated += 1.0
                r.computed = r.prompt_tokens + r.generated - 1.0
            if r.first_token_ms is None:
                r.first_token_ms = now
            if r.units and r.published < len(r.units):
                self._publish(r)
            if r.generated >= r.output_tokens - _EPS:
                finished.append(r)
        return self._finish(finished)

    def _finish(self, finished: list[ReplayRequest]) -> list[ReplayRequest]:
        now = self.clock
        if finished:
            done = {id(r) for r in finished}
            self.running = [r for r in self.running if id(r) not in done]
            for r in finished:
                r.finish_ms = now
                self._free(r)
        self.samples.append(Sample(now, len(self.waiting), len(self.running), self.kv_usage))
        return finished

    # -- closed form between events ---------------------------------------------------------------
    def _stretch_length(self, limit_ms: float) -> int:
        """Steps every running request can decode, alike, before anything changes (0/1: take a single step)."""
        running = self.running
        n = len(running)
        if n * self._q > self.limits.max_num_batched_tokens:
            return 0
        a = self.accepted
        k_done = 1 << 30
        context = 0.0
        for r in running:
            tokens = r.prompt_tokens + r.generated
            if r.generated < 1 or tokens - r.computed > 1.0 + _EPS:
                return 0
            context += tokens
            left = r.output_tokens - r.generated
            if left < k_done * a:
                k_done = math.ceil(left / a - _EPS)
        self._stretch_context = context / n
        spare = self.pool.available_blocks // n
        k_blocks = int(spare * self.limits.block_size / a)
        k = min(k_done, k_blocks)
        if self.transferring:
            first = min(r.ready_ms for r in self.transferring)
            limit_ms = min(limit_ms, first)
        if k < 2:
            return k
        return min(k, self._steps_until(limit_ms, k))

    def _stretch_prices(self, k: int) -> tuple[float, float]:
        """(first step's time, its growth per step) of the stretch `_stretch_length` just measured."""
        n = len(self.running)
        ctx = self._stretch_context
        first = self.pricer.step_ms(n, ctx, 0.0, 0.0)
        last = self.pricer.step_ms(n, ctx + (k - 1) * self.accepted, 0.0, 0.0)
        return first, (last - first) / (k - 1) if k > 1 else 0.0

    def _steps_until(self, limit_ms: float, k: int) -> int:
        """The first step count whose end reaches `limit_ms` (at most k), step time linear in the context."""
        gap = limit_ms - self.clock
        if gap <= 0:
            return 1
        if math.isinf(gap):
            return k
        first, slope = self._stretch_prices(k)
        # k' first + slope k'(k'-1)/2 >= gap
        if abs(slope) < 1e-12:
            steps = math.ceil(gap / first)
        else:
            b = first - slope / 2
            steps = math.ceil((-b + math.sqrt(max(0.0, b * b + 2 * slope * gap))) / slope)
        return max(1, min(k, steps))

    def _stretch(self, k: int) -> list[ReplayRequest]:
        first, slope = self._stretch_prices(k)
        ms = k * first + slope * k * (k - 1) / 2
        if self.log is not None:
            self.log.extend({r.rid: float(self._q) for r in self.running} for _ in range(k))
        self.clock += ms
        self.busy_ms += ms
        self.steps += k
        gained = k * self.accepted
        finished = []
        lookahead = self._q + self._lookahead - self.accepted  # slots of the last step past its computed tokens
        for r in self.running:
            r.generated += gained
            r.computed = r.prompt_tokens + r.generated - 1.0
            if not self._grow(r, r.computed + lookahead):  # bounded by _stretch_length: cannot fail
                raise AssertionError("replay: a closed-form stretch ran out of KV blocks")
            if r.units and r.published < len(r.units):
                self._publish(r)
            if r.generated >= r.output_tokens - _EPS:
                finished.append(r)
        return self._finish(finished)
