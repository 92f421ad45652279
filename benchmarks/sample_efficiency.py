"""Sample efficiency: how much of the exhaustive front each sampler finds, in how many launched trials.

Reference model and space (search_spaces/gb300-nvl72-8k1k.yaml), simulated backend with 5% seeded noise per
deployment (the same numbers any study sees). The exhaustive front evaluates every config that fits in memory.
For GP, TPE, NSGA-II, random (and GP with the simulator's warm start), over several seeds, it prints the
hypervolume ratio after 10, 20, 40 launched trials and at 10% of the exhaustive count, and the trials needed to
reach 95%. Goal (issue 4): >= 95% of the exhaustive hypervolume within 10% of the exhaustive trial count.

    python benchmarks/sample_efficiency.py [--seeds 5] [--phases prefill decode]
                                           [--samplers gp tpe nsga2 random gp+warm]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from functools import partial
from pathlib import Path

import optuna
from optuna.trial import TrialState

from tuner.backends import TrialRequest
from tuner.backends._simulated import SimulatedBackend
from tuner.deployment import Deployment
from tuner.executors import LocalExecutor
from tuner.frontier import hypervolume_2d
from tuner.hardware import get_gpu
from tuner.memory import MemoryInputs, compute_memory
from tuner.models import load_model
from tuner.space import load_space
from tuner.study import PhaseRun, TuneOptions, predicted_front_params
from tuner.study._objectives import phase_values
from tuner.study._records import is_feasible

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples" / "models" / "qwen3.8-2.4t-a95b-nvfp4"
SPACE = ROOT / "search_spaces" / "gb300-nvl72-8k1k.yaml"
NOISE = 0.05
CHECKPOINTS = (10, 20, 40)


def exhaustive(space, phase, model, gpu, backend) -> tuple[float, int]:  # type: ignore[no-untyped-def]
    workload = space.phase_workload(phase)
    values, count = [], 0
    for topo in space.expand(phase, model):
        if not compute_memory(model, gpu, topo, MemoryInputs(isl=workload.isl, osl=workload.osl)).fits:
            continue
        count += 1
        result = backend.run(TrialRequest(trial_id="x", model_path=str(MODEL), gpu=gpu.name,
                                          deployment=Deployment.single(topo), workload=workload))
        values += [phase_values(phase, m) for m in result.points]
    return hypervolume_2d(values, (0.0, 0.0)), count


def trajectory(study: optuna.Study) -> list[float]:
    """Hypervolume after each launched trial, counting every concurrency level it measured."""
    trials = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    by_parent: dict[int, list[tuple[float, float]]] = {}
    for t in trials:
        if t.user_attrs.get("kind") in ("sampled", "extra") and is_feasible(t.constraints) and t.values[0] > 0:
            parent = t.user_attrs.get("parent_trial", t.number)
            by_parent.setdefault(parent, []).append(tuple(t.values))
    seen: list[tuple[float, float]] = []
    out = []
    for t in trials:
        if t.user_attrs.get("kind") == "sampled":
            seen += by_parent.get(t.number, [])
            out.append(hypervolume_2d(seen, (0.0, 0.0)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--phases", nargs="+", default=["prefill", "decode"])
    ap.add_argument("--samplers", nargs="+", default=["gp", "tpe", "nsga2", "random", "gp+warm"])
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space, model, gpu = load_space(SPACE), load_model(MODEL), get_gpu("gb300")
    backend = SimulatedBackend(noise=NOISE)
    for phase in args.phases:
        t0 = time.perf_counter()
        hv_exh, n_exh = exhaustive(space, phase, model, gpu, backend)
        budget = max(CHECKPOINTS[-1], math.ceil(0.1 * n_exh))
        print(f"\n## {phase}: exhaustive front over {n_exh} fitting configs "
              f"({len(space.expand(phase, model))} valid), {time.perf_counter() - t0:.1f} s; budget {budget} trials "
              f"(10% of exhaustive: {math.ceil(0.1 * n_exh)})")
        header = ["sampler", *(f"HV@{c}" for c in CHECKPOINTS), f"HV@{math.ceil(0.1 * n_exh)} (10%)",
                  "trials to 95%", "s/trial"]
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for name in args.samplers:
            sampler, warm = name.removesuffix("+warm"), name.endswith("+warm")
            ratios: dict[int, list[float]] = {c: [] for c in (*CHECKPOINTS, math.ceil(0.1 * n_exh))}
            to95, secs = [], []
            for seed in range(args.seeds):
                run = PhaseRun(phase=phase, space=space, model=model, model_path=str(MODEL), gpu=gpu,
                               storage=optuna.storages.InMemoryStorage(), study_name=f"{phase}-{name}-{seed}",
                               backend_name="simulated", executor=LocalExecutor(backend),
                               options=TuneOptions(trials=budget, sampler=sampler, seed=seed, warm_start=warm),
                               artifacts_dir=Path("/tmp/topotune-bench"),
                               warm_start_params=partial(predicted_front_params, space, phase, model, gpu)
                               if warm else None)
                t1 = time.perf_counter()
                hv = trajectory(run.run())
                secs.append((time.perf_counter() - t1) / max(1, len(hv)))
                for c in ratios:
                    ratios[c].append(hv[min(c, len(hv)) - 1] / hv_exh if hv else 0.0)
                reached = next((i + 1 for i, v in enumerate(hv) if v >= 0.95 * hv_exh), None)
                to95.append(reached if reached is not None else math.inf)
            reached = [x for x in to95 if x != math.inf]
            to95_text = (f"{statistics.median(reached):.0f} (median, {len(reached)}/{len(to95)} seeds)"
                         if reached else f"not within {budget}")
            cells = [name, *(f"{statistics.mean(v) * 100:.1f}%" for v in ratios.values()), to95_text,
                     f"{statistics.mean(secs):.2f}"]
            print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
