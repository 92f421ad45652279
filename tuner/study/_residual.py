"""How far the cluster is from the simulator: a small Gaussian process on log(measured / predicted).

One GP per objective, over the ordinal features of a config. Its kernel has three parts: a squared exponential
with one length scale for the layout knobs (tp, dp, ep, mtp) and one for the engine knobs, an offset (the
simulator is off by a constant factor), and a slope on the predicted value itself (log measured = beta x log
predicted: when the data disagree with the simulator's ranking, beta moves and the data take over). The
hyper-parameters are picked on a small grid by marginal likelihood, refitted at every call: 2 x 108 Cholesky
factorisations of at most a few hundred rows, tens of milliseconds at 200 trials.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
from scipy.linalg import cho_solve, cholesky, solve_triangular

OFFSET_VAR = 0.25  # prior variance of a constant log-factor (the simulator off by e^0.5 at 1 sd)
SLOPE_VAR = 0.1  # prior variance of (beta - 1)
SIGNAL_VARS = (0.004, 0.02, 0.1, 0.4)
LAYOUT_SCALES = (0.1, 0.3, 1.0)
ENGINE_SCALES = (1.0, 3.0, 10.0)  # engine knobs move the residual smoothly (the simulator models them)
NOISE_VARS = (0.0004, 0.0025, 0.01)


@dataclass(frozen=True)
class ResidualFit:
    """A fitted GP: predicts the mean and sd of the residual of unmeasured configs."""

    x: np.ndarray
    slope: np.ndarray  # centred log prediction of each training config
    layout: np.ndarray
    signal_var: float
    layout_scale: float
    engine_scale: float
    noise_var: float
    chol: np.ndarray
    alpha: np.ndarray

    @property
    def hyper(self) -> Hyper:
        return Hyper(self.signal_var, self.layout_scale, self.engine_scale, self.noise_var)

    def _cross(self, x: np.ndarray, slope: np.ndarray) -> np.ndarray:
        d_layout = _sqdist(x[:, self.layout], self.x[:, self.layout])
        d_engine = _sqdist(x[:, ~self.layout], self.x[:, ~self.layout])
        se = np.exp(-0.5 * (d_layout / self.layout_scale**2 + d_engine / self.engine_scale**2))
        return self.signal_var * se + OFFSET_VAR + SLOPE_VAR * np.outer(slope, self.slope)

    def predict(self, x: np.ndarray, slope: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and sd (of the true residual, measurement noise excluded)."""
        k = self._cross(x, slope)
        mean = k @ self.alpha
        v = solve_triangular(self.chol, k.T, lower=True)
        prior = self.signal_var + OFFSET_VAR + SLOPE_VAR * slope**2
        return mean, np.sqrt(np.maximum(prior - np.sum(v * v, axis=0), 1e-8))


def prior_sd(slope: np.ndarray) -> np.ndarray:
    """The residual's sd before any trial (middle of the grid)."""
    return np.sqrt(SIGNAL_VARS[1] + OFFSET_VAR + SLOPE_VAR * slope**2)


@dataclass(frozen=True)
class Hyper:
    signal_var: float
    layout_scale: float
    engine_scale: float
    noise_var: float


def fit_residual(x: np.ndarray, slope: np.ndarray, layout: np.ndarray, y: np.ndarray,
                 hyper: Hyper | None = None) -> ResidualFit:
    """Grid search of the hyper-parameters by log marginal likelihood (or the given ones: one factorisation)."""
    d_layout = _sqdist(x[:, layout], x[:, layout])
    d_engine = _sqdist(x[:, ~layout], x[:, ~layout])
    fixed = OFFSET_VAR + SLOPE_VAR * np.outer(slope, slope)
    eye = np.eye(len(y))
    best: tuple[float, ResidualFit] | None = None
    scales = [(hyper.layout_scale, hyper.engine_scale)] if hyper else itertools.product(LAYOUT_SCALES, ENGINE_SCALES)
    for ls_layout, ls_engine in scales:
        se = np.exp(-0.5 * (d_layout / ls_layout**2 + d_engine / ls_engine**2))
        variances = [(hyper.signal_var, hyper.noise_var)] if hyper else itertools.product(SIGNAL_VARS, NOISE_VARS)
        for signal, noise in variances:
            try:
                chol = cholesky(signal * se + fixed + noise * eye, lower=True)
            except np.linalg.LinAlgError:
                continue
            alpha = cho_solve((chol, True), y)
            log_ml = -0.5 * float(y @ alpha) - float(np.sum(np.log(np.diag(chol))))
            if best is None or log_ml > best[0]:
                best = (log_ml, ResidualFit(x=x, slope=slope, layout=layout, signal_var=signal,
                                            layout_scale=ls_layout, engine_scale=ls_engine, noise_var=noise,
                                            chol=chol, alpha=alpha))
    if best is None:
        raise ValueError("residual model: no hyper-parameters gave a positive-definite kernel")
    return best[1]


def _sqdist(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.shape[1] == 0:
        return np.zeros((len(a), len(b)))
    return np.maximum(np.sum(a * a, 1)[:, None] + np.sum(b * b, 1)[None, :] - 2 * a @ b.T, 0.0)
