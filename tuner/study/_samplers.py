"""Sampler choice: GP for small budgets (the default), TPE, NSGA-II, random; always seeded."""

from __future__ import annotations

from typing import Literal

import optuna

from tuner.errors import ConfigError

SamplerName = Literal["gp", "tpe", "nsga2", "random"]
SAMPLERS: tuple[str, ...] = ("gp", "tpe", "nsga2", "random")


def make_sampler(name: str, seed: int, *, n_startup_trials: int = 8) -> optuna.samplers.BaseSampler:
    match name:
        case "gp":
            # Constrained multi-objective log-EHVI; accounts for running trials (parallel asks).
            return optuna.samplers.GPSampler(seed=seed, n_startup_trials=n_startup_trials,
                                             warn_independent_sampling=False)
        case "tpe":
            # Optuna 5 defaults multivariate off for multi-objective: turn it on, grouped.
            return optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                              n_startup_trials=n_startup_trials, constant_liar=True)
        case "nsga2":
            # The default population of 50 would be random search for this budget.
            return optuna.samplers.NSGAIISampler(seed=seed, population_size=max(8, n_startup_trials))
        case "random":
            return optuna.samplers.RandomSampler(seed=seed)
    raise ConfigError(f"unknown sampler {name!r}", field="--sampler", fix=f"use one of {', '.join(SAMPLERS)}")
