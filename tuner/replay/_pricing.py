"""The step time of the batch a replay step actually runs, from the step cost model (tuner/perf/_steps.py).

The per-topology constants (`InstanceCosts`) are computed once; a step is priced by the same `mixed_step`,
`decode_step` and `prefill_step` the analytic model uses, on that step's own decode count, decode context and
prefill chunk. Prices are memoised on the batch rounded to ~1% (context and chunk sizes on a log grid; decode
counts exact up to 64), so a replay of thousands of steps prices a few thousand distinct batches; the memo is
shared by pricers of the same step costs, topology and role.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

from tuner.hardware import GpuSpec
from tuner.perf._calibration import Calibration
from tuner.perf._costs import InstanceCosts
from tuner.perf._steps import accepted_tokens, decode_step, mixed_step, prefill_step
from tuner.topology import Role, Topology

_GRID = 100.0  # log-grid points per e-fold (~1% apart)


def _bucket(x: float) -> int:
    return 0 if x < 1.0 else int(math.log(x) * _GRID + 0.5) + 1


def _unbucket(b: int) -> float:
    return 0.0 if b == 0 else math.exp((b - 1) / _GRID)


def _count_bucket(n: int) -> int:
    return n if n <= 64 else 64 + _bucket(n)


def _uncount(b: int) -> float:
    return float(b) if b <= 64 else _unbucket(b - 64)


_SHARED_PRICERS = 32
_shared: OrderedDict[tuple, tuple[tuple[object, ...], dict[tuple[int, int, int, int], float]]] = OrderedDict()


def _shared_memo(pricer: StepPricer) -> dict[tuple[int, int, int, int], float]:
    """The memo of an earlier pricer of the same step costs (the same objects, topology and role), so replays
    of one deployment (verification, the fewest instances for a rate, a service answering again) price each batch
    once; the last `_SHARED_PRICERS` are kept."""
    refs = (pricer.costs, pricer.gpu, pricer.calibration)
    key = (*map(id, refs), pricer.topology, pricer.role)
    found = _shared.get(key)
    if found is not None and all(a is b for a, b in zip(found[0], refs, strict=True)):
        _shared.move_to_end(key)
        return found[1]
    memo: dict[tuple[int, int, int, int], float] = {}
    _shared[key] = (refs, memo)
    while len(_shared) > _SHARED_PRICERS:
        _shared.popitem(last=False)
    return memo


@dataclass(slots=True)
class StepPricer:
    """Prices one DP rank's step; every rank of the instance is taken to run a batch like it (DP lockstep)."""

    costs: InstanceCosts
    gpu: GpuSpec
    calibration: Calibration
    topology: Topology
    role: Role
    _memo: dict[tuple[int, int, int, int], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._memo = _shared_memo(self)

    @property
    def accepted(self) -> float:
        """Tokens a decoding request gains per step: 1 + the expected accepted MTP drafts."""
        return accepted_tokens(self.topology.mtp, self.calibration.mtp_acceptance)

    def step_ms(self, decode_requests: int, decode_context: float, chunk_tokens: float,
                chunk_context: float) -> float:
        """One step with `decode_requests` decoding at mean context `decode_context` and `chunk_tokens` prompt
        tokens whose queries see `chunk_context` tokens on average (their cached prefix included)."""
        log = math.log  # the buckets of _bucket / _count_bucket, inline: a replay prices every step
        key = (decode_requests if decode_requests <= 64 else _count_bucket(decode_requests),
               0 if decode_context < 1.0 else int(log(decode_context) * _GRID + 0.5) + 1,
               0 if chunk_tokens < 1.0 else int(log(chunk_tokens) * _GRID + 0.5) + 1,
               0 if chunk_context < 1.0 else int(log(chunk_context) * _GRID + 0.5) + 1)
        price = self._memo.get(key)
        if price is None:
            price = self._memo[key] = self._price(_uncount(key[0]), _unbucket(key[1]), _unbucket(key[2]),
                                                  _unbucket(key[3]))
        return price

    def _price(self, decode: float, context: float, chunk: float, chunk_context: float) -> float:
        topo, cal = self.topology, self.calibration
        dp = topo.dp
        # the step model's causal chunk sees prompt_tokens / 2 on average: give it twice the chunk's mean context
        prompt = max(1, round(2 * chunk_context)) if chunk > 0 else 1
        if self.role is Role.PREFILL or (decode == 0 and chunk > 0 and self.role is not Role.BOTH):
            return prefill_step(self.costs, self.gpu, cal, tokens_per_rank=chunk, busy_ranks=dp,
                                prompt_tokens=max(prompt, round(chunk))).step_ms
        if chunk == 0 and self.role is Role.DECODE:
            return decode_step(self.costs, self.gpu, cal, requests_per_rank=decode, total_requests=decode * dp,
                               context_tokens=context, mtp_depth=topo.mtp,
                               stream_interval=topo.stream_interval).step_ms
        return mixed_step(self.costs, self.gpu, cal, decode_requests_per_rank=decode, total_decode_requests=decode * dp,
                          context_tokens=max(context, 1.0), mtp_depth=topo.mtp, chunk_tokens_per_rank=chunk,
                          busy_ranks=dp, prompt_tokens=max(prompt, round(chunk)),
                          stream_interval=topo.stream_interval).step_ms
