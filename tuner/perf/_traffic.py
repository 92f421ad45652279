"""A workload's latency distribution on one instance: length mixes, prefix-cache hits and open-loop queueing.

The step model prices the typical request (the mean lengths, minus the prefix cache's hits); this layer spreads
that over the mix, as vLLM serves it:
- TTFT of a request with prompt x: the queue ahead of it + its own prefill (scaled by its uncached tokens
  against the typical one's) + the front end (tokenising scales with x). Closed loop: the queue is Little's
  law's mean, the same for everyone. Open loop (Poisson): an M/G/c queue with c the requests served at once at
  capacity and Sakasegawa's approximation of its waiting probability, an exponential tail past it
  (Allen-Cunneen for the service-time variability); at or past capacity the queue grows without bound and the
  level is reported as saturated, with no latency.
- ITL of a request: the mean of its decode steps; in an aggregated instance `chunk_share` of steps also carry a
  prefill chunk, so a request of n steps sees Binomial(n, share) of them (a normal approximation): short
  answers feel the interference of long prompts most.
Percentiles are read from the deterministic samples of the distributions (tuner.workload), so a fixed workload
gives p50 = p90 = p99 = the mean, exactly as before.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from statistics import NormalDist

import numpy as np

from tuner.metrics import SKETCH_PROBABILITIES, ServingMetrics
from tuner.perf._roofline import LatencyParts, RooflineModel
from tuner.topology import Role, Topology
from tuner.workload import Workload

_P = np.array(SKETCH_PROBABILITIES)
SATURATION = 0.995  # utilisation past which an open-loop level is called saturated


@dataclass(frozen=True)
class SaturatedLevel:
    """An open-loop rate the instance cannot sustain: TTFT grows for as long as the load lasts."""

    offered_rps: float
    capacity_rps: float

    def describe(self) -> str:
        return (f"{self.offered_rps:g} req/s offered > {self.capacity_rps:.3g} req/s capacity: the queue and TTFT "
                "grow without bound")


@dataclass(frozen=True)
class TrafficCurve:
    points: list[ServingMetrics] = field(default_factory=list)
    saturated: list[SaturatedLevel] = field(default_factory=list)


def prefix_hit_share(perf: RooflineModel, topo: Topology, role: Role, workload: Workload, *,
                     cache_aware: bool = True, replicas: int = 1) -> float:
    """Input-token share the prefix caches serve, over `replicas` instances behind a router (`cache_aware`:
    vllm-router's consistent hashing on the prefix, else round robin or random). A DP rank has its own cache; vLLM
    balances DP ranks by load, not by prefix, so within an instance the ranks act as round robin. The decode role
    of a PD pair computes no prompt: its hits only save transfer, which is not modelled (0)."""
    if role is Role.DECODE or (workload.trace is None and workload.prefix is None):
        return 0.0
    state = perf.state(topo, role, isl=workload.isl, osl=1 if role is Role.PREFILL else workload.osl)
    cache_tokens = state.memory.num_gpu_blocks * state.memory.layout.block_size
    return workload.prefix_hit_share(cache_tokens, ranks=topo.dp * replicas, cache_aware=cache_aware and topo.dp == 1)


def predict_traffic(perf: RooflineModel, topo: Topology, role: Role, workload: Workload, *,
                    cache_aware: bool = True, replicas: int = 1,
                    until: Callable[[ServingMetrics], bool] | None = None,
                    rates_seen: dict[tuple[int, float], float] | None = None) -> TrafficCurve:
    """Every load level of `workload` on one instance (of `replicas` behind a router, each getting its share of
    an open-loop rate: the levels are per instance); open-loop levels past capacity come back saturated.

    `until`: the levels come in ascending load; the first one it is true of ends the curve (left out), e.g. the
    first that breaks an SLA, since latency only grows with load (tuner.perf.LevelLimits).

    `rates_seen`: closed-loop rates already predicted for this (topology, role, lengths), by (clients, cached
    tokens); the open-loop search reads and fills it (a sweep over instance counts asks for the same ones)."""
    isl, osl = workload.isl, workload.osl
    osl_role = 1 if role is Role.PREFILL else osl
    hit = prefix_hit_share(perf, topo, role, workload, cache_aware=cache_aware, replicas=replicas)
    cached = hit * workload.input_tokens.expected
    mix = _Mix.of(workload)
    curve = TrafficCurve()
    if not workload.open_loop:
        for c in workload.concurrency:
            if workload.is_fixed and role is not Role.BOTH:  # every request alike, steady steps: no spread
                point = _uniform(perf.predict(topo, role, isl=isl, osl=osl_role, concurrency=c))
            else:
                mean, parts = perf.predict_with_parts(topo, role, isl=isl, osl=osl_role, concurrency=c,
                                                      cached_tokens=cached)
                point = _spread(mean, parts, mix, role, hit, wait=None)
            if until is not None and until(point):
                break
            curve.points.append(point)
        return curve
    servers, capacity = perf.service_capacity(topo, role, isl=isl, osl=osl_role, cached_tokens=cached)
    for rate in workload.request_rates:
        if rate >= SATURATION * capacity:
            curve.saturated.append(SaturatedLevel(rate, capacity))
            continue
        c = _concurrency_at(perf, topo, role, isl, osl_role, cached, rate, {} if rates_seen is None else rates_seen)
        mean, parts = perf.predict_with_parts(topo, role, isl=isl, osl=osl_role, concurrency=c, cached_tokens=cached)
        wait = _poisson_wait(rate, capacity, servers, _service_scv(workload, role))
        point = _spread(_at_rate(mean, rate), parts, mix, role, hit, wait=wait, offered_rps=rate)
        if until is not None and until(point):
            break
        curve.points.append(point)
    return curve


def _at_rate(m: ServingMetrics, rate: float) -> ServingMetrics:
    """A stable open-loop level serves what it is offered: rates scale to `rate` (latencies are set apart)."""
    scale = rate / m.request_throughput_rps if m.request_throughput_rps > 0 else 0.0
    return m.model_copy(update={
        "request_throughput_rps": rate, "total_tok_s": m.total_tok_s * scale, "output_tok_s": m.output_tok_s * scale,
        "total_tok_s_per_gpu": m.total_tok_s_per_gpu * scale, "output_tok_s_per_gpu": m.output_tok_s_per_gpu * scale})


def _concurrency_at(perf: RooflineModel, topo: Topology, role: Role, isl: int, osl: int, cached: float,
                    rate: float, seen: dict[tuple[int, float], float]) -> int:
    """The smallest client count whose closed-loop rate reaches `rate` (the requests in service at that rate);
    `seen` holds the closed-loop rates already predicted, by (clients, cached tokens)."""

    def rate_at(clients: int) -> float:
        key = (clients, cached)
        found = seen.get(key)
        if found is None:
            found = seen[key] = perf.predict(topo, role, isl=isl, osl=osl, concurrency=clients,
                                             cached_tokens=cached).request_throughput_rps
        return found

    cap = perf.capacity(topo, role, isl=isl, osl=osl)
    lo, hi = 1, max(1, cap)
    single = rate_at(lo)
    if single >= rate:
        return lo
    # A batch never serves each client faster than one alone, so c clients reach at most c x one's rate: the
    # answer is at least rate / single. At the light per-instance rates of a sweep over instance counts that bound
    # is usually the answer, checked with its neighbour (two predictions instead of ~10 bisection steps); the
    # bisection below only runs within what the check left open, so the answer is the same.
    guess = min(hi, max(2, math.ceil(rate / single)))
    if rate_at(guess) >= rate:
        hi = guess
        if rate_at(guess - 1) < rate:
            return guess
    else:
        lo = guess
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if rate_at(mid) >= rate:
            hi = mid
        else:
            lo = mid
    return hi


def _service_scv(workload: Workload, role: Role) -> float:
    """Squared coefficient of variation of a request's service time: its prompt (prefill) or answer (decode)."""
    lengths = workload.input_tokens.points if role is Role.PREFILL else workload.output_tokens.points
    mean = float(lengths.mean())
    return float(lengths.var() / mean**2) if mean > 0 else 0.0


@dataclass(frozen=True)
class _Wait:
    """An M/G/c queue's wait: zero with probability 1 - p_wait, else exponential with mean `tail_mean_ms`."""

    p_wait: float
    tail_mean_ms: float

    def quantiles_ms(self, probabilities: np.ndarray) -> np.ndarray:
        waiting = probabilities > 1.0 - self.p_wait
        out = np.zeros_like(probabilities)
        if self.p_wait > 0:
            tail = (1.0 - probabilities[waiting]) / self.p_wait
            out[waiting] = -self.tail_mean_ms * np.log(np.maximum(tail, 1e-12))
        return out

    @property
    def mean_ms(self) -> float:
        return self.p_wait * self.tail_mean_ms


def _poisson_wait(rate: float, capacity_rps: float, servers: float, service_scv: float) -> _Wait:
    """Sakasegawa (1977): P(wait) ~ rho^(sqrt(2(c+1)) - 1); the mean wait of those who wait is
    S / (c (1 - rho)) scaled by (1 + cs^2) / 2 (Allen-Cunneen), with S = c / capacity the time a server takes."""
    c = max(1.0, servers)
    rho = rate / capacity_rps
    p_wait = min(1.0, rho ** (math.sqrt(2.0 * (c + 1.0)) - 1.0))
    service_ms = c / capacity_rps * 1e3
    tail = service_ms / (c * (1.0 - rho)) * (1.0 + service_scv) / 2.0
    return _Wait(p_wait, tail)


@dataclass(frozen=True)
class _Mix:
    """A workload's lengths as the spread reads them, built once per prediction (a fixed length is one value)."""

    inputs: np.ndarray
    outputs: np.ndarray
    isl: int
    osl: int
    fixed: bool
    z: np.ndarray  # standard-normal draws per output length (the chunk-share spread)
    output_steps: np.ndarray  # each output length's decode steps after the first token, before MTP (outputs - 1)
    _new: dict[float, np.ndarray] = field(default_factory=dict, compare=False)
    _ends: dict[float, np.ndarray] = field(default_factory=dict, compare=False)

    def new_tokens(self, hit: float) -> np.ndarray:
        """Each prompt's tokens left to compute after `hit` of them came from the prefix cache (ascending)."""
        found = self._new.get(hit)
        if found is None:
            found = self._new[hit] = np.maximum(1.0, self.inputs * (1.0 - hit))
        return found

    def quantile_ends(self, hit: float) -> np.ndarray:
        """(2, sketch) the prompts each sketch quantile interpolates between (lower row, upper row): the spread
        prices both rows in one pass, every level of a ladder reusing them."""
        found = self._ends.get(hit)
        if found is None:
            new = self.new_tokens(hit)
            lo, hi, _ = _positions(len(new))
            found = self._ends[hit] = np.stack([new[lo], new[hi]])
        return found

    @classmethod
    def of(cls, workload: Workload) -> _Mix:
        def reduced(points: np.ndarray) -> np.ndarray:
            values = points.astype(float)
            return values[:1] if values[0] == values[-1] else values  # points are sorted

        outputs = reduced(workload.output_tokens.points)
        return cls(reduced(workload.input_tokens.points), outputs, workload.isl, workload.osl, workload.is_fixed,
                   _normal_quantiles(len(outputs)), outputs - 1.0)


def _spread(mean: ServingMetrics, parts: LatencyParts, mix: _Mix, role: Role, hit: float, *,
            wait: _Wait | None, offered_rps: float | None = None) -> ServingMetrics:
    """The typical request's prediction spread over the workload's lengths (and an open-loop wait).

    Closed loop, a request's TTFT rises with its prompt (the prompts are sorted), so the TTFT sample is already
    ascending and only the values its quantiles interpolate between are computed; without prefill chunks in the
    decode steps every request sees the mean ITL."""
    new = mix.new_tokens(hit)
    typical_new = max(1.0, mix.isl * (1.0 - hit))
    if wait is None:
        ttft_mean = mean.ttft_ms_mean
        if mix.fixed:
            ttft_q = _quantiles(new, ttft_mean)
        else:
            frac = _positions(len(new))[2]
            at = parts.wait_ms + (parts.prompt_ms * mix.quantile_ends(hit) / typical_new + parts.front_ms
                                  + parts.first_token_ms)
            ttft_q = tuple((at[0] + (at[1] - at[0]) * frac).tolist())
    else:  # every wait quantile with every prompt: independent draws
        own = parts.prompt_ms * new / typical_new + parts.front_ms + parts.first_token_ms
        grid = (np.arange(len(own)) + 0.5) / len(own)
        ttft = (wait.quantiles_ms(grid)[:, None] + own[None, :]).ravel()
        ttft_mean = float(ttft.mean())
        ttft_q = _quantiles(_order_statistics(ttft), None)
    if role is Role.PREFILL or parts.chunk_share == 0.0:
        itl_q = _quantiles(new, mean.itl_ms_mean)
    else:
        steps = np.maximum(1.0, mix.output_steps * parts.decode_steps / max(1.0, mix.osl - 1.0))
        share = parts.chunk_share
        sd = np.sqrt(share * (1.0 - share) / steps)
        shares = np.minimum(np.maximum(share + sd[:, None] * mix.z[None, :], 0.0), 1.0)  # np.clip, cheaper
        itl_q = _quantiles(np.sort((parts.itl_plain_ms + (parts.itl_chunk_ms - parts.itl_plain_ms) * shares).ravel()),
                           None)
    return mean.model_copy(update={
        "ttft_ms_mean": ttft_mean, "ttft_ms_p50": ttft_q[_I50], "ttft_ms_p90": ttft_q[_I90],
        "ttft_ms_p99": ttft_q[_I99], "itl_ms_p50": itl_q[_I50], "itl_ms_p90": itl_q[_I90], "itl_ms_p99": itl_q[_I99],
        "ttft_ms_sketch": ttft_q, "itl_ms_sketch": itl_q,
        "offered_rps": offered_rps, "prefix_hit_share": hit})


def _uniform(m: ServingMetrics) -> ServingMetrics:
    """Every request alike: each percentile is the mean."""
    return m.model_copy(update={"ttft_ms_p90": m.ttft_ms_p50, "itl_ms_p90": m.itl_ms_p50,
                                "ttft_ms_sketch": (m.ttft_ms_p50,) * len(SKETCH_PROBABILITIES),
                                "itl_ms_sketch": (m.itl_ms_p50,) * len(SKETCH_PROBABILITIES)})


@functools.cache
def _normal_quantiles(n_outputs: int) -> np.ndarray:
    """Standard-normal mid-quantiles: about 256 ITL draws over the output lengths' points."""
    k = max(4, 256 // max(1, n_outputs))
    normal = NormalDist()
    return np.array([normal.inv_cdf((i + 0.5) / k) for i in range(k)])


# The quantiles a point carries: its sketch, which holds p50, p90 and p99 too.
_PROBS = np.array(SKETCH_PROBABILITIES)
_I50, _I90, _I99 = (SKETCH_PROBABILITIES.index(p) for p in (0.5, 0.9, 0.99))


@functools.cache
def _positions(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Where each of _PROBS falls in an ascending sample of n: (lower index, upper index, fraction between)."""
    position = _PROBS * (n - 1)
    lo = np.floor(position).astype(int)
    return lo, np.minimum(lo + 1, n - 1), position - lo


def _order_statistics(values: np.ndarray) -> np.ndarray:
    """`values` with the order statistics _quantiles reads in place (np.partition): what a full sort would put
    there, at a fraction of a sort's cost on the n x n open-loop TTFT sample (a sort stays cheaper on the ~256 ITL
    draws)."""
    lo, hi, _ = _positions(len(values))
    return np.partition(values, np.union1d(lo, hi))


def _quantiles(sorted_values: np.ndarray, exact: float | None) -> tuple[float, ...]:
    """Quantiles at SKETCH_PROBABILITIES of an equal-weight sample, ascending or partitioned at the positions they
    read (_order_statistics), linear as numpy's default; `exact` when every request is alike (no interpolation
    drift)."""
    if exact is not None:
        return (exact,) * len(SKETCH_PROBABILITIES)
    lo, hi, frac = _positions(len(sorted_values))
    values = sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac
    return tuple(values.tolist())
