"""The /ui/clusters page's read model: what every study taught each cluster, shaped for a table per cluster.

Built from tuner.cluster's ClusterKnowledge (the same learning `topotune calibrate` and GET /v1/clusters show).
The held-out error is one more calibration fit per model, so it is computed only when the page asks for it.
Learning refits the calibration (over a second per cluster), so what was learnt is kept until the store changes:
its tables only grow, so (rows, largest id) of each is the version a cached fit is checked against, one cheap query
per request.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import sqlalchemy as sa

from tuner.cluster import ClusterKey, ClusterKnowledge, ClusterStore, GuardVerdict, KernelFactor, load_knowledge
from tuner.errors import TopotuneError
from tuner.hardware import get_gpu

TOP_OFFSETS = 30  # layouts shown per cluster, largest |offset| first


@dataclass(frozen=True)
class FactorRow:
    name: str
    default: float
    learnt: float
    moved_pct: float | None  # None when the default is 0
    runs: int | None  # the fit's runs that exercise the factor
    models: int | None


@dataclass(frozen=True)
class OffsetRow:
    """One parallel layout's learnt deviation from the refitted model, as factors on each objective."""

    role: str
    layout: str
    throughput_factor: float
    user_speed_factor: float
    models: int
    runs: int


@dataclass(frozen=True)
class RiskRow:
    topology: str
    status: str
    models: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class GuardRow:
    """The transfer guard's verdict for one new model: the prior against the default on its first trials."""

    model: str
    study: str
    trials: int
    error_prior: float | None
    error_default: float | None
    error_after: float | None
    outcome: str  # "kept", "fell back: a, b", "whole prior fell back"
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class ClusterView:
    key: ClusterKey
    runs: int
    models: tuple[str, ...]
    launch_failures: int
    factors: list[FactorRow]
    error_before: float | None  # in-sample mean |log predicted/measured|, default calibration
    error_after: float | None  # the same, learnt calibration
    held_out: dict[str, float | int | str | None] | None  # method, models, error_default, error_fitted
    offsets: list[OffsetRow]  # the TOP_OFFSETS largest
    offsets_total: int
    risks: list[RiskRow]
    error: str | None = None  # the cluster could not be learnt (e.g. its GPU left the catalog)
    kernel_factors: tuple[KernelFactor, ...] = ()  # tuner.cluster's own: the page shows its fields as they are
    guards: tuple[GuardRow, ...] = ()

    @property
    def anchor(self) -> str:
        return anchor_of(self.key.name)


def anchor_of(cluster_name: str) -> str:
    """The id of a cluster's section on /ui/clusters (the study page links to it)."""
    return "cluster-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in cluster_name)


def layout_label(tp: int, dp: int, ep: bool, mtp: int) -> str:
    return f"TP{tp}xDP{dp}{' EP' if ep else ''}{f' MTP{mtp}' if mtp else ''}"


def view_of(k: ClusterKnowledge) -> ClusterView:
    """The page's rows of what GET /v1/clusters serves (ClusterKnowledge.as_json: one reading of each figure)."""
    j = k.as_json()
    factors = [FactorRow(name, f["default"], f["learnt"], f["moved_pct"], f["runs"], f["models"])
               for name, f in j["factors"].items()]
    ranked = sorted(j["layout_offsets"], key=lambda o: -max(abs(o["log_throughput"]), abs(o["log_user_speed"])))
    offsets = [OffsetRow(o["role"], layout_label(o["tp"], o["dp"], o["ep"], o["mtp"]), math.exp(o["log_throughput"]),
                         math.exp(o["log_user_speed"]), o["models"], o["runs"]) for o in ranked[:TOP_OFFSETS]]
    return ClusterView(
        key=k.key, runs=j["runs"], models=k.models, launch_failures=j["launch_failures"], factors=factors,
        error_before=j["error_in_sample"]["default"], error_after=j["error_in_sample"]["fitted"],
        held_out=j["held_out"], offsets=offsets, offsets_total=len(j["layout_offsets"]),
        risks=[RiskRow(r["topology"], r["status"], tuple(r["models"]), r["reason"]) for r in j["known_risks"]],
        kernel_factors=k.kernel_factors,
        guards=tuple(guard_row(g) for g in j["guards"]))


def guard_row(g: dict) -> GuardRow:
    verdict = GuardVerdict.from_json(g)
    outcome = ("whole prior fell back" if verdict.whole_fallback else
               f"fell back: {', '.join(verdict.fell_back)}" if verdict.fell_back else "kept")
    return GuardRow(verdict.model, g.get("study", ""), verdict.trials, g["error_prior"], g["error_default"],
                    g["error_after"], outcome, tuple(c.reason() for c in verdict.checks))


Learnt = list[tuple[ClusterKey, ClusterKnowledge | TopotuneError]]
_LEARNT: dict[tuple[str, bool], tuple[tuple[object, ...], Learnt]] = {}
_LEARNT_LOCK = threading.Lock()


def store_version(store: ClusterStore) -> tuple[object, ...]:
    """(rows, largest id) of the runs, the failures and the guard's verdicts: changes with every trial or verdict
    recorded (the tables only grow)."""
    with store.engine.connect() as conn:
        return tuple(value for table in (store.runs, store.failures, store.guards)
                     for value in conn.execute(sa.select(sa.func.count(), sa.func.max(table.c.id))).one())


def learnt(storage_url: str, *, held_out: bool) -> Learnt:
    """Each cluster's knowledge (or why it cannot be learnt), refitted only when the store changed since."""
    store = ClusterStore(storage_url)
    version = store_version(store)
    with _LEARNT_LOCK:
        cached = _LEARNT.get((storage_url, held_out))
    if cached is not None and cached[0] == version:
        return cached[1]
    out: Learnt = []
    for key in store.clusters():
        try:
            out.append((key, load_knowledge(store, key, get_gpu(key.gpu_class), held_out=held_out)))
        except TopotuneError as exc:
            out.append((key, exc))
        except ValueError as exc:  # a stored row that no longer reads
            out.append((key, TopotuneError(str(exc).splitlines()[0])))
    with _LEARNT_LOCK:
        _LEARNT[(storage_url, held_out)] = (version, out)
    return out


def cluster_views(storage_url: str, *, held_out: bool) -> list[ClusterView]:
    """Every cluster of the study database; one that cannot be learnt is listed with its error, not a 500."""
    return [view_of(k) if isinstance(k, ClusterKnowledge) else
            ClusterView(key, 0, (), 0, [], None, None, None, [], 0, [], error=k.user_message())
            for key, k in learnt(storage_url, held_out=held_out)]
