"""The running requests in steady decode, held as one batch so a step or a stretch of steps costs O(1).

Once a request has computed its prompt and sampled its first token, every step that schedules it gains the same
`accepted` tokens as every other decoding request (vLLM 0.32 vllm/v1/core/sched/scheduler.py
`Scheduler.schedule` gives each running decode 1 + its drafts, `update_from_output` keeps the accepted ones). So
the batch keeps one counter `g`, and a member's generated tokens are `g - r.g0`. What a step needs is kept
summed, instead of a pass over every member:
- the decode context the step cost model prices: sum(prompt - g0) + n g;
- the next completion: a heap on output_tokens + g0;
- the KV blocks the members hold. After the step that ends at counter g a member holds
  ceil((u + g) / block_size) + its state blocks (`KVCacheManager.allocate_slots` allocates num_computed_tokens +
  1 + drafts + lookahead slots), u its own constant. Written u = base * bs + phase, the sum over the members is
  sum(base + 1 + state) + n (g // bs) + #{phase > bs - g mod bs}: a count in a sorted list of phases. A member
  that joined holding more blocks than that (a PD decode's prompt blocks) is counted on its own until the
  formula reaches its blocks;
- the next block of a member's answer that completes a cached unit (a session's history; vLLM caches a step's
  full blocks when it schedules the step, `allocate_slots` -> `cache_blocks` up to num_tokens, the sampled token
  included): a heap on the counter value at the end of that step.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right, insort

from tuner.replay._requests import EngineRequest

_EPS = 1e-9


class DecodeSet:
    """The decoding members of one engine's running list, as offsets from one counter (see the module doc)."""

    __slots__ = ("accepted", "base_sum", "blocks", "bs", "excess", "finish", "g", "joins", "members", "n", "phases",
                 "shift", "state", "sum_pg", "units", "warm")

    def __init__(self, block_size: int, state_blocks: int, q: int, lookahead: int, accepted: float) -> None:
        self.bs = block_size
        self.state = state_blocks
        self.accepted = accepted
        # slots a member holds after the step ending at g: prompt + generated - 1 (its computed tokens) + the
        # last step's tokens past them (1 + drafts - accepted) + the MTP lookahead
        self.shift = q + lookahead - accepted - 1.0
        self.clear()

    def clear(self) -> None:
        self.g = 0.0
        self.n = 0
        self.warm = 0  # members replayed as warm-up (not measured)
        self.sum_pg = 0.0  # sum of prompt - g0
        self.blocks = 0  # blocks the members hold, as the pool counted them
        self.base_sum = 0  # sum of base + 1 + state over the members counted by phase
        self.phases: list[float] = []
        self.excess: list[EngineRequest] = []
        self.finish: list[tuple[float, int, EngineRequest]] = []
        self.units: list[tuple[float, int, EngineRequest]] = []
        self.joins: list[int] = []
        self.members: dict[int, EngineRequest] = {}

    # -- members -----------------------------------------------------------------------------------
    def enter(self, r: EngineRequest) -> None:
        """`r` (running, first token sampled, decoding) joins at the current counter, holding r.blocks."""
        g = self.g
        r.g0 = g0 = g - r.generated
        r.g_entry = g
        u = r.prompt_tokens - g0 + self.shift - _EPS
        r.d_base = base = int(u // self.bs)
        r.d_phase = phase = u - base * self.bs
        self.n += 1
        self.warm += r.warmup
        self.sum_pg += r.prompt_tokens - g0
        self.blocks += r.blocks
        if r.blocks > self._formula(r, g):
            self.excess.append(r)
        else:
            self._count(r, phase)
        self.members[r.join] = r
        insort(self.joins, r.join)
        heapq.heappush(self.finish, (r.output_tokens + g0, r.join, r))
        r.in_decode = True
        self.watch_units(r)

    def _count(self, r: EngineRequest, phase: float) -> None:
        insort(self.phases, phase)
        self.base_sum += r.d_base + 1 + self.state

    def _formula(self, r: EngineRequest, g: float) -> int:
        gq, gm = divmod(g, self.bs)
        return r.d_base + 1 + self.state + int(gq) + (r.d_phase > self.bs - gm)

    def held(self, r: EngineRequest) -> int:
        """The blocks member `r` holds now."""
        if self.g == r.g_entry:
            return r.blocks
        return max(r.blocks, self._formula(r, self.g))

    def leave(self, r: EngineRequest) -> None:
        """`r` leaves the batch with its state written back (generated, computed, blocks)."""
        g = self.g
        blocks = self.held(r)
        r.generated = g - r.g0
        r.computed = r.prompt_tokens + r.generated - 1.0
        r.own_blocks += blocks - r.blocks
        r.blocks = blocks
        r.in_decode = False
        self.n -= 1
        self.warm -= r.warmup
        self.sum_pg -= r.prompt_tokens - r.g0
        self.blocks -= blocks
        if r in self.excess:
            self.excess.remove(r)
        else:
            phases = self.phases
            del phases[bisect_right(phases, r.d_phase) - 1]
            self.base_sum -= r.d_base + 1 + self.state
        del self.members[r.join]
        self.joins.remove(r.join)
        if not self.n:
            self.clear()

    def watch_units(self, r: EngineRequest) -> None:
        """Heap the counter value at the end of the step that caches r's next cacheable unit, if it has one left:
        the step that starts with r's num_tokens (prompt + g - g0) covering the unit."""
        if r.units and r.published < len(r.units):
            end = r.published_end + r.units[r.published][1] * self.bs
            heapq.heappush(self.units, (end - r.prompt_tokens + r.g0 + self.accepted - _EPS, r.join, r))

    # -- what the next steps need ------------------------------------------------------------------
    def context_sum(self) -> float:
        return self.sum_pg + self.n * self.g

    def before(self, join: int) -> int:
        """Members ahead of the running request admitted as `join`."""
        return bisect_right(self.joins, join)

    def left_min(self) -> float:
        """Output tokens the first member to finish still has to generate."""
        finish = self.finish
        while not (finish[0][2].in_decode and finish[0][2].join == finish[0][1]):
            heapq.heappop(finish)
        return finish[0][0] - self.g

    def blocks_at(self, g: float) -> int:
        """The blocks the members hold after the step ending at counter g."""
        gq, gm = divmod(g, self.bs)
        counted = len(self.phases)
        total = self.base_sum + counted * int(gq) + counted - bisect_right(self.phases, self.bs - gm)
        for r in self.excess:
            total += max(r.blocks, self._formula(r, g))
        return total

    def units_due(self, g: float) -> bool:
        return bool(self.units) and self.units[0][0] <= g + 1e-6

    # -- advancing ---------------------------------------------------------------------------------
    def advance(self, g: float, blocks: int) -> None:
        """The counter moves to g (the pool gave the members `blocks - self.blocks` new blocks)."""
        self.g = g
        self.blocks = blocks
        if self.excess:
            for r in [r for r in self.excess if self._formula(r, g) >= r.blocks]:
                self.excess.remove(r)
                self._count(r, r.d_phase)

    def finished(self) -> list[EngineRequest]:
        """Members whose answer is complete at the current counter (not yet removed)."""
        out = []
        finish, g = self.finish, self.g
        while finish and finish[0][0] - _EPS <= g + 1e-6:
            _, join, r = heapq.heappop(finish)
            if not (r.in_decode and r.join == join):
                continue
            if g - r.g0 >= r.output_tokens - _EPS:
                out.append(r)
            else:  # float rounding put it a hair early: it finishes at a later step
                heapq.heappush(finish, (r.output_tokens + r.g0, join, r))
                break
        return out

    def units_now(self, g: float) -> list[EngineRequest]:
        """Members whose next unit the steps up to counter g may cache (the caller checks and publishes)."""
        out = []
        units = self.units
        while units and units[0][0] <= g + 1e-6:
            _, join, r = heapq.heappop(units)
            if r.in_decode and r.join == join:
                out.append(r)
        return out
