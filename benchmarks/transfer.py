"""Each model cheaper than the last: hidden clusters shared by a sequence of models, tuned one after another.

A hidden truth (tuner/backends/_truth.py) is a cluster: its calibration factors, its step-time factor per
parallel layout and its launch crashes are the same whichever model runs on it. On top, each (model, layout) gets
a smaller factor of its own (MODEL_LAYOUT_SIGMA, log-sd 0.05; the cluster's per-layout factor is 0.12), so what
one model measured on a layout carries to the next only in part; and each kernel efficiency differs by kernel kind
(KERNEL_KIND_SIGMA, HiddenTruth.kernel_kind_sigma: MXFP4, FP8 and BF16 expert GEMMs, MLA, GQA and sliding-window
attention are different kernels). A sequence of models (prefill phase of the GB300
NVL72 8k/1k space) is tuned on each truth, one after another:
  with transfer: every study records its trials into a cluster store (tuner/cluster), and each new study starts
    from what the store learnt (refitted calibration, per-layout offsets, known crashes);
  fresh: the same model tuned with no store (the documented calibration), as every study did before.
The model order is rotated over truths and seeds, so position k is not always the same model. Per position:
  pre-trial front error: mean over the true-front configs (within the truth's noise) of the mean |log| error of
    the study's predicted curve (what its simulator prior says before the first trial) against the true curve,
    both objectives, every concurrency level (0.10 is ~10% off);
  trials to 95%: launched trials until the true curves of the launched configs reach 95% of the exhaustive
    hypervolume (mean over runs; a run that never reaches it counts at its cap, and the count of such runs is
    printed);
  trials per front config: launched trials / true-front configs found when the run first reaches 95% (or at its cap);
  oracle front error (for reference): the same error of a prior given the truth's own calibration and its
    cluster-wide per-layout factors (expert imbalance included): what is left is the per-(model, layout) factor,
    the KV capacity and the factors a role's trials do not exercise;
  ideal front error (the floor of any transfer): the same prior, but each layout's cluster factor only as well as
    the earlier models' trials can tell it: the truth's calibration and expert imbalance exactly, and per layout
    the Bayes posterior mean of its cluster factor given the exact (noiseless) factor each earlier model had on it
    (cluster x that model's own), 0 on layouts no earlier model launched. A transfer learns from the same
    launches with noise and an unknown calibration, so this is what those trials can tell at best; a reference,
    not a strict bound: the true front's configs are selected for lucky factors, and a prior biased towards
    optimism can come closer to them (docs/benchmarks/transfer.md).
  per-run loss: a run's pre-trial front error over the same model's fresh one on the same truth (1.0: no loss);
  front error after the guard: the same error of the prior the study ended with, once the transfer guard
    (tuner.cluster._guard) has judged the transferred parts on the model's first trials.
The default models mix kernel kinds (tuner.models.kernel_kind: FP8 experts with MLA, MXFP4 experts with sliding
window + sinks, FP8 experts with GQA, BF16 experts with GQA), so gpt-oss-120b follows and precedes FP8 models;
the figures are also given per model kind (positions 2 and later: the runs that started from a store).
Truths 0-5 are for development; held-out truths are chosen with --first-truth (docs/benchmarks/transfer.md says
which were never looked at while developing).
Targets (issue 49; mean over truths and seeds, default sampler): no position's mean pre-trial front error worse
than fresh by more than 5%; no run's loss above x1.5; position 4 within 10% of the ideal estimator; position 4's
trials to 95% at least 30% below position 1's.
--ablate crosscheck: the store's fit as it stands, not cross-checked across its models (tuner.cluster._crosscheck);
--ablate keying: every factor and layout offset carried to every model, as before issue 49; --ablate guard: no
guard (both: the transfer of main before issue 49).

    OMP_NUM_THREADS=1 python benchmarks/transfer.py [--truths 3] [--first-truth 10] [--seeds 2] [--max-trials 40]
                                                     [--models deepseek-v3 kimi-k2-instruct ...] [--ablate keying]
                                                     [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import optuna

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sample_efficiency import Ground, TimedBackend, _near_front, score, unconstrained

from tuner.backends import TrialRequest
from tuner.backends._truth import HiddenTruth, HiddenTruthBackend
from tuner.cluster import ClusterKey, ClusterStore, StoredRun
from tuner.deployment import Deployment
from tuner.executors import LocalExecutor
from tuner.frontier import hypervolume_2d
from tuner.hardware import GpuSpec, get_gpu
from tuner.memory import MemoryInputs, compute_memory
from tuner.models import ModelSpec, kernel_kind, load_model
from tuner.space import SearchSpace, load_space
from tuner.study import PhaseRun, TuneOptions, phase_values
from tuner.study._prior import SimulatorPrior
from tuner.study._transfer import StudyTransfer
from tuner.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
SPACE = ROOT / "search_spaces" / "gb300-nvl72-8k1k.yaml"
MODELS = ("kimi-k2-instruct", "gpt-oss-120b", "minimax-m2", "qwen3-235b-a22b")  # kinds mixed (see above)
PHASE = "decode"
MODEL_LAYOUT_SIGMA = 0.05
KERNEL_KIND_SIGMA = 0.10  # log-sd of a kernel efficiency's factor per kernel kind (HiddenTruth.kernel_kind_sigma)


@dataclass(frozen=True)
class Case:
    """One model of the sequence on one truth: its space, model, truth's answers."""

    name: str
    path: str
    model: ModelSpec
    ground: Ground


def oracle_front_error(space: SearchSpace, case: Case, gpu: GpuSpec, truth: HiddenTruth) -> float:
    cluster_only = dataclasses.replace(truth, model_layout_sigma=0.0)

    def offset(topo: Topology) -> tuple[float, float]:
        f = math.log(cluster_only.step_factor(topo))
        return (-f, -f)

    prior = SimulatorPrior.build(space, PHASE, case.model, gpu, calibration=truth.calibration_for(case.model),
                                 offset=offset)
    return pretrial_front_error(prior, space, case)


def ideal_front_error(space: SearchSpace, case: Case, gpu: GpuSpec, truth: HiddenTruth,
                      earlier: list[StoredRun]) -> float:
    """The front error of the best estimate the earlier models' launches allow (see the module docstring)."""
    cluster_only = dataclasses.replace(truth, model_layout_sigma=0.0)
    layout_only = dataclasses.replace(cluster_only, expert_imbalance=0.0)
    seen: dict[tuple, dict[str, float]] = {}
    for r in earlier:
        if r.role.value != PHASE:
            continue
        key = (r.topology.tp, r.topology.dp, r.topology.ep, r.topology.mtp)
        seen.setdefault(key, {})[r.model_name] = math.log(truth.step_factor(r.topology, r.model_name)
                                                          / cluster_only.step_factor(r.topology)
                                                          * layout_only.step_factor(r.topology))
    var_l, var_ml = truth.layout_sigma ** 2, truth.model_layout_sigma ** 2

    def offset(topo: Topology) -> tuple[float, float]:
        z = list(seen.get((topo.tp, topo.dp, topo.ep, topo.mtp), {}).values())
        m = len(z)
        posterior = float(np.mean(z)) * m * var_l / (m * var_l + var_ml) if m else 0.0
        f = posterior + math.log(cluster_only.step_factor(topo) / layout_only.step_factor(topo))
        return (-f, -f)

    prior = SimulatorPrior.build(space, PHASE, case.model, gpu, calibration=truth.calibration_for(case.model),
                                 offset=offset)
    return pretrial_front_error(prior, space, case)


@dataclass
class Result:
    pretrial_front_error: float
    trials_to_95pct: int | None
    trials_per_front_point: float
    launched: int
    oracle_front_error: float = math.nan
    ideal_front_error: float = math.nan
    guarded_front_error: float = math.nan  # the prior the study ended with (after the transfer guard)
    model: str = ""
    kind: str = ""
    loss: float = math.nan  # pretrial_front_error / the fresh run's
    guard: str = ""
    run: str = ""  # truth and seed


def truth_of(seed: int) -> HiddenTruth:
    return dataclasses.replace(HiddenTruth.draw(seed), model_layout_sigma=MODEL_LAYOUT_SIGMA,
                               kernel_kind_sigma=KERNEL_KIND_SIGMA)


def ground_truth(space: SearchSpace, model: ModelSpec, path: str, gpu: GpuSpec, backend: HiddenTruthBackend,
                 noise: float) -> Ground:
    workload = space.phase_workload(PHASE)
    curves: dict[Topology, list[tuple[float, float]]] = {}
    for topo in space.expand(PHASE, model):
        if not compute_memory(model, gpu, topo, MemoryInputs.for_workload(workload)).fits:
            continue
        request = TrialRequest(trial_id="exhaustive", model_path=path, gpu=gpu.name,
                               deployment=Deployment.single(topo), workload=workload)
        points = [] if backend._truth.fails_at_launch(topo) else backend.expected_curve(request)
        curves[topo] = [phase_values(PHASE, m) for m in points]
    every = [p for c in curves.values() for p in c]
    near = _near_front(every, noise)
    front = {t for t, c in curves.items() if any(near(p) for p in c)}
    strict = {t for t, c in curves.items() if any(_near_front(every, 0.01)(p) for p in c)}
    return Ground(curves=curves, hv=hypervolume_2d(every, (0.0, 0.0)), front=front, strict_front=strict)


def pretrial_front_error(prior: SimulatorPrior, space: SearchSpace, case: Case) -> float:
    """Mean over true-front configs of mean |log(predicted / true)| over both objectives and every level. A
    front config the prior left out (a known crash) cannot be: crashes are not on the true front."""
    index = prior.index()
    errors = []
    for topo in case.ground.front:
        i = index.get(_key(space.params_of(PHASE, topo)))
        true = np.array(case.ground.curves[topo])
        if i is None or not len(true):
            continue
        predicted = prior.predicted[i, : len(true)]
        errors.append(float(np.mean(np.abs(np.log(np.maximum(predicted, 1e-9) / np.maximum(true, 1e-9))))))
    return statistics.mean(errors) if errors else math.nan


def _key(params: dict) -> tuple:
    return tuple(sorted((k, v) for k, v in params.items() if k != "concurrency"))


def tune(space: SearchSpace, case: Case, gpu: GpuSpec, backend: HiddenTruthBackend, seed: int, budget: int,
         transfer: StudyTransfer | None, study_name: str) -> Result:
    prior = (transfer.prior(space, PHASE, case.model, gpu) if transfer is not None
             else SimulatorPrior.build(space, PHASE, case.model, gpu))
    error = pretrial_front_error(prior, space, case)
    timed = TimedBackend(backend)
    run = PhaseRun(phase=PHASE, space=space, model=case.model, model_path=case.path, gpu=gpu,
                   storage=optuna.storages.InMemoryStorage(), study_name=study_name, backend_name="simulated",
                   executor=LocalExecutor(timed, max_parallel=1),
                   options=TuneOptions(trials=budget, sampler="auto", seed=seed, warm_start=False),
                   artifacts_dir=Path(tempfile.gettempdir()) / "topotune-transfer", transfer=transfer)
    study = run.run()
    s = score(study, space, PHASE, case.ground, 0.0, 0.0)
    guarded = (pretrial_front_error(transfer.prior(space, PHASE, case.model, gpu), space, case)
               if transfer is not None else error)
    verdict = transfer.verdict if transfer is not None else None
    return Result(error, s.trials_to(0.95), s.trials_per_front_config(0.95), len(s.hv_ratios),
                  guarded_front_error=guarded, model=case.name, kind=kernel_kind(case.model).label(),
                  guard="" if verdict is None else verdict.summary())


def fresh_prior_only(space: SearchSpace, case: Case, gpu: GpuSpec) -> Result:
    """The fresh start's pre-trial front error, with no study behind it (its trials are not measured)."""
    error = pretrial_front_error(SimulatorPrior.build(space, PHASE, case.model, gpu), space, case)
    return Result(error, None, math.nan, 0, guarded_front_error=error, model=case.name)


def ablate(parts: list[str]) -> None:
    """Switch off parts of issue 49's transfer in this process, to measure what each is worth."""
    import tuner.cluster._fit as fit
    import tuner.cluster._knowledge as knowledge
    import tuner.study._transfer as study_transfer

    if "keying" in parts:
        fit.KERNEL_DEPENDENCE.clear()  # every factor shared
        knowledge.OTHER_KIND_LAYOUT_WEIGHT = 1.0
    if "guard" in parts:
        study_transfer.GUARD_TRIALS = 10**9
    if "crosscheck" in parts:
        study_transfer.CROSS_CHECK = False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--truths", type=int, default=3)
    ap.add_argument("--first-truth", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--max-trials", type=int, default=40, help="trials per study (a run not at 95%% counts here)")
    ap.add_argument("--models", nargs="+", default=list(MODELS), help="folders under examples/models")
    ap.add_argument("--ablate", nargs="*", default=[], choices=["keying", "guard", "crosscheck"],
                    help="switch off the kernel-kind keying, the guard and/or the store's cross-check (all three: "
                         "the transfer before issue 49; crosscheck alone: that of issue 49's first session)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON (the tables go to stderr)")
    ap.add_argument("--only-seed", type=int, default=None, help="run only this seed of --seeds (to run seeds in "
                    "parallel processes; --merge their --json outputs)")
    ap.add_argument("--no-fresh-studies", action="store_true",
                    help="score the fresh prior before its first trial but run no fresh study (its trials to 95%% "
                         "are not measured: half the time; every target is still measured)")
    ap.add_argument("--merge", nargs="+", default=[], metavar="JSON",
                    help="no runs: the table of the --json outputs of runs on other truths (e.g. one per truth, "
                         "run in parallel), as if one run had made them")
    args = ap.parse_args()
    if args.merge:
        merge(args)
        return
    ablate(args.ablate)
    if len(args.models) < 2:
        ap.error("give at least two models")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    log = sys.stderr if args.json else sys.stdout
    space, gpu = unconstrained(load_space(SPACE)), get_gpu("gb300")
    n = len(args.models)
    with_t: list[list[Result]] = [[] for _ in range(n)]
    fresh: list[list[Result]] = [[] for _ in range(n)]
    t0 = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="topotune-transfer-"))
    for truth_id in range(args.first_truth, args.first_truth + args.truths):
        truth = truth_of(truth_id)
        backend = HiddenTruthBackend(truth)
        cases = {}
        for name in args.models:
            path = str(ROOT / "examples" / "models" / name)
            model = load_model(path)
            cases[name] = Case(name, path, model, ground_truth(space, model, path, gpu, backend, truth.noise))
        oracles = {name: oracle_front_error(space, case, gpu, truth) for name, case in cases.items()}
        for seed in range(args.seeds) if args.only_seed is None else [args.only_seed]:
            rotation = (truth_id * args.seeds + seed) % n
            order = args.models[rotation:] + args.models[:rotation]
            store = ClusterStore(f"sqlite:///{workdir}/truth{truth_id}-seed{seed}.db")
            for position, name in enumerate(order):
                case = cases[name]
                earlier = store.read_runs(ClusterKey.of(gpu, None, f"truth-{truth_id}"))
                ideal = ideal_front_error(space, case, gpu, truth, earlier)
                transfer = StudyTransfer.open(store, gpu, case.model, case.path, cluster=f"truth-{truth_id}")
                r = tune(space, case, gpu, backend, seed, args.max_trials, transfer, name)
                f = (tune(space, case, gpu, backend, seed, args.max_trials, None, name) if not args.no_fresh_studies
                     else fresh_prior_only(space, case, gpu))
                r.oracle_front_error, r.ideal_front_error = oracles[name], ideal
                r.loss = r.pretrial_front_error / f.pretrial_front_error
                r.run = f"truth {truth_id} seed {seed}"
                with_t[position].append(r)
                fresh[position].append(f)
                print(f"truth {truth_id} seed {seed} #{position + 1} {name}: front error {r.pretrial_front_error:.3f}"
                      f" (fresh {f.pretrial_front_error:.3f}, x{r.loss:.2f}; after the guard "
                      f"{r.guarded_front_error:.3f}), trials to 95% {r.trials_to_95pct} (fresh {f.trials_to_95pct}),"
                      f" ideal {ideal:.3f}, {time.perf_counter() - t0:.0f} s"
                      + (f"; guard: {r.guard}" if r.guard else ""), file=log, flush=True)
    out = summarise(with_t, fresh, args)
    print_table(out, log)
    if args.json:
        print(json.dumps(out, indent=2))


def merge(args: argparse.Namespace) -> None:
    """The figures of several --json outputs (same settings, other truths) as one run's."""
    outs = [json.loads(Path(p).read_text()) for p in args.merge]
    n = len(outs[0]["models"])
    with_t: list[list[Result]] = [[] for _ in range(n)]
    fresh: list[list[Result]] = [[] for _ in range(n)]
    for out in sorted(outs, key=lambda o: o["first_truth"]):
        for r in out["runs"]:
            i = r["position"] - 1
            with_t[i].append(Result(r["front_error"], r["trials_to_95pct"],
                                    r["trials_per_front_point"], r["launched"], r["oracle_front_error"],
                                    r["ideal_front_error"], r["guarded_front_error"], r["model"], r["kind"],
                                    r["loss"], r["guard"], r["run"]))
            fresh[i].append(Result(r["fresh_front_error"], r["fresh_trials_to_95pct"],
                                   r["fresh_trials_per_front_point"], r["fresh_launched"],
                                   guarded_front_error=r["fresh_front_error"], model=r["model"], kind=r["kind"]))
    first = outs[0]
    args.models, args.seeds, args.max_trials, args.ablate = first["models"], first["seeds"], first["max_trials"], \
        first["ablate"]
    args.first_truth = min(o["first_truth"] for o in outs)
    args.truths = len({o["first_truth"] for o in outs})
    out = summarise(with_t, fresh, args)
    print_table(out, sys.stderr if args.json else sys.stdout)
    if args.json:
        print(json.dumps(out, indent=2))


def _mean_trials(results: list[Result], cap: int) -> float:
    return statistics.mean(r.trials_to_95pct if r.trials_to_95pct is not None else cap for r in results)


def _figures(results: list[Result], cap: int) -> dict[str, object]:
    per_front = [r.trials_per_front_point for r in results if math.isfinite(r.trials_per_front_point)]
    losses = [r.loss for r in results if math.isfinite(r.loss)]
    return {"pretrial_front_error": statistics.mean(r.pretrial_front_error for r in results),
            "guarded_front_error": statistics.mean(r.guarded_front_error for r in results),
            "oracle_front_error": statistics.mean(r.oracle_front_error for r in results),
            "ideal_front_error": statistics.mean(r.ideal_front_error for r in results),
            "mean_loss": statistics.mean(losses) if losses else None,
            "max_loss": max(losses) if losses else None,
            "trials_to_95pct": _mean_trials(results, cap) if any(r.launched for r in results) else None,
            "runs_not_reaching_95pct": sum(r.trials_to_95pct is None for r in results),
            "trials_per_front_point": statistics.mean(per_front) if per_front else None, "runs": len(results)}


def summarise(with_t: list[list[Result]], fresh: list[list[Result]], args: argparse.Namespace) -> dict[str, object]:
    cap = args.max_trials
    positions = [{"position": i + 1, "with_transfer": _figures(w, cap), "fresh": _figures(f, cap)}
                 for i, (w, f) in enumerate(zip(with_t, fresh, strict=True))]
    kinds: dict[str, tuple[list[Result], list[Result]]] = {}
    for w, f in zip(with_t[1:], fresh[1:], strict=True):  # runs that started from a store
        for r, g in zip(w, f, strict=True):
            mine = kinds.setdefault(f"{r.model} ({r.kind})", ([], []))
            mine[0].append(r)
            mine[1].append(g)
    per_kind = [{"model": k, "with_transfer": _figures(w, cap), "fresh": _figures(f, cap)}
                for k, (w, f) in sorted(kinds.items())]
    every_w = [r for w in with_t for r in w]
    every_f = [r for f in fresh for r in f]
    first, last = positions[0]["with_transfer"], positions[-1]["with_transfer"]
    assert isinstance(first, dict) and isinstance(last, dict)
    losses = [r.loss for r in every_w if math.isfinite(r.loss)]
    targets = {
        "no_position_front_error_over_fresh_by_5pct": all(
            p["with_transfer"]["pretrial_front_error"] <= 1.05 * p["fresh"]["pretrial_front_error"]  # type: ignore[index]
            for p in positions),
        "no_run_loss_above_1.5": max(losses) <= 1.5,
        "last_front_error_within_10pct_of_ideal": last["pretrial_front_error"] <= 1.10 * last["ideal_front_error"],
        "last_trials_to_95pct_30pct_below_first": last["trials_to_95pct"] <= 0.7 * first["trials_to_95pct"],
    }
    return {"phase": PHASE, "space": SPACE.name, "models": list(args.models), "truths": args.truths,
            "first_truth": args.first_truth, "seeds": args.seeds, "max_trials": cap, "ablate": list(args.ablate),
            "model_layout_sigma": MODEL_LAYOUT_SIGMA, "positions": positions, "per_kind": per_kind,
            "pretrial_front_error": {"per_position": [p["with_transfer"]["pretrial_front_error"] for p in positions],  # type: ignore[index]
                                     "total": statistics.mean(r.pretrial_front_error for r in every_w),
                                     "oracle_total": statistics.mean(r.oracle_front_error for r in every_w),
                                     "ideal_total": statistics.mean(r.ideal_front_error for r in every_w),
                                     "fresh_total": statistics.mean(r.pretrial_front_error for r in every_f)},
            "trials_to_95pct": {"per_position": [p["with_transfer"]["trials_to_95pct"] for p in positions],  # type: ignore[index]
                                "total": sum(_mean_trials(w, cap) for w in with_t),
                                "fresh_total": sum(_mean_trials(f, cap) for f in fresh)},
            "max_run_loss": max(losses),
            "runs": [{"position": i + 1, "model": r.model, "kind": r.kind, "front_error": r.pretrial_front_error,
                      "fresh_front_error": g.pretrial_front_error, "loss": r.loss,
                      "guarded_front_error": r.guarded_front_error, "trials_to_95pct": r.trials_to_95pct,
                      "fresh_trials_to_95pct": g.trials_to_95pct, "guard": r.guard, "run": r.run,
                      "trials_per_front_point": r.trials_per_front_point,
                      "fresh_trials_per_front_point": g.trials_per_front_point, "launched": r.launched,
                      "fresh_launched": g.launched,
                      "ideal_front_error": r.ideal_front_error, "oracle_front_error": r.oracle_front_error}
                     for i, (w, f) in enumerate(zip(with_t, fresh, strict=True))
                     for r, g in zip(w, f, strict=True)],
            "targets_met": targets}


def print_table(out: dict, file) -> None:  # type: ignore[no-untyped-def]
    ablated = f", ablated: {', '.join(out['ablate'])}" if out["ablate"] else ""
    last_truth = out["first_truth"] + out["truths"] - 1
    print(f"\n## {out['phase']} of {out['space']}: truths {out['first_truth']}-{last_truth} x {out['seeds']} seeds, "
          f"models rotated ({', '.join(out['models'])}), {out['max_trials']} trials per study{ablated}", file=file)

    def cell(x: object) -> str:
        return "-" if x is None else f"{x:.3f}" if isinstance(x, float) and x < 1 else f"{x:.1f}"

    def row(label: str, w: dict, f: dict) -> str:
        return (f"| {label} | {cell(w['pretrial_front_error'])} ({cell(f['pretrial_front_error'])}; "
                f"{cell(w['ideal_front_error'])}) | {cell(w['guarded_front_error'])} | x{w['mean_loss']:.2f} / "
                f"x{w['max_loss']:.2f} | {cell(w['trials_to_95pct'])} ({cell(f['trials_to_95pct'])}) |")

    head = ("| pre-trial front error (fresh; ideal) | after the guard | loss vs fresh, mean / worst run "
            "| trials to 95% (fresh) |")
    print(f"| position {head}\n|---|---|---|---|---|", file=file)
    for p in out["positions"]:
        print(row(str(p["position"]), p["with_transfer"], p["fresh"]), file=file)
    print(f"\nPer model kind (positions 2-{len(out['positions'])}):\n\n| model (kernel kind) {head}\n"
          "|---|---|---|---|---|", file=file)
    for k in out["per_kind"]:
        print(row(k["model"], k["with_transfer"], k["fresh"]), file=file)
    over = [r for r in out["runs"] if r["loss"] > 1.5]
    for r in over:
        print(f"run over x1.5: {r['run']} #{r['position']} {r['model']}: x{r['loss']:.2f} ({r['front_error']:.3f} "
              f"against fresh {r['fresh_front_error']:.3f}); the ideal estimator x"
              f"{r['ideal_front_error'] / r['fresh_front_error']:.2f}, the oracle x"
              f"{r['oracle_front_error'] / r['fresh_front_error']:.2f}", file=file)
    print("\ntargets: " + ", ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in out["targets_met"].items()),
          file=file, flush=True)


if __name__ == "__main__":
    main()
