"""Runs measured on a hidden truth (a cluster whose factors the tuner does not know), for the cluster-store tests."""

from __future__ import annotations

import dataclasses

from _support.paths import REPO
from tuner.backends import TrialRequest
from tuner.backends._truth import HiddenTruth, HiddenTruthBackend
from tuner.cluster import StoredRun
from tuner.deployment import Deployment
from tuner.hardware import get_gpu
from tuner.memory import MemoryInputs, compute_memory
from tuner.models import load_model
from tuner.space import StudyConstraints, load_space

SPACE = REPO / "search_spaces" / "gb300-nvl72-8k1k.yaml"
MODELS = REPO / "examples" / "models"


def space():
    s = load_space(SPACE)
    return s.model_copy(update={"constraints": StudyConstraints(min_accuracy=s.constraints.min_accuracy)})


def truth(seed: int = 3) -> HiddenTruth:
    return dataclasses.replace(HiddenTruth.draw(seed), model_layout_sigma=0.05)


def measured_runs(model_name: str, count: int, seed: int = 3, phase: str = "decode") -> list[StoredRun]:
    """`count` configs of the model spread over the phase's layouts, each measured once on the truth."""
    sp, gpu = space(), get_gpu("gb300")
    path = str(MODELS / model_name)
    model = load_model(path)
    workload = sp.phase_workload(phase)  # type: ignore[arg-type]
    fitting = [t for t in sp.expand(phase, model)  # type: ignore[arg-type]
               if compute_memory(model, gpu, t, MemoryInputs.for_workload(workload)).fits]
    backend = HiddenTruthBackend(truth(seed))
    out = []
    for i, topo in enumerate(fitting[:: max(1, len(fitting) // count)][:count]):
        request = TrialRequest(trial_id=f"{model_name}#{i}", model_path=path, gpu="gb300",
                               deployment=Deployment.single(topo), workload=workload, seed=i)
        result = backend.run(request)
        if result.status.ok:
            out.append(StoredRun(model_name=model.name, model_path=path, role=topo.role, topology=topo,
                                 workload=workload, points=result.points, study=f"{model_name}/{phase}", trial=i))
    return out
