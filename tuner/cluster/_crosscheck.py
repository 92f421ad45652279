"""Before a new model's first trial: how far each part of what the cluster learnt should carry to it.

A factor fitted on the store's models carries to a new model only as far as the store shows that it carries from
model to model. The store can measure that itself, leaving one model out: refit on the other models (the fold's
knowledge, for the left-out model's kernel kind) and predict the left-out model's runs, with each transferred part
(each factor the full fit moved, and the per-layout offsets) at a weight w in WEIGHTS between its documented default
(0) and the fitted value (1; in log space, d * (v / d) ** w). Per part, the weight with the lowest mean held-out
error over the folds wins, ties going to the default (a cross-validated shrinkage towards the default: a part whose
fitted value does not predict other models better than its default stays there). One pass, part by part, each
judged with the parts before it at their chosen weights. A part no fold can judge stays at its default: with one
model in the store there is no fold at all, and a kernel factor is judged only on left-out models of the new
model's own group (tuner.cluster._fit.KERNEL_DEPENDENCE), so a factor the store cannot predict across models, or
across kinds, is never moved. Last, if the chosen weights predict the folds worse than the documented default as
a whole, everything stays at the default.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tuner.cluster._fit import KERNEL_DEPENDENCE, FitSample, factor_group, spread
from tuner.cluster._guard import OFFSETS, prior_error
from tuner.cluster._key import ClusterKey
from tuner.cluster._knowledge import ClusterKnowledge, ModelLoader, _load, learn, learn_samples, samples_of
from tuner.cluster._store import ClusterStore
from tuner.hardware import GpuSpec
from tuner.models import KernelKind

WEIGHTS = (0.0, 0.5, 1.0)  # how far a part moves from its default towards the fitted value (log space)
TEST_RUNS = 24  # runs of a left-out model scored per fold (the first ones: the fold stays ~1 s a part)


@dataclass(frozen=True)
class PartCheck:
    """One transferred part judged on the left-out models: the mean held-out error at each of WEIGHTS."""

    part: str
    weight: float
    folds: int
    errors: tuple[float, ...]

    def as_json(self) -> dict:
        return {"part": self.part, "weight": self.weight, "folds": self.folds,
                "errors": [None if math.isnan(e) else e for e in self.errors]}


@dataclass(frozen=True)
class _Fold:
    knowledge: ClusterKnowledge  # fitted without the left-out model, for its kernel kind
    test: list[FitSample]


def weighted(knowledge: ClusterKnowledge, part: str, weight: float) -> ClusterKnowledge:
    """The knowledge with one part moved `weight` of the way from its default to what was learnt."""
    if part == OFFSETS:
        return dataclasses.replace(knowledge, offset_weight=weight)
    moved = knowledge.moved().get(part)
    if moved is None:
        return knowledge
    default, learnt = moved
    value = getattr(knowledge.default, part) if weight == 0.0 else default * (learnt / default) ** weight
    return dataclasses.replace(knowledge, calibration=knowledge.calibration.model_copy(update={part: value}))


def parts_of(knowledge: ClusterKnowledge) -> list[str]:
    """The parts a transfer moves: each factor away from its default, and the per-layout offsets."""
    parts = [n for n, (a, b) in knowledge.moved().items() if not math.isclose(a, b, rel_tol=1e-9)]
    return parts + ([OFFSETS] if knowledge.layout_offsets or knowledge.trends else [])


def _judges(fold: _Fold, part: str, kind: KernelKind | None) -> bool:
    """Whether a fold can say how this part carries: it moved the part, and for a kernel factor the left-out model
    is of the new model's group."""
    if part not in parts_of(fold.knowledge):
        return False
    if part in KERNEL_DEPENDENCE:
        return kind is not None and factor_group(part, fold.test[0].kind) == factor_group(part, kind)
    return True


def _error(fold: _Fold, weights: dict[str, float], gpu: GpuSpec) -> float:
    k = fold.knowledge
    for part, w in weights.items():
        k = weighted(k, part, w)
    return prior_error(fold.test, gpu, k.calibration, k)


def _folds(samples: Sequence[FitSample], gpu: GpuSpec, knowledge: ClusterKnowledge) -> list[_Fold]:
    names = list(dict.fromkeys(s.model.name for s in samples))
    if len(names) < 2:
        return []
    out = []
    for name in names:
        train = [s for s in samples if s.model.name != name]
        test = spread([s for s in samples if s.model.name == name], TEST_RUNS)
        out.append(_Fold(learn_samples(knowledge.key, gpu, train, knowledge.default, test[0].kind), test))
    return out


def cross_check(knowledge: ClusterKnowledge, samples: Sequence[FitSample], gpu: GpuSpec) -> ClusterKnowledge:
    """The knowledge with each part at the weight the left-out models support (module docstring)."""
    folds = _folds(samples, gpu, knowledge)
    weights: dict[str, float] = {}
    checks = []
    for part in parts_of(knowledge):
        judging = [f for f in folds if _judges(f, part, knowledge.kind)]
        errors = tuple(float(np.mean([_error(f, weights | {part: w}, gpu) for f in judging])) if judging
                       else math.nan for w in WEIGHTS)
        best = WEIGHTS[int(np.argmin(errors))] if judging else 0.0
        weights[part] = best
        checks.append(PartCheck(part, best, len(judging), errors))
    if folds and weights:
        chosen = float(np.mean([_error(f, weights, gpu) for f in folds]))
        at_default = float(np.mean([_error(f, dict.fromkeys(weights, 0.0), gpu) for f in folds]))
        if not chosen <= at_default:
            weights = dict.fromkeys(weights, 0.0)
            checks = [dataclasses.replace(c, weight=0.0) for c in checks]
    out = knowledge
    for part, w in weights.items():
        out = weighted(out, part, w)
    return dataclasses.replace(out, pretrial=tuple(c.as_json() for c in checks))


def pretrial_knowledge(store: ClusterStore, key: ClusterKey, gpu: GpuSpec, kind: KernelKind, *,
                       load: ModelLoader = _load) -> ClusterKnowledge:
    """What a new model of `kind` starts from: the store's knowledge, cross-checked across its models."""
    runs = store.read_runs(key)
    learnt = learn(key, gpu, runs, store.read_failures(key), load=load, kind=kind)
    checked = cross_check(learnt, samples_of(runs, load), gpu)
    return dataclasses.replace(checked, guards=tuple(store.read_guards(key)))
