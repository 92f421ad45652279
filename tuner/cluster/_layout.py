"""A cluster's step-time factor per parallel layout: a smooth trend over layout features plus each layout's own part.

What a model measured on a layout, after the calibrated roofline, is the cluster's factor for that layout (collective
algorithms, rank placement, expert imbalance: every model sees it) times a smaller factor of the model's own on that
layout (no transfer can know it before the model runs). One number per layout, a log step-time factor s (the rate is
divided by exp(s), the latency multiplied): a ridge trend over layout_features, which carries to layouts no model
ran, plus the layout's own mean deviation from the trend shrunk by m / (m + LAYOUT_TAU) for the m models that ran
it, so one model's share is not taken for the cluster's. Both are relative to each model's mean over its layouts:
what carries to the next model is how layouts differ; a level common to every layout is the calibration's.
tuner.cluster._fit fits it jointly with the calibration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner.topology import Role, Topology

LayoutKey = tuple[str, int, int, bool, int]  # role, tp, dp, ep, mtp
#: Per feature, in (model, layout) observations: the trend leans on several layouts before it carries far.
TREND_RIDGE = 1.0
#: (per-model factor variance + measurement noise) / cluster layout-factor variance: a layout seen on m models
#: keeps m / (m + LAYOUT_TAU) of its own deviation (0.3: ~(0.05^2 + 0.04^2/2) / 0.12^2, the figures a hidden
#: truth documents; benchmarks/transfer.py)
LAYOUT_TAU = 0.3


def layout_key(role: Role, topo: Topology) -> LayoutKey:
    return (role.value, topo.tp, topo.dp, topo.ep, topo.mtp)


def layout_features(topo: Topology) -> np.ndarray:
    """What a cluster's deviation follows smoothly across layouts: 1, log2 of the EP group (expert imbalance and
    all-to-all grow with it), log2 TP, log2 DP, MTP on. The first is never fitted (a constant over every layout is
    the calibration's to explain)."""
    ep_size = topo.tp * topo.dp if topo.ep else 1
    return np.array([1.0, math.log2(ep_size), math.log2(topo.tp), math.log2(topo.dp), float(topo.mtp > 0)])


@dataclass(frozen=True)
class LayoutTrend:
    """A ridge-regressed log-factor per objective (throughput, user speed) over layout_features."""

    coef: np.ndarray  # (features, 2)

    def at(self, topo: Topology) -> np.ndarray:
        return layout_features(topo) @ self.coef


@dataclass(frozen=True)
class LayoutFactors:
    """The fitted log step-time factors: per role a trend coefficient vector, per layout its own (shrunk) part."""

    trend: dict[str, np.ndarray]  # role -> (features,)
    own: dict[LayoutKey, float]
    models: dict[LayoutKey, int]
    runs: dict[LayoutKey, int]

    def log_step(self, role: Role, topo: Topology) -> float:
        """The layout's log step-time factor: the role's trend, plus its own part where a model ran it."""
        beta = self.trend.get(role.value)
        smooth = float(layout_features(topo) @ beta) if beta is not None else 0.0
        return smooth + self.own.get(layout_key(role, topo), 0.0)


@dataclass(frozen=True)
class LayoutObservation:
    """One run's mean log step-time factor (log predicted/measured rate, log measured/predicted latency)."""

    key: LayoutKey
    topology: Topology
    model: str
    log_step: float


def fit_layout_factors(observations: Sequence[LayoutObservation],
                       weight: dict[str, float] | None = None) -> LayoutFactors:
    """Runs of one model on one layout are one observation (they share that model's factor), centred on the
    model's mean over its layouts; per role a ridge trend over them, then each layout's mean residual over its
    models, shrunk. weight: per model, how much its observations count (1 by default; a layout's evidence is the
    sum of its models' weights)."""
    w = weight or {}
    per: dict[LayoutKey, dict[str, list[float]]] = {}
    topo_of: dict[LayoutKey, Topology] = {}
    runs: dict[LayoutKey, int] = {}
    for o in observations:
        per.setdefault(o.key, {}).setdefault(o.model, []).append(o.log_step)
        topo_of.setdefault(o.key, o.topology)
        runs[o.key] = runs.get(o.key, 0) + 1
    means = {k: {name: float(np.mean(v)) for name, v in by.items()} for k, by in per.items()}
    # relative to each model's own mean over its layouts: a constant one model sees on every layout is that model's
    # (or what the calibration left for it), not the cluster's; the calibration fitted around it explains it
    centre: dict[tuple[str, str], list[float]] = {}
    for k, by in means.items():
        for name, y in by.items():
            centre.setdefault((k[0], name), []).append(y)
    means = {k: {name: y - float(np.mean(centre[(k[0], name)])) for name, y in by.items()} for k, by in means.items()}
    trend: dict[str, np.ndarray] = {}
    for role in {k[0] for k in per}:
        rows = [(layout_features(topo_of[k]), y, w.get(name, 1.0)) for k, by in means.items() if k[0] == role
                for name, y in by.items()]
        x = np.array([r[0] for r in rows])
        x[:, 0] = 0.0
        y = np.array([r[1] for r in rows])
        ws = np.array([r[2] for r in rows])
        trend[role] = np.linalg.solve((x.T * ws) @ x + TREND_RIDGE * np.eye(x.shape[1]), (x.T * ws) @ y)
    own = {}
    for k, by in means.items():
        smooth = float(layout_features(topo_of[k]) @ trend[k[0]])
        weights = np.array([w.get(name, 1.0) for name in by])
        m = float(weights.sum())
        deviation = np.array([y - smooth for y in by.values()])
        own[k] = float(weights @ deviation / m) * m / (m + LAYOUT_TAU) if m > 0 else 0.0
    return LayoutFactors(trend, own, {k: len(by) for k, by in per.items()}, runs)
