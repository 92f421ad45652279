"""One DP rank's KV block pool with vLLM's automatic prefix cache, counted in blocks.

What it follows (vLLM 0.32, vllm/v1/core/):
- block_pool.py `BlockPool`: a block freed by its last holder keeps its hash and joins the *end* of the free
  queue (`free_blocks` -> `free_block_queue.append_n`); new blocks are taken from the front (`get_new_blocks` ->
  `popleft_n`), evicting the cached hash of the least recently freed block first (`_maybe_evict_cached_block`).
  A cached block found again is taken off the free queue (`touch`), its reference count raised: shared blocks
  are held once, however many requests read them.
- kv_cache_manager.py `KVCacheManager.get_computed_blocks`: a hit is the longest run of the prompt's leading
  block hashes present in the cache, at most `num_tokens - 1` tokens (the last token is always recomputed for
  its logits).
- single_type_kv_cache_manager.py `get_num_blocks_to_allocate`: a cached block with no holder counts against the
  free blocks when a request takes it (it leaves the free queue).
- block_pool.py `BlockHashToBlockMap` (NOTE #1: no de-duplication) and `cache_full_blocks`: a request that computes
  a block whose hash is cached already (it was admitted with a shorter hit) caches its own copy under the same hash
  too; a lookup takes the oldest copy still cached (`get_one_block`), and a copy freed by its last holder joins the
  free queue's end like any cached block, so it outlives an evicted twin.

Granularity: a prompt's cacheable blocks come in *units* that share one key (a trace's hash id covers 512 tokens,
i.e. several vLLM blocks; a synthetic shared prefix is one unit), and a unit is cached and evicted whole (vLLM
evicts block by block, tail blocks first: a partly evicted unit would still give a shorter hit there).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(slots=True, eq=False)
class CachedUnit:
    """A run of full blocks under one key: `holders` requests reference it (0 = free but still cached). Compared
    by identity: two copies of one key are two units."""

    key: Hashable
    blocks: int
    holders: int = 0


class BlockPool:
    """Free blocks, cached units and the LRU order of the free cached ones."""

    __slots__ = ("evictable_blocks", "evicted_units", "free_blocks", "lru", "num_blocks", "units")

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.free_blocks = num_blocks  # neither held nor cached
        self.units: dict[Hashable, list[CachedUnit]] = {}  # a key's cached copies, oldest first
        self.lru: OrderedDict[CachedUnit, None] = OrderedDict()  # cached units nobody holds, oldest first
        self.evictable_blocks = 0
        self.evicted_units = 0

    @property
    def available_blocks(self) -> int:
        """What an allocation may take: free blocks plus cached blocks nobody holds (vLLM's get_num_free_blocks)."""
        return self.free_blocks + self.evictable_blocks

    @property
    def used_blocks(self) -> int:
        """Blocks some running request holds (vLLM's KV-cache usage)."""
        return self.num_blocks - self.available_blocks

    def lookup(self, units: tuple[tuple[Hashable, int], ...], max_blocks: int) -> list[CachedUnit]:
        """The cached units of the longest leading run of `units`, at most `max_blocks` blocks in all."""
        found: list[CachedUnit] = []
        total = 0
        cache = self.units
        for key, blocks in units:
            copies = cache.get(key)
            if copies is None or total + blocks > max_blocks:
                break
            found.append(copies[0])
            total += blocks
        return found

    @staticmethod
    def evictable_among(units: list[CachedUnit]) -> int:
        return sum(u.blocks for u in units if u.holders == 0)

    def hold(self, units: list[CachedUnit]) -> None:
        """A request takes cached units (touch): units nobody held leave the LRU queue."""
        for unit in units:
            if unit.holders == 0:
                del self.lru[unit]
                self.evictable_blocks -= unit.blocks
            unit.holders += 1

    def take(self, blocks: int) -> bool:
        """Allocate `blocks` fresh blocks, evicting the least recently freed cached units as needed."""
        if blocks > self.available_blocks:
            return False
        while self.free_blocks < blocks:
            unit, _ = self.lru.popitem(last=False)
            copies = self.units[unit.key]
            if copies[0] is unit:
                del copies[0]
                if not copies:
                    del self.units[unit.key]
            else:
                copies.remove(unit)
            self.evictable_blocks -= unit.blocks
            self.free_blocks += unit.blocks
            self.evicted_units += 1
        self.free_blocks -= blocks
        return True

    def publish(self, key: Hashable, blocks: int) -> CachedUnit:
        """A request computes a unit's blocks (already allocated to it): cache them under `key`, held by it; a key
        cached already gains a second copy (vLLM does not de-duplicate)."""
        unit = CachedUnit(key, blocks, 1)
        units = self.units
        if key in units:
            units[key].append(unit)
        else:
            units[key] = [unit]
        return unit

    def release(self, units: list[CachedUnit], own_blocks: int) -> None:
        """A request frees its blocks: its own ones become free, units it held drop a holder (cached, LRU)."""
        self.free_blocks += own_blocks
        for unit in reversed(units):  # vLLM frees in reverse order: tail blocks are evicted first
            unit.holders -= 1
            if unit.holders == 0:
                self.lru[unit] = None
                self.evictable_blocks += unit.blocks
