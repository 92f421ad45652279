"""Pareto fronts and prefill/decode (xPyD) composition: pure functions on the shared ServingMetrics schema.

The inputs are plain curves of (Topology, ServingMetrics), predicted or measured alike. Composition follows
the reference campaign: x prefill instances feed y decode instances; x is the smallest count whose request
rate covers the decode instances' rate, and per-GPU throughput counts every GPU of the deployment.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

import numpy as np

from tuner.deployment import Deployment
from tuner.errors import ConfigError, InfeasibleError
from tuner.metrics import PERCENTILES, Percentile, ServingMetrics
from tuner.topology import Role, Topology

T = TypeVar("T")
Metric = str | Callable[[Any], float]
CurvePoint = tuple[Topology, ServingMetrics]


def _getter(metric: Metric) -> Callable[[Any], float]:
    return metric if callable(metric) else (lambda p: float(getattr(p, metric)))


def pareto_front(points: Sequence[T], x: Metric, y: Metric) -> list[T]:
    """Points not dominated when maximising both x and y, sorted by x ascending (y then descends)."""
    fx, fy = _getter(x), _getter(y)
    ranked = sorted(points, key=lambda p: (-fx(p), -fy(p)))
    front: list[T] = []
    best_y = -math.inf
    for p in ranked:
        if fy(p) > best_y:
            front.append(p)
            best_y = fy(p)
    return front[::-1]


def hypervolume_2d(points: Sequence[tuple[float, float]], ref: tuple[float, float]) -> float:
    """Area dominated by `points` (maximising both) and bounded below by the reference point."""
    inside = [(px, py) for px, py in points if px > ref[0] and py > ref[1]]
    area = 0.0
    prev_x = ref[0]
    for px, py in pareto_front(inside, x=lambda p: p[0], y=lambda p: p[1]):  # x ascending, y descending
        area += (px - prev_x) * (py - ref[1])
        prev_x = px
    return area


def check_sla(*, max_ttft_ms: float | None, max_itl_ms: float | None, min_tok_s_user: float | None,
              percentile: str) -> None:
    """An SLA's bounds are positive (NaN is not) and its percentile one of PERCENTILES; errors name the `sla.*`
    field (the advise request's and the service's)."""
    for name, value in (("max_ttft_ms", max_ttft_ms), ("max_itl_ms", max_itl_ms)):
        if value is not None and not value > 0:
            raise ConfigError(f"must be positive, got {value}", field=f"sla.{name}",
                              fix="give a positive limit in milliseconds, or omit it")
    if min_tok_s_user is not None and not min_tok_s_user > 0:
        raise ConfigError(f"must be positive, got {min_tok_s_user}", field="sla.min_tok_s_user",
                          fix="give a per-user speed in tokens/s, or omit it")
    if percentile not in PERCENTILES:
        raise ConfigError(f"unknown percentile {percentile!r}", field="sla.percentile", fix="use p50, p90 or p99")


@dataclass(frozen=True)
class Constraints:
    """Limits a composed deployment must meet: the SLA (latencies read at `percentile`), a per-user speed floor,
    the GPU budget and vLLM's pairing rules."""

    max_gpus: int
    max_ttft_ms: float | None = None
    max_itl_ms: float | None = None
    percentile: Percentile = "p90"
    min_tok_s_per_user: float | None = None
    # (prefill, decode) -> why vLLM refuses the pair, None when it accepts it: the one PD pairing check
    # (tuner.backends.vllm.pairing_predicate), passed in so this pure module needs no backend. None: any pair.
    pairing: Callable[[Topology, Topology], str | None] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.max_gpus < 1:
            raise ConfigError(f"GPU budget must be >= 1, got {self.max_gpus}", field="gpus", fix="give >= 1")
        check_sla(max_ttft_ms=self.max_ttft_ms, max_itl_ms=self.max_itl_ms,
                  min_tok_s_user=self.min_tok_s_per_user, percentile=self.percentile)

    @property
    def max_itl_for_users_ms(self) -> float | None:
        """The ITL bound that binds: the SLA's, or the per-user floor's 1000 / tok/s (whichever is tighter)."""
        bounds = [b for b in (self.max_itl_ms, 1000.0 / self.min_tok_s_per_user if self.min_tok_s_per_user else None)
                  if b is not None]
        return min(bounds) if bounds else None


def _ttft(m: ServingMetrics, pct: Percentile) -> float:
    return m.ttft_ms_at(pct)


def _itl(m: ServingMetrics, pct: Percentile) -> float:
    return m.itl_ms_at(pct)


@dataclass(frozen=True)
class ComposedPoint:
    """x prefill instances + y decode instances, each at one point of its curve."""

    prefill_topology: Topology
    num_prefill: int
    decode_topology: Topology
    num_decode: int
    prefill: ServingMetrics  # one prefill instance
    decode: ServingMetrics  # one decode instance
    num_gpus: int
    total_tok_s_per_gpu: float  # (input + output) tokens/s over every GPU, prefill and decode
    tok_s_per_user: float
    ttft_ms: float  # prefill TTFT + decode-side wait, transfer and first step, at the chosen percentile
    itl_ms: float
    family: str = field(compare=False)  # prefill topology + decode topology and MTP: one faint curve
    mode: str = field(default="disaggregated", compare=False)

    @cached_property
    def deployment(self) -> Deployment:
        return Deployment.disaggregated(self.prefill_topology, self.num_prefill, self.decode_topology,
                                        self.num_decode)

    @cached_property
    def metrics(self) -> ServingMetrics:
        """The whole deployment in the shared schema (its rate is the decode side's)."""
        d, p, y = self.decode, self.prefill, self.num_decode
        return ServingMetrics.from_rates(
            concurrency=y * d.concurrency, num_gpus=self.num_gpus, isl=d.isl, osl=d.osl,
            request_rps=y * d.request_throughput_rps, ttft_ms=p.ttft_ms_p50 + d.ttft_ms_p50, itl_ms=d.itl_ms_p50,
            ttft_ms_p99=p.ttft_ms_p99 + d.ttft_ms_p99, itl_ms_p99=d.itl_ms_p99,
            max_concurrency=y * d.max_concurrency, running=y * d.running_requests)

    @property
    def name(self) -> str:
        return self.deployment.name

    @property
    def output_tok_s_per_gpu(self) -> float:
        """Generated tokens/s over every GPU (peers quote this or the total; topotune prints both)."""
        d = self.decode
        return self.num_decode * d.request_throughput_rps * d.osl / self.num_gpus


def _fail(message: str, field: str, fix: str) -> InfeasibleError:
    return InfeasibleError(message, field=field, fix=fix)


def _check_curves(prefill: Sequence[CurvePoint], decode: Sequence[CurvePoint], c: Constraints) -> None:
    if not prefill:
        raise _fail("no prefill point to compose", "prefill curve", "give at least one prefill topology that fits")
    if not decode:
        raise _fail("no decode point to compose", "decode curve", "give at least one decode topology that fits")
    isls = {m.isl for _, m in prefill} | {m.isl for _, m in decode}
    if len(isls) > 1:
        raise ConfigError(f"curves mix input lengths {sorted(isls)}", field="curves",
                          fix="compose prefill and decode curves measured at the same ISL")
    if c.max_ttft_ms is not None:
        best = min(_ttft(m, c.percentile) for _, m in prefill)
        if best > c.max_ttft_ms:
            raise _fail(f"no prefill point meets TTFT <= {c.max_ttft_ms:g} ms ({c.percentile}); the best TTFT is "
                        f"{best:,.0f} ms", "sla.max_ttft_ms", f"raise the TTFT limit to at least {math.ceil(best)} ms")
    bound = c.max_itl_for_users_ms
    if bound is not None:
        best = min(_itl(m, c.percentile) for _, m in decode)
        if best > bound:
            field, what = _itl_bound_names(c)
            raise _fail(f"no decode point meets ITL <= {bound:g} ms ({c.percentile}; {what}); the best ITL is "
                        f"{best:.1f} ms ({1000 / best:.1f} tok/s/user)", field,
                        f"relax `{field}` (the best decode point gives {best:.1f} ms)")
    smallest = min(t.num_gpus for t, _ in prefill) + min(t.num_gpus for t, _ in decode)
    if smallest > c.max_gpus:
        raise _fail(f"the smallest 1P1D pair needs {smallest} GPUs but the budget is {c.max_gpus}", "gpus",
                    f"allow at least {smallest} GPUs or add smaller topologies")


def compose_disaggregated(prefill: Sequence[CurvePoint], decode: Sequence[CurvePoint],
                          constraints: Constraints) -> list[ComposedPoint]:
    """Every feasible xPyD deployment: per decode point and decode count y, the prefill point and count x that
    cover the decode rate with the fewest GPUs (ties: lower TTFT). Raises InfeasibleError naming the constraint
    that removed everything.

    The hot path of the frontier (well under 2 s for the reference model): the prefill side is laid out as arrays
    once (_PrefillColumns), each decode point is then a few vector operations."""
    c = constraints
    _check_curves(prefill, decode, c)
    columns = _PrefillColumns.of(prefill, c)
    reasons = {"itl": 0, "pairing": 0, "gpus": 0, "ttft": 0}
    itl_bound = c.max_itl_for_users_ms
    out: list[ComposedPoint] = []
    for d_topo, d in decode:
        if itl_bound is not None and _itl(d, c.percentile) > itl_bound:
            reasons["itl"] += 1
            continue
        removed_by = columns.compose(d_topo, d, out)
        if removed_by:
            reasons[removed_by] += 1
    if not out:
        raise _explain(reasons, len(decode), c, columns.refusals)
    return out


@dataclass
class _PrefillColumns:
    """The prefill points as arrays, with what composing one decode point after another may reuse: the pairable
    prefill points per decode topology, their sliced columns, the decode counts, the deployment families."""

    points: Sequence[CurvePoint]
    c: Constraints
    gpus: np.ndarray
    rps: np.ndarray
    ttft: np.ndarray
    topo_index: np.ndarray  # each point's distinct prefill topology
    topos: list[Topology]
    ok: np.ndarray  # within the GPU budget and the TTFT limit on their own
    tie: np.ndarray  # < 1: breaks GPU-count ties by TTFT only
    all_ok: np.ndarray  # indices of the points in `ok` (every decode topology's, without a pairing rule)
    refusals: dict[str, int] = field(default_factory=dict)  # pairs the pairing rule refused, by rule
    pair_cache: dict[Topology, np.ndarray] = field(default_factory=dict)
    sliced: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    ys: dict[int, np.ndarray] = field(default_factory=dict)  # decode counts 1..n
    families: dict[tuple[int, int], str] = field(default_factory=dict)

    @classmethod
    def of(cls, prefill: Sequence[CurvePoint], c: Constraints) -> _PrefillColumns:
        gpus = np.array([t.num_gpus for t, _ in prefill], dtype=float)
        rps = np.array([m.request_throughput_rps for _, m in prefill], dtype=float)
        ttft = np.array([_ttft(m, c.percentile) for _, m in prefill], dtype=float)
        index = {t: i for i, t in enumerate(dict.fromkeys(t for t, _ in prefill))}  # distinct prefill topologies
        ok = (rps > 0) & (gpus < c.max_gpus)
        if c.max_ttft_ms is not None:
            ok &= ttft <= c.max_ttft_ms
        return cls(prefill, c, gpus, rps, ttft, np.array([index[t] for t, _ in prefill]), list(index), ok,
                   ttft / (ttft.max() + 1.0), np.flatnonzero(ok))

    def pairable(self, d_topo: Topology) -> np.ndarray:
        """The prefill points this decode topology may pair with, as indices (ascending: argmin keeps its
        first minimum)."""
        if self.c.pairing is None:
            return self.all_ok
        if d_topo not in self.pair_cache:
            why = [self.c.pairing(t, d_topo) for t in self.topos]
            for w in why:
                if w:
                    rule = w.split(":", 1)[0]
                    self.refusals[rule] = self.refusals.get(rule, 0) + 1
            self.pair_cache[d_topo] = np.flatnonzero(self.ok & np.array([w is None for w in why])[self.topo_index])
        return self.pair_cache[d_topo]

    def compose(self, d_topo: Topology, d: ServingMetrics, out: list[ComposedPoint]) -> str | None:
        """Append the decode point's deployments (per decode count, the cheapest prefill side); or the reason
        there are none (pairing, ttft, gpus)."""
        c = self.c
        base = self.pairable(d_topo)
        if base.size == 0:
            return "pairing"
        if id(base) not in self.sliced:  # the columns of each candidate set, sliced once
            self.sliced[id(base)] = (self.gpus[base], self.rps[base], self.tie[base], self.ttft[base])
        cols = base
        c_gpus, c_rps, c_tie, c_ttft = self.sliced[id(base)]
        d_ttft = _ttft(d, c.percentile)
        if c.max_ttft_ms is not None:
            keep = c_ttft + d_ttft <= c.max_ttft_ms
            if not keep.all():
                cols = base[keep]
                if cols.size == 0:
                    return "ttft"
                c_gpus, c_rps, c_tie, c_ttft = c_gpus[keep], c_rps[keep], c_tie[keep], c_ttft[keep]
        gd = d_topo.num_gpus
        n_y = (c.max_gpus - int(c_gpus.min())) // gd
        if n_y <= 0 or d.request_throughput_rps <= 0:
            return "gpus"
        if n_y not in self.ys:
            self.ys[n_y] = np.arange(1, n_y + 1, dtype=float)
        y = self.ys[n_y]
        need = y[:, None] * d.request_throughput_rps  # (Y, 1) decode rate to cover
        x = np.maximum(np.ceil(need / c_rps[None, :] - 1e-9), 1.0)
        gpus = x * c_gpus[None, :] + y[:, None] * gd
        key = np.where(gpus <= c.max_gpus, gpus + c_tie[None, :], np.inf)
        rows = np.nonzero(np.isfinite(key.min(axis=1)))[0]
        if rows.size == 0:
            return "gpus"
        self._emit(d_topo, d, d_ttft, rows, key.argmin(axis=1), cols, x, gpus, out)
        return None

    def _emit(self, d_topo: Topology, d: ServingMetrics, d_ttft: float, rows: np.ndarray, best: np.ndarray,
              cols: np.ndarray, x: np.ndarray, gpus: np.ndarray, out: list[ComposedPoint]) -> None:
        d_itl = _itl(d, self.c.percentile)
        total_per_req = d.isl + d.osl
        user = 1000.0 / d_itl if d_itl > 0 else 0.0
        d_family = " -> " + _family(d_topo)
        for row in rows.tolist():
            j = int(best[row])
            i = int(cols[j])
            p_topo, p = self.points[i]
            n_gpus = int(gpus[row, j])
            n_dec = row + 1
            family_key = (int(self.topo_index[i]), id(d_topo))
            family = self.families.get(family_key)
            if family is None:
                family = self.families[family_key] = p_topo.name + d_family
            out.append(ComposedPoint(
                prefill_topology=p_topo, num_prefill=int(x[row, j]), decode_topology=d_topo, num_decode=n_dec,
                prefill=p, decode=d, num_gpus=n_gpus,
                total_tok_s_per_gpu=n_dec * d.request_throughput_rps * total_per_req / n_gpus,
                tok_s_per_user=user, ttft_ms=float(self.ttft[i]) + d_ttft, itl_ms=d_itl, family=family))


def binding_bound(ttft_ms: float, itl_ms: float, *, max_ttft_ms: float | None,
                  max_itl_ms: float | None) -> str | None:
    """Which SLA bound a point (the front's throughput end) uses most of, in words; None without bounds."""
    used = [(value / bound, name, value, bound) for name, value, bound in
            (("TTFT", ttft_ms, max_ttft_ms), ("ITL", itl_ms, max_itl_ms)) if bound]
    if not used:
        return None
    share, name, value, bound = max(used)
    return f"{name} binds: {value:,.1f} of {bound:,.0f} ms ({share:.0%})"


def _itl_bound_names(c: Constraints) -> tuple[str, str]:
    """The SLA field whose bound binds the ITL, and what it says."""
    floor = 1000.0 / c.min_tok_s_per_user if c.min_tok_s_per_user else None
    if floor is not None and (c.max_itl_ms is None or floor < c.max_itl_ms):
        return "sla.min_tok_s_user", f"the floor of {c.min_tok_s_per_user:g} tok/s/user"
    return "sla.max_itl_ms", "the SLA"


def _explain(reasons: dict[str, int], num_decode: int, c: Constraints, refusals: dict[str, int]
             ) -> InfeasibleError:
    if reasons["itl"] == num_decode:
        field, what = _itl_bound_names(c)
        return _fail(f"no decode point meets ITL <= {c.max_itl_for_users_ms:g} ms ({what})", field, f"relax `{field}`")
    worst = max(reasons, key=lambda k: reasons[k])
    if worst == "pairing":
        rules = ", ".join(f"{k} x{n}" for k, n in sorted(refusals.items(), key=lambda kv: -kv[1]))
        return _fail(f"no prefill topology pairs with a decode topology: vLLM refuses every pair ({rules})",
                     "topologies", "sweep prefill topologies with the decode topologies' TP and MTP")
    if worst == "ttft":
        return _fail(f"no prefill + decode pair meets TTFT <= {c.max_ttft_ms:g} ms once the decode side's queueing "
                     "and KV transfer are added", "sla.max_ttft_ms", "raise the TTFT limit or lower the concurrency")
    return _fail(f"no xPyD deployment fits in {c.max_gpus} GPUs", "gpus", "allow more GPUs")


def combined_front(points: Sequence[ComposedPoint]) -> list[ComposedPoint]:
    """The combined Pareto front: total tok/s/GPU vs tok/s/user, both maximised."""
    return pareto_front(points, x="total_tok_s_per_gpu", y="tok_s_per_user")


def family_fronts(points: Sequence[ComposedPoint]) -> dict[str, list[ComposedPoint]]:
    """Each (prefill topology, decode topology + MTP) family's own front: the faint curves of the chart."""
    groups: dict[str, list[ComposedPoint]] = {}
    for p in points:
        groups.setdefault(p.family, []).append(p)
    return {k: combined_front(v) for k, v in groups.items()}


# -- aggregated serving ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AggregatedPoint:
    """`num_instances` identical aggregated instances (prefill and decode on the same GPUs) at one curve point.

    Replicas are independent, so per-GPU throughput and per-user speed are the instance's own; the deployment
    fills the GPU budget with as many replicas as fit.
    """

    topology: Topology
    num_instances: int
    instance: ServingMetrics
    num_gpus: int
    total_tok_s_per_gpu: float
    tok_s_per_user: float
    ttft_ms: float
    itl_ms: float
    family: str = field(compare=False)
    mode: str = field(default="aggregated", compare=False)

    @cached_property
    def deployment(self) -> Deployment:
        return Deployment.single(self.topology, count=self.num_instances)

    @property
    def name(self) -> str:
        return f"{self.num_instances}x({_family(self.topology)})"

    @property
    def output_tok_s_per_gpu(self) -> float:
        return self.instance.output_tok_s_per_gpu

    @property
    def concurrency_per_instance(self) -> int:
        return self.instance.concurrency


def _family(topo: Topology) -> str:
    """A topology as the fronts group it: its layout and MTP depth ("TP4DP2 MTP3")."""
    return topo.name + (f" MTP{topo.mtp}" if topo.mtp else "")


def _aggregated_within(c: Constraints, ttft_ms: float, itl_ms: float, tok_s_per_user: float) -> bool:
    """An aggregated instance's point meets the TTFT, ITL and per-user limits (an instance does both phases)."""
    return not ((c.max_ttft_ms is not None and ttft_ms > c.max_ttft_ms)
                or (c.max_itl_ms is not None and itl_ms > c.max_itl_ms)
                or (c.min_tok_s_per_user is not None and tok_s_per_user < c.min_tok_s_per_user))


def compose_aggregated(curve: Sequence[CurvePoint], constraints: Constraints) -> list[AggregatedPoint]:
    """Every aggregated deployment that meets the limits: each curve point replicated over the GPU budget."""
    c = constraints
    out: list[AggregatedPoint] = []
    for topo, m in curve:
        if topo.num_gpus > c.max_gpus or m.request_throughput_rps <= 0:
            continue
        ttft, itl = _ttft(m, c.percentile), _itl(m, c.percentile)
        if not _aggregated_within(c, ttft, itl, m.tok_s_per_user):
            continue
        count = c.max_gpus // topo.num_gpus
        placed = topo.model_copy(update={"role": Role.BOTH}) if topo.role is not Role.BOTH else topo
        out.append(AggregatedPoint(
            topology=placed, num_instances=count, instance=m, num_gpus=count * topo.num_gpus,
            total_tok_s_per_gpu=m.total_tok_s_per_gpu, tok_s_per_user=m.tok_s_per_user, ttft_ms=ttft, itl_ms=itl,
            family=_family(topo)))
    return out


@dataclass(frozen=True)
class Winner:
    """Which serving mode holds the merged front over a range of per-user speed (tok/s/user)."""

    mode: str  # "aggregated" or "disaggregated"
    from_tok_s_per_user: float
    to_tok_s_per_user: float
    best_tok_s_per_gpu: float


def which_wins(disaggregated: Sequence[ComposedPoint], aggregated: Sequence[AggregatedPoint]) -> list[Winner]:
    """Walk the merged Pareto front from the throughput end to the latency end and name each mode's stretch."""
    merged = pareto_front([*disaggregated, *aggregated], x="total_tok_s_per_gpu", y="tok_s_per_user")
    merged.sort(key=lambda p: p.tok_s_per_user)
    stretches: list[Winner] = []
    for p in merged:
        mode = p.mode
        if stretches and stretches[-1].mode == mode:
            last = stretches[-1]
            stretches[-1] = Winner(mode, last.from_tok_s_per_user, p.tok_s_per_user,
                                   max(last.best_tok_s_per_gpu, p.total_tok_s_per_gpu))
        else:
            stretches.append(Winner(mode, p.tok_s_per_user, p.tok_s_per_user, p.total_tok_s_per_gpu))
    return stretches


# -- open loop: one offered request rate -------------------------------------------------------------------
# (topology, instances, one instance's metrics at the offered rate / instances): what tuner.perf.sweep_rate_curves
# predicts. Every instance of a side shares the one rate, so a count is a point, not a multiplier.
RatePoint = tuple[Topology, int, ServingMetrics]


def compose_rate_disaggregated(prefill: Sequence[RatePoint], decode: Sequence[RatePoint], constraints: Constraints,
                               *, offered_rps: float) -> list[ComposedPoint]:
    """Open loop: every (x prefill instances, y decode instances) that carries the offered rate, per decode count
    the prefill count with the fewest GPUs (ties: lower TTFT) under the limits. The rate is the same for every
    deployment, so tok/s/GPU only falls as GPUs are added: the front trades GPUs for tok/s/user (tok/s/GPU is
    computed from `offered_rps` itself, so equal GPU counts tie exactly)."""
    c = constraints
    if not prefill or not decode:
        return []
    pct = c.percentile
    p_gpus = np.array([t.num_gpus * n for t, n, _ in prefill], dtype=float)
    p_ttft = np.array([_ttft(m, pct) for _, _, m in prefill], dtype=float)
    p_index = {t: i for i, t in enumerate(dict.fromkeys(t for t, _, _ in prefill))}
    p_topos = list(p_index)
    p_topo_index = np.array([p_index[t] for t, _, _ in prefill])
    p_ok = p_gpus < c.max_gpus
    if c.max_ttft_ms is not None:
        p_ok &= p_ttft <= c.max_ttft_ms
    pair_cache: dict[Topology, np.ndarray] = {}
    tie = p_ttft / (p_ttft.max() + 1.0)  # < 1: breaks GPU-count ties by TTFT only
    itl_bound = c.max_itl_for_users_ms
    out: list[ComposedPoint] = []
    for d_topo, y, d in decode:
        d_itl = _itl(d, pct)
        if itl_bound is not None and d_itl > itl_bound:
            continue
        if d_topo not in pair_cache:
            allowed = (np.array([c.pairing(t, d_topo) is None for t in p_topos]) if c.pairing is not None
                       else np.ones(len(p_topos), dtype=bool))
            pair_cache[d_topo] = np.flatnonzero(p_ok & allowed[p_topo_index])
        cols = pair_cache[d_topo]
        d_gpus, d_ttft = d_topo.num_gpus * y, _ttft(d, pct)
        cols = cols[p_gpus[cols] + d_gpus <= c.max_gpus]
        if c.max_ttft_ms is not None:
            cols = cols[p_ttft[cols] + d_ttft <= c.max_ttft_ms]
        if cols.size == 0:
            continue
        i = int(cols[np.argmin(p_gpus[cols] + tie[cols])])
        p_topo, x, p = prefill[i]
        n_gpus = int(p_gpus[i]) + d_gpus
        out.append(ComposedPoint(
            prefill_topology=p_topo, num_prefill=x, decode_topology=d_topo, num_decode=y, prefill=p, decode=d,
            num_gpus=n_gpus, total_tok_s_per_gpu=offered_rps * (d.isl + d.osl) / n_gpus,
            tok_s_per_user=1000.0 / d_itl if d_itl > 0 else 0.0, ttft_ms=float(p_ttft[i]) + d_ttft, itl_ms=d_itl,
            family=f"{p_topo.name} -> {_family(d_topo)}"))
    return out


def compose_rate_aggregated(curve: Sequence[RatePoint], constraints: Constraints, *,
                            offered_rps: float) -> list[AggregatedPoint]:
    """Open loop: every count of aggregated instances that carries the offered rate within the limits."""
    c = constraints
    out: list[AggregatedPoint] = []
    for topo, n, m in curve:
        ttft, itl = _ttft(m, c.percentile), _itl(m, c.percentile)
        if topo.num_gpus * n > c.max_gpus or not _aggregated_within(c, ttft, itl, m.tok_s_per_user):
            continue
        placed = topo.model_copy(update={"role": Role.BOTH}) if topo.role is not Role.BOTH else topo
        out.append(AggregatedPoint(
            topology=placed, num_instances=n, instance=m, num_gpus=n * topo.num_gpus,
            total_tok_s_per_gpu=offered_rps * (m.isl + m.osl) / (n * topo.num_gpus), tok_s_per_user=m.tok_s_per_user,
            ttft_ms=ttft, itl_ms=itl, family=_family(topo)))
    return out
