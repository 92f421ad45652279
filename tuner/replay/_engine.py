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
- A step's full blocks are cached when the step is scheduled, not once it has run: kv_cache_manager.py
  `KVCacheManager.allocate_slots` ends with `cache_blocks(request, min(num_computed_tokens + num_new_tokens,
  num_tokens))`. So a request admitted later in the same `schedule` pass hits the blocks a request ahead of it in
  the batch is computing in this very step (e.g. a preempted request re-admitted with part of a shared prefix
  still cached recomputes the rest, which the next admitted request hits), and a decode's block is cached by the
  step that starts with it full, its sampled token included.
  A request that computes a block cached already caches its own copy too (block_pool.py, see _kvcache.py).

Between events (an arrival, a completion, a chunk, the KV running out) a batch of decoding requests is advanced
in closed form: k steps at once, the step time linear in the growing context (priced at both ends). The decoding
requests are held as one batch (`DecodeSet`: offsets from one counter, their sums kept), so neither a stretch nor a
step that carries a prefill chunk passes over them one by one; a step that would preempt or run out of token
budget before the last decode writes the batch back and runs request by request (`_step_each`), with the same
rules. Caching a unit and evicting one commute (a cached key gains a copy, whatever the queue holds), so a stretch
takes its blocks at once and caches its units after (`_stretch_each` is the request-by-request reference).

Each step or stretch also counts the gaps between a measured request's streamed chunks (`TokenGaps`,
tuner/replay/_gaps.py): the batch's members got a token at the end of the step before, so each gap of theirs is
the step's time, counted once per member; a request that a step skipped or that was recomputed keeps the time of
its last token (`last_token_ms`) and its gap goes one by one.

With a front-end cost per output (`front_output_ms`, Calibration.front_end_output_us) the engine also runs its
front end as one FIFO server (vllm/v1/engine/async_llm.py `output_handler` takes each step's outputs in turn and
output_processor.py `process_outputs` handles them request by request before they reach their streams): a step
ending at t with n requests given a token frees it at max(free, t) + n x cost, and a request's first and last tokens
reach the client then (`first_seen_ms`, `finish_seen_ms`). A stretch of k steps of n requests does the same in
closed form: free = max(free + k n cost, max_j (end of step j + (k - j + 1) n cost)).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tuner.errors import ConfigError
from tuner.replay._decoding import DecodeSet
from tuner.replay._gaps import TokenGaps
from tuner.replay._kvcache import BlockPool
from tuner.replay._requests import EngineRequest

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
    stream_interval: int = 1  # the API server streams a request's tokens this many at a time (--stream-interval)


class Pricer(Protocol):
    """What an engine asks of its step pricer (`StepPricer`; the scheduler tests give a unit-time one)."""

    @property
    def accepted(self) -> float: ...

    def step_ms(self, decode_requests: int, decode_context: float, chunk_tokens: float,
                chunk_context: float) -> float: ...


@dataclass(frozen=True, slots=True)
class Sample:
    """The engine's state at the end of a step (or of a closed-form stretch of steps)."""

    t_ms: float
    waiting: int
    running: int
    kv_used: float  # share of the KV blocks running requests hold


class Engine:
    """The scheduler and KV cache of one DP rank; `advance` runs the next step (or stretch)."""

    def __init__(self, name: str, pricer: Pricer, limits: SchedulerLimits, *,
                 transfer_ms: Callable[[EngineRequest], float] | None = None, front_output_ms: float = 0.0,
                 shared_host_ms: tuple[float, float] = (0.0, 0.0)) -> None:
        self.name = name
        self.pricer = pricer
        self.limits = limits
        self.pool = BlockPool(limits.num_blocks)
        self.clock = 0.0
        self.waiting: deque[EngineRequest] = deque()
        self.running: list[EngineRequest] = []
        self.transferring: list[EngineRequest] = []  # PD decode: blocks held, KV on its way
        self.transfer_ms = transfer_ms
        self._samples: list[tuple[float, int, int, int]] = []  # (t_ms, waiting, running, used blocks) per step
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
        self._prices: tuple[int, float, float] | None = None  # this stretch's (k, first step, growth), once asked
        self._max_seqs = limits.max_num_seqs
        self._max_tokens = limits.max_num_batched_tokens
        self.decode = DecodeSet(limits.block_size, limits.state_blocks, self._q, limits.mtp, self.accepted)
        self._joins = 0
        self.gaps = TokenGaps(limits.stream_interval, self.accepted)  # streamed chunks' gaps (measured requests)
        self._regular = 0  # this step's gaps of one step time (requests that got a token in the step before)
        self._pending: list[EngineRequest] = []  # joined the batch after a step that skipped them
        self.front_output_ms = front_output_ms  # the front end's time per request output of a step (0: none)
        self.front_free_ms = -math.inf  # when the front end has handed on every output so far
        self._outputs = 0  # this step's request outputs (requests given a token), with a front-end cost
        self._firsts: list[EngineRequest] = []  # this step's first tokens, with a front-end cost
        # the step's host time on the front end's core (per step, per decoding request; ms): shared with the front
        # end while it is busy (`_share_core`); only with a front-end cost (else it is never busy)
        self._host_step_ms, self._host_request_ms = shared_host_ms
        self.shares_core = front_output_ms > 0 and (shared_host_ms[0] > 0 or shared_host_ms[1] > 0)
        self._core_extra = 0.0  # each step's time on the shared core beyond its price, over this stretch

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
    def samples(self) -> list[Sample]:
        """The engine's state at the end of every step or stretch."""
        n = self.pool.num_blocks
        return [Sample(t, w, r, used / n if n else 0.0) for t, w, r, used in self._samples]

    def sample_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`samples` as arrays: end times (ms), waiting, running, KV share used."""
        a = np.array(self._samples, dtype=float).reshape(-1, 4)
        n = self.pool.num_blocks
        return a[:, 0], a[:, 1], a[:, 2], a[:, 3] / n if n else a[:, 3] * 0.0

    @property
    def kv_usage(self) -> float:
        return self.pool.used_blocks / self.pool.num_blocks if self.pool.num_blocks else 0.0

    def add(self, request: EngineRequest, t_ms: float) -> None:
        """A request reaches this rank's waiting queue at `t_ms`; the engine takes it in (`queued_ms`) then, or when
        the step running at `t_ms` ends (see RequestRecord.queued_ms)."""
        if not (self.running or self.waiting or self.transferring) and t_ms > self.clock:
            self.clock = t_ms
        request.queued_ms = self.clock if self.clock > t_ms else t_ms
        self.waiting.append(request)

    # -- blocks ------------------------------------------------------------------------------------
    def _blocks_for(self, tokens: float) -> int:
        return -int(-(tokens - _EPS) // self.limits.block_size) if tokens > 0 else 0

    def _grow(self, r: EngineRequest, slots: float) -> bool:
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

    def _publish(self, r: EngineRequest, tokens: float) -> None:
        """Cache the request's units its first `tokens` tokens complete: a step's scheduled tokens, capped at the
        request's num_tokens, are cached when the step is scheduled (see the module doc), in scheduling order."""
        units = r.units
        bs = self.limits.block_size
        while r.published < len(units):
            key, blocks = units[r.published]
            end = r.published_end + blocks * bs
            if end > tokens + _EPS:
                return
            if self.limits.prefix_caching:
                r.held.append(self.pool.publish(key, blocks))
                r.own_blocks -= blocks
            r.published += 1
            r.published_end = end

    def _publish_step(self, r: EngineRequest, new: float) -> None:
        """Cache what a running request's scheduled step completes: its computed tokens and the step's `new`,
        capped at num_tokens (vLLM's `allocate_slots`: min(num_computed + num_new, num_tokens))."""
        end, tokens = r.computed + new, r.prompt_tokens + r.generated
        self._publish(r, end if end < tokens else tokens)

    def _free(self, r: EngineRequest) -> None:
        self.pool.release(r.held, r.own_blocks)
        r.held = []
        r.blocks = r.own_blocks = 0
        r.published = r.published_end = 0

    def _preempt(self) -> EngineRequest:
        victim = self.running.pop()
        self._free(victim)
        victim.computed = 0.0
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)
        return victim

    # -- one step ----------------------------------------------------------------------------------
    def advance(self, limit_ms: float) -> list[EngineRequest]:
        """Run the next step, or a closed-form stretch of decode steps ending at the first step end at or after
        `limit_ms` (or at the next event); returns the requests that finished."""
        if self.transferring:
            self._land_transfers()
        running = self.running
        waiting = self.waiting
        if running and (not waiting or len(running) >= self._max_seqs or not self._admissible(waiting[0])):
            k = self._stretch_length(limit_ms)
            if k >= 2:
                return self._stretch(k)
        return self._step(limit_ms)

    def _land_transfers(self) -> None:
        still = []
        for r in self.transferring:
            if r.ready_ms <= self.clock + _EPS:
                self._join(r)
            else:
                still.append(r)
        self.transferring = still

    def _join(self, r: EngineRequest) -> None:
        """Append to the running list, which stays in join order; the first time, the step starting now is the
        one that first schedules it (`scheduled_ms`, vLLM's SCHEDULED event: a preempted request's return is not)."""
        if r.scheduled_ms is None:
            r.scheduled_ms = self.clock
        r.join = self._joins
        self._joins += 1
        self.running.append(r)

    def _write_back(self) -> None:
        """Every decoding request leaves the batch with its own state (before a step run request by request); one
        that stepped in the batch got its last token when the last step ended (the clock)."""
        decode = self.decode
        for r in list(decode.members.values()):
            if decode.g != r.g_entry:
                r.last_token_ms = self.clock
            decode.leave(r)
        self._pending = []

    def _enter(self, r: EngineRequest) -> None:
        """`r` joins the decode batch; if the step that just ended skipped it, its next gap is its own."""
        self.decode.enter(r)
        if r.last_token_ms != self.clock:
            self._pending.append(r)  # _finish_batched does this inline

    def _members_gap(self, end_ms: float) -> int:
        """The batch's measured members' gaps in the step ending at `end_ms`, each the step's time (the count
        returned), bar the members a step before skipped: their gaps go one by one."""
        decode = self.decode
        regular = decode.n - decode.warm
        if self._pending:
            for r in self._pending:
                if r.in_decode and not r.warmup:
                    self.gaps.single.append(end_ms - r.last_token_ms)
                    regular -= 1
            self._pending = []
        return regular

    def _record(self, ms: float) -> None:
        """This step's gaps of one step time (`_regular`) as one entry."""
        self.gaps.runs.append((ms, 0.0, 0, 1, self._regular))
        self._regular = 0

    def _record_stretch(self, first: float, slope: float, k: int, regular: int, full: int) -> None:
        """A stretch's gaps: `regular` in its first step, `full` in the k - 1 after, the step times linear."""
        runs = self.gaps.runs
        if regular == full:
            if full:
                runs.append((first, slope, 0, k, full))
            return
        if regular:
            runs.append((first, slope, 0, 1, regular))
        if full:
            runs.append((first, slope, 1, k - 1, full))

    def _regroup(self) -> None:
        """Running requests that decode (first token sampled, only the last token to compute) join the batch."""
        for r in self.running:
            if not r.in_decode and r.generated >= 1 and r.prompt_tokens + r.generated - r.computed <= 1.0 + _EPS:
                self._enter(r)

    def _admissible(self, r: EngineRequest) -> bool:
        """Whether the head of the queue would be admitted now (blocks only; the caller checked the rest)."""
        if r.remote:
            return self._blocks_for(r.prompt_tokens + 1) + self.limits.state_blocks <= self.pool.available_blocks
        hits = self._hits(r)
        full = self._blocks_for(r.num_tokens) + self.limits.state_blocks
        for u in hits:
            if u.holders:
                full -= u.blocks
        return full <= self.pool.available_blocks

    def _hits(self, r: EngineRequest) -> list:
        if not self.limits.prefix_caching or not r.units:
            return []
        return self.pool.lookup(r.units, int(r.num_tokens - 1) // self.limits.block_size)

    def _step(self, limit_ms: float) -> list[EngineRequest]:
        if self.decode.n:
            done = self._step_batched()
            if done is not None:
                return done
            self._write_back()
        done = self._step_each(limit_ms)
        self._regroup()
        return done

    def _step_each(self, limit_ms: float) -> list[EngineRequest]:
        """One step, request by request (the reference the batched step must equal)."""
        lim = self.limits
        budget = float(lim.max_num_batched_tokens)
        threshold = lim.long_prefill_token_threshold if len(self.running) + len(self.waiting) > 1 else 0
        scheduled: list[tuple[EngineRequest, float, bool]] = []
        preempted = False
        running = self.running
        i = 0
        q, lookahead, bs, state = float(self._q), self._lookahead, self._bs, self._state
        while i < len(running) and budget > 0:
            r = running[i]
            tokens = r.prompt_tokens + r.generated
            decoding = tokens - r.computed <= 1.0 + _EPS
            new: float = q if decoding else math.ceil(tokens - r.computed - _EPS)
            if 0 < threshold < new:
                new = float(threshold)
            if new > budget:
                new = budget
            slots = r.computed + new + lookahead
            if decoding and r.blocks and slots <= (r.blocks - state) * bs + _EPS:  # no new block: the common case
                if r.units and r.published < len(r.units):
                    self._publish(r, tokens)
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
            if r.units and r.published < len(r.units):
                self._publish_step(r, new)
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
            new: float = math.ceil(r.num_tokens - hit_tokens - _EPS)
            if 0 < threshold < new:
                new = float(threshold)
            if budget < new:
                new = budget
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
            if r.units:
                self._publish(r, hit_tokens + new)
            if r.preemptions == 0:
                r.hit_tokens = hit_tokens
                self.prompt_tokens_queried += r.prompt_tokens
                self.prompt_tokens_hit += hit_tokens
            waiting.popleft()
            self._join(r)
            scheduled.append((r, float(new), False))
            budget -= new
        return budget

    def _idle(self, limit_ms: float) -> list[EngineRequest]:
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

    def _execute(self, scheduled: list[tuple[EngineRequest, float, bool]]) -> list[EngineRequest]:
        if self.log is not None:
            self.log.append({r.rid: new for r, new, _ in scheduled})
        before = self.clock
        ms = self._clock_step(scheduled, 0, 0.0)
        finished = [r for r, new, decoding in scheduled if self._update(r, new, decoding, before)]
        if self._regular:
            self._record(ms)
        return self._finish(finished)

    def _update(self, r: EngineRequest, new: float, decoding: bool, before: float) -> bool:
        """A scheduled request after the step that started at `before`: its tokens, first token, the gap since
        its last token (vLLM streams every step's new tokens at once); whether it finished (its units were
        cached when the step was scheduled)."""
        if decoding:
            r.generated += self.accepted if r.generated >= 1 else 1.0
            r.computed = r.prompt_tokens + r.generated - 1.0
        else:
            r.computed += new
            if r.computed < r.prompt_tokens + r.generated - _EPS:
                return False
            r.generated += 1.0
            r.computed = r.prompt_tokens + r.generated - 1.0
        if self.front_output_ms:
            self._outputs += 1
            if r.first_token_ms is None:
                self._firsts.append(r)
        if r.first_token_ms is None:
            r.first_token_ms = self.clock
        elif not r.warmup:
            if r.last_token_ms == before:
                self._regular += 1
            else:
                self.gaps.single.append(self.clock - r.last_token_ms)
        r.last_token_ms = self.clock
        return r.generated >= r.output_tokens - _EPS

    def _finish(self, finished: list[EngineRequest]) -> list[EngineRequest]:
        now = self.clock
        if finished:
            running = self.running
            for r in finished:
                running.remove(r)
                r.finish_ms = now
                self._free(r)
        if self.front_output_ms:
            self._front_step(finished)
        pool = self.pool
        self._samples.append((now, len(self.waiting), len(self.running), pool.num_blocks - pool.free_blocks
                              - pool.evictable_blocks))
        return finished

    def _front_step(self, finished: list[EngineRequest]) -> None:
        """The front end takes this step's outputs (after its earlier ones); its first and last tokens are seen
        when it is done."""
        if self._outputs:
            free = self.front_free_ms
            self.front_free_ms = (free if free > self.clock else self.clock) + self._outputs * self.front_output_ms
            self._outputs = 0
        seen = self.front_free_ms
        for r in self._firsts:
            r.first_seen_ms = seen
        self._firsts.clear()
        for r in finished:
            r.finish_seen_ms = seen

    def _front_stretch(self, before: float, first: float, slope: float, k: int, n: int) -> None:
        """The front end over a stretch of k steps of n outputs each, step j (1..k) ending at before + j first +
        slope j (j - 1) / 2: free_k = max(free_0 + k c, max_j (end_j + (k - j + 1) c)), c = n x cost. end_j - j c
        is convex in j when slope >= 0 (its largest at j = 1 or k), else largest at the integers by its vertex."""
        c = n * self.front_output_ms
        if not c:
            return
        js = {1, k}
        if slope < 0:
            vertex = (c - first) / slope + 0.5
            for j in (math.floor(vertex), math.ceil(vertex)):
                if 1 <= j <= k:
                    js.add(j)
        best = max(j * (first - c) + slope * j * (j - 1) / 2 for j in js)
        self.front_free_ms = max(self.front_free_ms + k * c, before + best + (k + 1) * c)

    # -- the front end's core, shared with the steps' host time --------------------------------------
    def _share_core(self, host_ms: float, step_ms: float) -> float:
        """A step starting now whose host part (`host_ms`, at most the step) runs on the core the front end is busy
        on: processor sharing, both at half speed until the shorter is done, so each ends min(backlog, host) later
        than alone (work-conserving); that delay (ms) is added to the front end here and to the step by the
        caller. The worker's part of the step runs on its own cores."""
        backlog = self.front_free_ms - self.clock
        if backlog <= 0.0:
            return 0.0
        if host_ms > step_ms:
            host_ms = step_ms
        delay = backlog if backlog < host_ms else host_ms
        self.front_free_ms += delay
        return delay

    def _shared_core_steps(self, limit_ms: float, k: int) -> int:
        """`_steps_until` for an engine sharing its front end's core: at most the steps that `_share_core` would
        delay alike (`_core_extra`, which `_stretch_prices` adds to each), so a stretch is linear as before."""
        k = self._uniform_core_steps(k)
        if k < 2:
            return k
        k = self._steps_until(limit_ms, k)
        while k >= 2:
            uniform = self._uniform_core_steps(k)  # its own price line
            if uniform == k:
                return k
            k = uniform
        return k

    def _uniform_core_steps(self, k: int) -> int:
        """How many of the next k decode steps (at most k) `_share_core` delays alike; that delay in `_core_extra`.

        The front end's lag behind the step ends, L_j = F_j - E_j, does not depend on the delays (each moves a
        step's end and the front end alike): L_j = max(L_{j-1} - m_j, 0) + c with m_j the steps' prices and c the
        outputs' cost, and step j's delay is min(L_{j-1}, h), h the host part (at most every m_j). With c >= h every
        lag after the first is at least h: all steps are delayed h if the first is. With c < h the lag falls (every
        m_j > c) as U_j = L_0 + j c - (m_1 + ... + m_j) until it stays at c: delays of h while U_j >= h, then at most
        one step between, then c from a lag of c on. Anything else: one step alone (then one of these holds)."""
        self._core_extra = 0.0
        n = self.decode.n
        host = self._host_step_ms + self._host_request_ms * n
        first, slope = self._stretch_prices(k)
        if host > first or host > first + slope * (k - 1):
            return 1  # the host part is capped by each step's price (`_share_core`): not alike
        lag = self.front_free_ms - self.clock
        c = n * self.front_output_ms
        if lag >= host:  # (host > 0: a running request, or a cost per step)
            self._core_extra = host
            if c >= host:
                return k
            lo, hi = 0, k - 1  # the last j in 0..k-1 with U_j >= h (U_0 = L_0 >= h; U falls)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if lag - host + mid * (c - first) - slope * mid * (mid - 1) / 2 >= 0.0:
                    lo = mid
                else:
                    hi = mid - 1
            return lo + 1
        if c < host and abs(lag - c) <= 1e-9 * max(1.0, abs(self.clock)):
            self._core_extra = c  # the lag stays at c: every step delayed c
            return k
        return 1

    # -- closed form between events ---------------------------------------------------------------
    def _stretch_length(self, limit_ms: float) -> int:
        """Steps every running request can decode, alike, before anything changes (0/1: take a single step)."""
        n = len(self.running)
        decode = self.decode
        if decode.n != n or n * self._q > self._max_tokens:
            return 0  # a request still prefilling (every decoding one is in the batch)
        a = self.accepted
        k_done = math.ceil(decode.left_min() / a - _EPS)
        self._stretch_context = decode.context_sum() / n
        self._prices = None
        pool = self.pool
        spare = (pool.free_blocks + pool.evictable_blocks) // n  # pool.available_blocks
        k_blocks = int(spare * self._bs / a)
        k = k_done if k_done <= k_blocks else k_blocks
        if self.transferring:
            first = min(r.ready_ms for r in self.transferring)
            if first < limit_ms:
                limit_ms = first
        if k < 2:
            return k
        if self.shares_core:
            return self._shared_core_steps(limit_ms, k)
        return self._steps_until(limit_ms, k)  # at most k

    def _stretch_prices(self, k: int) -> tuple[float, float]:
        """(first step's time, its growth per step) of the stretch `_stretch_length` just measured."""
        known = self._prices
        if known is not None and known[0] == k:
            return known[1] + self._core_extra, known[2]
        n = len(self.running)
        ctx = self._stretch_context
        first = known[1] if known is not None else self.pricer.step_ms(n, ctx, 0.0, 0.0)
        last = self.pricer.step_ms(n, ctx + (k - 1) * self.accepted, 0.0, 0.0)
        slope = (last - first) / (k - 1) if k > 1 else 0.0
        self._prices = (k, first, slope)
        return first + self._core_extra, slope

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
            d = b * b + 2 * slope * gap
            steps = math.ceil((-b + math.sqrt(d if d > 0.0 else 0.0)) / slope)
        if steps > k:
            return k
        return steps if steps >= 1 else 1

    def _stretch(self, k: int) -> list[EngineRequest]:
        decode = self.decode
        g = decode.g + k * self.accepted
        blocks = decode.blocks_at(g)
        before, first, slope = self._stretch_clock(k)
        if self.front_output_ms:
            self._front_stretch(before, first - self._core_extra, slope, k, decode.n)
            self.front_free_ms += k * self._core_extra
        full = decode.n - decode.warm
        if self._pending:
            self._record_stretch(first, slope, k, self._members_gap(before + first), full)
        elif full:
            self.gaps.runs.append((first, slope, 0, k, full))  # _record_stretch, inline: the common case
        if blocks != decode.blocks and not self.pool.take(blocks - decode.blocks):  # bounded: cannot fail
            raise AssertionError("replay: a closed-form stretch ran out of KV blocks")
        decode.advance(g, blocks)
        return self._finish(self._decoded())

    def _stretch_clock(self, k: int) -> tuple[float, float, float]:
        """Move the clock over k steps; (the clock before, the first step's time, its growth per step)."""
        first, slope = self._stretch_prices(k)
        before = self.clock
        ms = k * first + slope * k * (k - 1) / 2
        if self.log is not None:
            self.log.extend({r.rid: float(self._q) for r in self.running} for _ in range(k))
        self.clock += ms
        self.busy_ms += ms
        self.steps += k
        return before, first, slope

    def _decoded(self) -> list[EngineRequest]:
        """After the batch advanced: publish the units its requests completed, take out the finished ones."""
        decode = self.decode
        if decode.units:
            self._publish_batch(self._units_due(decode.g), decode.g - self.accepted)
        finish = decode.finish
        if finish and finish[0][0] - _EPS <= decode.g + 1e-6:  # DecodeSet.finished's test, ahead of the call
            return self._leave_finished()
        return []

    def _units_due(self, g: float) -> list[EngineRequest]:
        """The batch's members whose steps up to the one ending at counter g cache a unit, in running order."""
        decode = self.decode
        return sorted(decode.units_now(g), key=_join_order) if decode.units_due(g) else []

    def _publish_batch(self, due: list[EngineRequest], g_start: float) -> None:
        """Cache what the members' num_tokens at counter `g_start` (their last step's start) complete."""
        decode = self.decode
        for r in due:
            self._publish(r, r.prompt_tokens + (g_start - r.g0))
            decode.watch_units(r)

    def _leave_finished(self) -> list[EngineRequest]:
        """The batch's finished requests, out of it with their state, in running order."""
        decode = self.decode
        finished = decode.finished()
        if finished:
            finished.sort(key=_join_order)
            for r in finished:
                decode.leave(r)
        return finished

    def _stretch_each(self, k: int) -> list[EngineRequest]:
        """A stretch, request by request (the reference the batched stretch must equal)."""
        before, first, slope = self._stretch_clock(k)
        if self.front_output_ms:
            self._front_stretch(before, first - self._core_extra, slope, k, len(self.running))
            self.front_free_ms += k * self._core_extra
        gained = k * self.accepted
        finished = []
        lookahead = self._q + self._lookahead - self.accepted  # slots of the last step past its computed tokens
        regular = full = 0
        for r in self.running:
            if not r.warmup:
                full += 1
                if r.last_token_ms == before:
                    regular += 1
                else:
                    self.gaps.single.append(before + first - r.last_token_ms)
            r.last_token_ms = self.clock
            r.generated += gained
            r.computed = r.prompt_tokens + r.generated - 1.0
            if not self._grow(r, r.computed + lookahead):  # bounded by _stretch_length: cannot fail
                raise AssertionError("replay: a closed-form stretch ran out of KV blocks")
            if r.units and r.published < len(r.units):
                self._publish(r, r.prompt_tokens + r.generated - self.accepted)  # num_tokens at the last step
            if r.generated >= r.output_tokens - _EPS:
                finished.append(r)
        self._record_stretch(first, slope, k, regular, full)
        return self._finish(finished)

    # -- a step with the decode batch held together -------------------------------------------------
    def _step_batched(self) -> list[EngineRequest] | None:
        """The step `_step_each` would run, when it preempts nothing and every decode gets its tokens: the
        batch's requests take 1 + drafts tokens each; the others (prefilling, or a PD decode's first step)
        are scheduled one by one in their place in the running order; then admission. None: run it one by one."""
        plan = self._plan_others()
        if plan is None:
            return None
        others, budget, need = plan
        decode = self.decode
        g = decode.g + self.accepted
        blocks = decode.blocks_at(g)
        if blocks - decode.blocks + need > self.pool.available_blocks:
            return None  # someone would be preempted
        self.pool.take(blocks - decode.blocks)
        for r, _, _, slots in others:
            self._grow(r, slots)
        threshold = self._threshold()
        scheduled = [(r, new, decoding) for r, new, decoding, _ in others]
        if scheduled or decode.units_due(g):
            self._publish_scheduled(scheduled, g)
        self._admit(budget, threshold, scheduled)
        before = self.clock
        ms = self._execute_batched(scheduled)
        self._regular += self._members_gap(self.clock) if self._pending else decode.n - decode.warm
        if self.front_output_ms:
            self._outputs += decode.n
        decode.advance(g, blocks)
        return self._finish_batched(scheduled, before, ms)

    def _threshold(self) -> int:
        lim = self.limits
        return lim.long_prefill_token_threshold if len(self.running) + len(self.waiting) > 1 else 0

    def _plan_others(self) -> tuple[list, int, int] | None:
        """The running requests outside the batch, in order, with their tokens and slots; the budget left after
        everyone running; the blocks they need. None when the budget runs out before the last running request."""
        decode, running = self.decode, self.running
        q, lookahead, bs, state = self._q, self._lookahead, self._bs, self._state
        threshold = self._threshold()
        if 0 < threshold < q:
            return None
        outside = len(running) - decode.n
        others: list[tuple[EngineRequest, float, bool, float]] = []
        if outside:
            for r in reversed(running):
                if not r.in_decode:
                    others.append((r, 0.0, False, 0.0))
                    if len(others) == outside:
                        break
            others.reverse()
        budget = self.limits.max_num_batched_tokens
        spent = need = 0
        for index, (r, _, _, _) in enumerate(others):
            left = budget - spent - q * decode.before(r.join)
            if left <= 0:
                return None
            tokens = r.prompt_tokens + r.generated
            decoding = tokens - r.computed <= 1.0 + _EPS
            new = q if decoding else math.ceil(tokens - r.computed - _EPS)
            if 0 < threshold < new:
                new = threshold
            if new > left:
                new = left
            slots = r.computed + new + lookahead
            if not (r.blocks and slots <= (r.blocks - state) * bs + _EPS):
                need += max(0, self._blocks_for(slots) + state - r.blocks)
            others[index] = (r, new, decoding, slots)
            spent += new
        left = budget - spent - q * decode.n
        return (others, left, need) if left >= 0 else None

    def _publish_scheduled(self, scheduled: list[tuple[EngineRequest, float, bool]], g: float) -> None:
        """The running requests' units this step caches, before admission and in running order: the batch's
        (its step ends at counter g) and the others' (their scheduled tokens, capped at num_tokens)."""
        due = self._units_due(g)
        if due:
            order = sorted([(r.join, r, None) for r in due] + [(r.join, r, new) for r, new, _ in scheduled])
        else:
            order = [(0, r, new) for r, new, _ in scheduled]
        for _, r, new in order:
            if new is None:
                self._publish_batch([r], g - self.accepted)
            elif r.units and r.published < len(r.units):
                self._publish_step(r, new)

    def _execute_batched(self, scheduled: list[tuple[EngineRequest, float, bool]]) -> float:
        """Price and clock the step: the batch's decodes from its sums, the others one by one; its time."""
        decode = self.decode
        if self.log is not None:
            batch = sorted([(r.join, r.rid, new) for r, new, _ in scheduled]
                           + [(j, r.rid, float(self._q)) for j, r in decode.members.items()])
            self.log.append({rid: new for _, rid, new in batch})
        return self._clock_step(scheduled, decode.n, decode.context_sum())

    def _clock_step(self, scheduled: list[tuple[EngineRequest, float, bool]], decode_n: int,
                    context: float) -> float:
        """Price one step (`decode_n` decodes of summed context `context` besides the scheduled requests) and
        move the clock by it; its time."""
        chunk = 0.0
        chunk_context = 0.0
        for r, new, decoding in scheduled:
            if decoding:
                decode_n += 1
                context += r.prompt_tokens + r.generated
            else:
                chunk += new
                chunk_context += new * (r.computed + new / 2)
        ms = self.pricer.step_ms(decode_n, context / decode_n if decode_n else 0.0, chunk,
                                 chunk_context / chunk if chunk else 0.0)
        if self.shares_core:
            ms += self._share_core(self._host_step_ms + self._host_request_ms * decode_n, ms)
        self.clock += ms
        self.busy_ms += ms
        self.steps += 1
        return ms

    def _finish_batched(self, scheduled: list[tuple[EngineRequest, float, bool]], before: float,
                        ms: float) -> list[EngineRequest]:
        """The others' tokens, the finished (in running order), and the requests that now decode joining the
        batch."""
        done = [r for r, new, decoding in scheduled if self._update(r, new, decoding, before)]
        if self._regular:
            self._record(ms)
        finished = self._leave_finished()
        if done:
            finished = sorted(finished + done, key=_join_order) if finished else done
        decode, clock = self.decode, self.clock
        for r, _, _ in scheduled:
            if r.generated >= 1 and r.prompt_tokens + r.generated - r.computed <= 1.0 + _EPS and r not in done:
                decode.enter(r)  # _enter, inline
                if r.last_token_ms != clock:
                    self._pending.append(r)
        return self._finish(finished)


def _join_order(r: EngineRequest) -> int:
    return r.join
