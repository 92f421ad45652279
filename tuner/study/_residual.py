"""How far the cluster is from the simulator: a small Gaussian process on log(measured / predicted).

One GP per objective, over the ordinal features of a config. Its kernel has five parts:
- a squared exponential with one length scale for the layout knobs (tp, dp, ep, mtp) and one for the engine
  knobs (the simulator models the engine knobs, so their residual varies smoothly);
- an additive term, one 1-D kernel per layout knob: a deviation that follows one knob (EP's all-to-all costs
  more than modelled, MTP accepts fewer tokens) is learnt from any layout that has that knob's value, not only
  from near neighbours in the full layout space;
- a per-layout random effect (k += layout_var x [same parallel layout]): real clusters have step-time factors
  per layout that no smooth function of the knobs predicts (collective algorithms, NCCL channel counts, the
  placement of ranks on the NVLink domain), so one measurement of a layout informs all its engine-knob variants
  and says nothing about the neighbouring layouts;
- an offset (the simulator is off by a constant factor) and a slope on the predicted value itself (log measured
  = beta x log predicted: when the data disagree with the simulator's ranking, beta moves and the data take
  over).
The hyper-parameters are picked by marginal likelihood on a small grid, or (once the sampler has a fit) by a
coordinate search from the last pick: ~40 Cholesky factorisations of at most a few hundred rows per objective.
The per-layout variance never goes to 0: with a dozen trials the likelihood would happily explain every layout
by the smooth terms, leave an untried layout with an sd of 0.02 and the search would never try it. Nor does the
per-knob variance: a few trials would be explained by the offset and per-layout terms alone, a deficit measured
on one EP layout would not carry to the other EP layouts, and the search would keep proposing layouts that share
a measured layout's mis-modelled knob (EP's all-to-all and imbalance, MTP's acceptance: the knobs public
measurements find the simulator most wrong on, docs/perf-model.md; the benchmark figures:
docs/benchmarks/sample-efficiency.md).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np
from scipy.linalg import cho_solve, cholesky, solve_triangular

OFFSET_VAR = 0.25  # prior variance of a constant log-factor (the simulator off by e^0.5 at 1 sd)
SLOPE_VARS = (0.01, 0.1)  # prior variance of (beta - 1): the simulator's ranking trusted, or not
SLOPE_VAR_PRIOR = 0.1
SIGNAL_VARS = (0.004, 0.02, 0.1, 0.4)
LAYOUT_SCALES = (0.1, 0.3, 1.0)
ENGINE_SCALES = (1.0, 3.0, 10.0)  # engine knobs move the residual smoothly (the simulator models them)
NOISE_VARS = (0.0004, 0.0025, 0.01)
LAYOUT_VARS = (0.01, 0.02, 0.04)  # per-layout effect: log-sd 0.1 / 0.14 / 0.2 (never 0: see the docstring)
KNOB_VARS = (0.02, 0.08)  # additive deviation of each layout knob: log-sd 0.14 / 0.28 (never 0: docstring)
KNOB_SCALE = 0.5  # of each layout knob's 1-D kernel (positions in [0, 1])
LAYOUT_VAR_PRIOR = 0.015  # the per-layout effect assumed before the data pick one (log-sd ~0.12)


@dataclass(frozen=True)
class Hyper:
    signal_var: float
    layout_scale: float
    engine_scale: float
    noise_var: float
    layout_var: float = 0.0
    knob_var: float = 0.0
    slope_var: float = SLOPE_VAR_PRIOR


@dataclass(frozen=True)
class ResidualFit:
    """A fitted GP: predicts the mean and sd of the residual of unmeasured configs."""

    x: np.ndarray
    slope: np.ndarray  # centred log prediction of each training config
    layout: np.ndarray
    group: np.ndarray  # parallel layout id of each training config
    hyper: Hyper
    chol: np.ndarray
    alpha: np.ndarray

    @property
    def noise_var(self) -> float:
        return self.hyper.noise_var

    def cross(self, x: np.ndarray, slope: np.ndarray, group: np.ndarray) -> np.ndarray:
        """Prior covariance between the given configs and the training configs."""
        return _kernel(_Parts.of(x, group, self.x, self.group, self.layout), slope, self.slope, self.hyper)

    def predict(self, x: np.ndarray, slope: np.ndarray, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and sd (of the true residual, measurement noise excluded)."""
        k = self.cross(x, slope, group)
        mean = k @ self.alpha
        v = solve_triangular(self.chol, k.T, lower=True)
        knobs = max(1, int(self.layout.sum()))
        return mean, np.sqrt(np.maximum(prior_var(slope, self.hyper, knobs) - np.sum(v * v, axis=0), 1e-8))


def prior_var(slope: np.ndarray, hyper: Hyper, layout_knobs: int = 1) -> np.ndarray:
    """The residual's variance before any trial (kernel diagonal: each layout knob adds its own knob_var)."""
    return (hyper.signal_var + hyper.layout_var + layout_knobs * hyper.knob_var + OFFSET_VAR
            + hyper.slope_var * slope**2)


def prior_sd(slope: np.ndarray) -> np.ndarray:
    """The residual's sd before any trial (middle of the grid, the per-layout effect of a typical cluster)."""
    return np.sqrt(prior_var(slope, Hyper(SIGNAL_VARS[1], 0.3, 3.0, 0.0, LAYOUT_VAR_PRIOR)))


@dataclass(frozen=True)
class _Parts:
    """The hyper-parameter-free pieces of a kernel between two sets of configs."""

    d_layout: np.ndarray
    d_engine: np.ndarray
    knobs: np.ndarray  # sum over layout knobs of the 1-D kernels
    same: np.ndarray  # 1.0 where both configs share a parallel layout

    @classmethod
    def of(cls, a: np.ndarray, ga: np.ndarray, b: np.ndarray, gb: np.ndarray, layout: np.ndarray) -> _Parts:
        la, lb = a[:, layout], b[:, layout]
        if la.shape[1]:
            knobs = np.sum(np.exp(-0.5 * np.square(la[:, None, :] - lb[None, :, :]) / KNOB_SCALE**2), axis=2)
        else:
            knobs = np.ones((len(a), len(b)))
        return cls(d_layout=_sqdist(la, lb), d_engine=_sqdist(a[:, ~layout], b[:, ~layout]), knobs=knobs,
                   same=(ga[:, None] == gb[None, :]).astype(float))


def _kernel(parts: _Parts, slope_a: np.ndarray, slope_b: np.ndarray, h: Hyper,
            se: np.ndarray | None = None) -> np.ndarray:
    if se is None:
        se = np.exp(-0.5 * (parts.d_layout / h.layout_scale**2 + parts.d_engine / h.engine_scale**2))
    return (h.signal_var * se + h.layout_var * parts.same + h.knob_var * parts.knobs + OFFSET_VAR
            + h.slope_var * np.outer(slope_a, slope_b))


def fit_residual(x: np.ndarray, slope: np.ndarray, layout: np.ndarray, group: np.ndarray, y: np.ndarray,
                 hyper: Hyper | None = None, start: Hyper | None = None) -> ResidualFit:
    """Hyper-parameters by log marginal likelihood: the given ones (one factorisation), a coordinate search from
    `start` (each hyper-parameter in turn over its grid values, twice: ~40 factorisations), or the full grid."""
    parts = _Parts.of(x, group, x, group, layout)
    eye = np.eye(len(y))
    cache: dict[tuple[float, float], np.ndarray] = {}

    def score(h: Hyper) -> tuple[float, ResidualFit] | None:
        se = cache.get((h.layout_scale, h.engine_scale))
        if se is None:
            se = cache[(h.layout_scale, h.engine_scale)] = np.exp(
                -0.5 * (parts.d_layout / h.layout_scale**2 + parts.d_engine / h.engine_scale**2))
        try:
            chol = cholesky(_kernel(parts, slope, slope, h, se) + h.noise_var * eye, lower=True)
        except np.linalg.LinAlgError:
            return None
        alpha = cho_solve((chol, True), y)
        log_ml = -0.5 * float(y @ alpha) - float(np.sum(np.log(np.diag(chol))))
        return log_ml, ResidualFit(x=x, slope=slope, layout=layout, group=group, hyper=h, chol=chol, alpha=alpha)

    if hyper is not None:
        candidates: list[Hyper] = [hyper]
    elif start is None:
        candidates = [Hyper(s, ls, le, n, lv, kv, sv) for ls, le, s, n, lv, kv, sv in itertools.product(
            LAYOUT_SCALES, ENGINE_SCALES, SIGNAL_VARS, NOISE_VARS, LAYOUT_VARS, KNOB_VARS, SLOPE_VARS)]
    else:
        return _coordinate_search(score, start)
    best: tuple[float, ResidualFit] | None = None
    for h in candidates:
        found = score(h)
        if found is not None and (best is None or found[0] > best[0]):
            best = found
    if best is None:
        raise ValueError("residual model: no hyper-parameters gave a positive-definite kernel")
    return best[1]


_AXES: dict[str, tuple[float, ...]] = {"signal_var": SIGNAL_VARS, "noise_var": NOISE_VARS, "layout_var": LAYOUT_VARS,
                                       "knob_var": KNOB_VARS, "slope_var": SLOPE_VARS,
                                       "layout_scale": LAYOUT_SCALES, "engine_scale": ENGINE_SCALES}


def _coordinate_search(score, start: Hyper) -> ResidualFit:  # type: ignore[no-untyped-def]
    best = score(start)
    if best is None:
        raise ValueError("residual model: the previous hyper-parameters no longer give a positive-definite kernel")
    for _ in range(2):
        for name, values in _AXES.items():
            for v in values:
                if v == getattr(best[1].hyper, name):
                    continue
                found = score(dataclasses.replace(best[1].hyper, **{name: v}))
                if found is not None and found[0] > best[0]:
                    best = found
    return best[1]


def _sqdist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.shape[1] == 0:
        return np.zeros((len(a), len(b)))
    return np.maximum(np.sum(a * a, 1)[:, None] + np.sum(b * b, 1)[None, :] - 2 * a @ b.T, 0.0)
