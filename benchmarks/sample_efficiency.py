"""Sample efficiency against hidden truths: how much of a cluster's true front each sampler finds, per trial.

The backend answering trials is a hidden truth (tuner/backends/_truth.py): a simulator whose physics differ from
the tuner's (calibration factors drawn within their bounds, expert load imbalance, a step-time factor per
parallel layout, KV capacity a few percent off, noise per measurement, configs that crash at launch). The tuner
never sees a truth's parameters. The exhaustive baseline measures every config that fits (noiseless, the
truth's expectation); a study's hypervolume is that of the true curves of the configs it launched, so a lucky
noisy measurement earns nothing. Per phase and sampler, mean over truths x seeds:
  HV@5% / HV@10%: hypervolume ratio to the exhaustive front after 5% / 10% of the exhaustive trial count,
  trials to 95%: launched trials until 95% (median over the runs that reached it within the budget),
  trials per front config: launched trials / true-front configs found, when the run first reaches 95% (or at
    the budget). A config is on the true front when one of its points comes within the truth's measurement
    noise (4%; 5% for the exact truth) of it in both objectives: no single measurement can tell such a config
    from a front config. The same figure with a 1% tolerance is printed beside it.
  ± after a mean: its standard error over the runs it averages (truths x seeds; the worst truth's seeds), so a
    gap to a target can be told from the luck of the seeds.
  tuner CPU s/trial: the tuner's own CPU seconds per launched trial (sampler fit included, the backend's time
    excluded; CPU time because the machine is shared, wall time is printed for reference).
Goal (issue 13): the default sampler >= 95% within 10% on every truth and phase, <= 2.0 trials per front config.

    python benchmarks/sample_efficiency.py [--truth hidden|exact] [--truths 5] [--seeds 5] [--parallel 1]
                                           [--phases prefill decode] [--samplers auto gp tpe nsga2 random]
                                           [--budget-pct 10] [--json] [--runs PATH] [--per-truth] [--jobs 1]
                                           [--max-trials N]
`--per-truth`: a second table per phase, one row per truth and sampler (its mean over seeds): a mean over truths
hides which truth misses a target. `--first-truth 4 --truths 1 --seeds 20 --phases prefill --per-truth` is how
the 20-seed figure for prefill truth 4 (docs/benchmarks/sample-efficiency.md) is measured.
`--runs PATH`: every finished run is appended to PATH (JSON lines) and runs already there are read back instead of
re-run, so a long campaign (decode at 194 trials takes minutes per run) keeps its partial results and resumes.
`--jobs N`: the runs of a phase spread over N worker processes. A run's answers are seeded by its truth, trial and
sampler seed, never by the order runs are made in, so the figures are the same as with one process (timings
aside: N processes on fewer cores report a loaded machine's CPU seconds). Set OMP_NUM_THREADS=1 with it, or each
worker's numpy starts a thread per core: `OMP_NUM_THREADS=1 ... --jobs 2` ran the 25 prefill runs of `auto` in
24 s instead of 49 s on this 2-core machine, with the same figures.
`--max-trials N`: each run stops after N trials, for screening variants on decode (194 trials a run): a run not
at 95% by then is scored there, and HV@10% is read at the cap. The capped decode figures of
docs/benchmarks/sample-efficiency.md (runs capped at 70 trials) are
`--phases decode --samplers auto --first-truth 10 --max-trials 70`.
`--truth exact`: the old benchmark, the tuner's own simulator with 5% noise fixed per deployment.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

import optuna
from optuna.trial import TrialState

from tuner.backends import Backend, SimulatedBackend, TrialRequest, TrialResult, TrialStatus
from tuner.backends._truth import HiddenTruth, HiddenTruthBackend
from tuner.deployment import Deployment
from tuner.executors import LocalExecutor
from tuner.frontier import hypervolume_2d
from tuner.hardware import GpuSpec, get_gpu
from tuner.memory import MemoryInputs, compute_memory
from tuner.models import ModelSpec, load_model
from tuner.space import SearchSpace, StudyConstraints, load_space
from tuner.study import PhaseRun, TuneOptions, predicted_front_params
from tuner.study._objectives import phase_values
from tuner.study._trial_record import read_trials
from tuner.topology import Topology

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "examples" / "models" / "qwen3.8-2.4t-a95b-nvfp4"
SPACE = ROOT / "search_spaces" / "gb300-nvl72-8k1k.yaml"
EXACT_NOISE = 0.05
STRICT_TOLERANCE = 0.01
Point = tuple[float, float]


class TimedBackend(Backend):
    """Counts the backend's own seconds so the tuner's time per trial can be reported without them."""

    name = "timed"

    def __init__(self, inner: Backend) -> None:
        self.inner = inner
        self.seconds = 0.0
        self.cpu_seconds = 0.0

    def run(self, request: TrialRequest) -> TrialResult:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return self.inner.run(request)
        finally:
            self.seconds += time.perf_counter() - t0
            self.cpu_seconds += time.thread_time() - c0


@dataclass
class Ground:
    """One truth's answer for every fitting config of a phase: curves, exhaustive hypervolume, front configs
    (within the measurement noise of the front, and within 1%)."""

    curves: dict[Topology, list[Point]]
    hv: float
    front: set[Topology]
    strict_front: set[Topology]

    @property
    def count(self) -> int:
        return len(self.curves)


def unconstrained(space: SearchSpace) -> SearchSpace:
    """The reference space without its SLA: the benchmark scores the search on the whole front, as every figure
    in docs/benchmarks/sample-efficiency.md was measured (the SLA came later and would move the truths' fronts)."""
    return space.model_copy(update={"constraints": StudyConstraints(min_accuracy=space.constraints.min_accuracy)})


def ground_truth(space: SearchSpace, phase: str, model: ModelSpec, gpu: GpuSpec, backend: Backend,
                 noise: float) -> Ground:
    workload = space.phase_workload(phase)
    fitting = [t for t in space.expand(phase, model)
               if compute_memory(model, gpu, t, MemoryInputs(isl=workload.isl, osl=workload.osl)).fits]
    curves: dict[Topology, list[Point]] = {}
    for topo in fitting:
        request = TrialRequest(trial_id="exhaustive", model_path=str(MODEL), gpu=gpu.name,
                               deployment=Deployment.single(topo), workload=workload)
        if isinstance(backend, HiddenTruthBackend):
            points = [] if backend._truth.fails_at_launch(topo) else backend.expected_curve(request)
        else:
            points = list(backend.run(request).points)
        curves[topo] = [phase_values(phase, m) for m in points]
    every = [p for c in curves.values() for p in c]
    hv = hypervolume_2d(every, (0.0, 0.0))
    fronts = []
    for tolerance in (noise, STRICT_TOLERANCE):
        near = _near_front(every, tolerance)
        fronts.append({topo for topo, c in curves.items() if any(near(p) for p in c)})
    return Ground(curves=curves, hv=hv, front=fronts[0], strict_front=fronts[1])


def _near_front(every: list[Point], tolerance: float) -> Callable[[Point], bool]:
    """Whether a point is on the front or within the tolerance of it (near-ties count as front points)."""
    xs = sorted(x for x, _ in every)
    by_x = sorted(every)
    best_y_right = [0.0] * (len(by_x) + 1)  # best y among points at index >= i (x ascending)
    for i in range(len(by_x) - 1, -1, -1):
        best_y_right[i] = max(best_y_right[i + 1], by_x[i][1])

    def near(p: Point) -> bool:
        i = bisect.bisect_right(xs, p[0] * (1 + tolerance))
        return best_y_right[i] <= p[1] * (1 + tolerance)
    return near


@dataclass
class RunScore:
    hv_ratios: list[float]  # after each launched trial
    front_found: list[int]  # true-front configs among the launched, after each trial
    strict_found: list[int]  # the same within 1%
    tuner_cpu_s_per_trial: float
    tuner_wall_s_per_trial: float

    def ratio_at(self, trials: int) -> float:
        return self.hv_ratios[min(trials, len(self.hv_ratios)) - 1] if self.hv_ratios else 0.0

    def trials_to(self, ratio: float) -> int | None:
        return next((i + 1 for i, v in enumerate(self.hv_ratios) if v >= ratio), None)

    def trials_per_front_config(self, ratio: float, strict: bool = False) -> float:
        n = self.trials_to(ratio) or len(self.hv_ratios)
        found = (self.strict_found if strict else self.front_found)[n - 1] if n else 0
        return n / found if found else math.inf


def score(study: optuna.Study, space: SearchSpace, phase: str, ground: Ground, cpu_s: float,
          wall_s: float) -> RunScore:
    launched = [r for r in read_trials(study, (TrialState.COMPLETE,)) if r.is_launch]
    seen: list[Point] = []
    found: set[Topology] = set()
    strict: set[Topology] = set()
    ratios, fronts, stricts = [], [], []
    for t in launched:
        topo = space.topology(phase, t.params)
        if t.attrs.outcome is TrialStatus.OK:
            seen += ground.curves.get(topo, [])
            if topo in ground.front:
                found.add(topo)
            if topo in ground.strict_front:
                strict.add(topo)
        ratios.append(hypervolume_2d(seen, (0.0, 0.0)) / ground.hv)
        fronts.append(len(found))
        stricts.append(len(strict))
    n = max(1, len(launched))
    return RunScore(ratios, fronts, stricts, cpu_s / n, wall_s / n)


@dataclass
class Row:
    sampler: str
    scores: list[RunScore] = field(default_factory=list)
    per_truth: dict[int, list[RunScore]] = field(default_factory=dict)


def run_one(space: SearchSpace, phase: str, model: ModelSpec, gpu: GpuSpec, backend: Backend, sampler: str,
            seed: int, budget: int, parallel: int, ground: Ground) -> RunScore:
    timed = TimedBackend(backend)
    warm = sampler.endswith("+warm")
    name = sampler.removesuffix("+warm")
    run = PhaseRun(phase=phase, space=space, model=model, model_path=str(MODEL), gpu=gpu,  # type: ignore[arg-type]
                   storage=optuna.storages.InMemoryStorage(), study_name=f"{phase}-{sampler}-{seed}",
                   backend_name="simulated", executor=LocalExecutor(timed, max_parallel=parallel),
                   options=TuneOptions(trials=budget, sampler=name, seed=seed, warm_start=warm),
                   artifacts_dir=Path("/tmp/topotune-bench"),
                   warm_start_params=(lambda: predicted_front_params(space, phase, model, gpu)) if warm else None)
    t0, c0 = time.perf_counter(), time.process_time()
    study = run.run()
    return score(study, space, phase, ground, time.process_time() - c0 - timed.cpu_seconds,
                 time.perf_counter() - t0 - timed.seconds)


def _standard_error(values: list[float]) -> float | None:
    """Of the mean over runs: how far a figure would move with other seeds (a target within 2 of it is a tie)."""
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None


def summarise(row: Row, n5: int, n10: int, budget: int) -> dict[str, object]:
    reached = [s.trials_to(0.95) for s in row.scores]
    hits = [r for r in reached if r is not None]
    per_front = [s.trials_per_front_config(0.95) for s in row.scores]
    finite = [p for p in per_front if math.isfinite(p)]
    strict = [p for p in (s.trials_per_front_config(0.95, strict=True) for s in row.scores) if math.isfinite(p)]
    at_10pct = [s.ratio_at(n10) for s in row.scores]
    worst = min(([s.ratio_at(n10) for s in runs] for runs in row.per_truth.values()), key=statistics.mean)
    return {
        "hv_ratio_at_5pct": statistics.mean(s.ratio_at(n5) for s in row.scores),
        "hv_ratio_at_10pct": statistics.mean(at_10pct),
        "hv_ratio_at_10pct_se": _standard_error(at_10pct),
        "worst_truth_hv_ratio_at_10pct": statistics.mean(worst),
        "worst_truth_hv_ratio_at_10pct_se": _standard_error(worst),
        "trials_to_95pct": statistics.median(hits) if hits else None,
        "runs_reaching_95pct": f"{len(hits)}/{len(reached)}",
        "trials_per_front_point": statistics.mean(finite) if finite else None,
        "trials_per_front_point_se": _standard_error(finite),
        "trials_per_front_point_1pct": statistics.mean(strict) if strict else None,
        "tuner_cpu_s_per_trial": statistics.mean(s.tuner_cpu_s_per_trial for s in row.scores),
        "tuner_cpu_s_per_trial_max": max(s.tuner_cpu_s_per_trial for s in row.scores),
        "tuner_wall_s_per_trial": statistics.mean(s.tuner_wall_s_per_trial for s in row.scores),
        "budget": budget,
    }


@dataclass(frozen=True)
class RunKey:
    """What makes a run's score reusable: the same truth kind, phase, sampler, truth, seed, budget and parallelism."""

    truth_kind: str
    phase: str
    sampler: str
    truth: int
    seed: int
    budget: int
    parallel: int


def read_runs(path: Path) -> dict[RunKey, RunScore]:
    if not path.exists():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            out[RunKey(**entry["key"])] = RunScore(**entry["score"])
    return out


def append_run(path: Path, key: RunKey, score: RunScore) -> None:
    with path.open("a") as f:
        f.write(json.dumps({"key": asdict(key), "score": asdict(score)}) + "\n")


def per_truth(runs: list[RunScore], n5: int, n10: int, budget: int) -> dict[str, object]:
    """One truth's figures over its seeds (where a mean over truths hides which truth misses a target): the row's
    figures for these runs alone, and each run's trials to 95%."""
    figures = summarise(Row("", runs, {0: runs}), n5, n10, budget)
    figures["trials_to_95pct_each"] = sorted(r for r in (s.trials_to(0.95) for s in runs) if r is not None)
    return figures


def print_per_truth(samplers: list[str], summaries: dict[str, dict[str, object]], file: TextIO) -> None:
    print("\n| sampler | truth | HV at 10% | runs reaching 95% | trials to 95% (each run) | trials / front config |",
          file=file)
    print("|---|---|---|---|---|---|", file=file)
    for sampler in samplers:
        table = summaries[sampler]["per_truth"]
        assert isinstance(table, dict)
        for truth, t in sorted(table.items()):
            per_front = t["trials_per_front_point"]
            cell = f"{per_front:.2f}" if isinstance(per_front, float) else "-"
            print(f"| {sampler} | {truth} | {t['hv_ratio_at_10pct']:.1%} | {t['runs_reaching_95pct']} | "
                  f"{', '.join(map(str, t['trials_to_95pct_each'])) or '-'} | {cell} |", file=file, flush=True)


def print_header(n5: int, n10: int, file: TextIO) -> None:
    header = ["sampler", f"HV@{n5} (5%)", f"HV@{n10} (10%)", "worst truth @10%", "trials to 95%",
              "trials / front config (1%)", "tuner CPU s/trial (wall)"]
    print("| " + " | ".join(header) + " |", file=file)
    print("|" + "---|" * len(header), file=file, flush=True)


@dataclass(frozen=True)
class RunContext:
    """What every run of a phase shares: read by the worker processes, which inherit it when they fork."""

    space: SearchSpace
    model: ModelSpec
    gpu: GpuSpec
    backends: dict[int, Backend]
    grounds: dict[int, Ground]

    def run(self, key: RunKey) -> RunScore:
        return run_one(self.space, key.phase, self.model, self.gpu, self.backends[key.truth], key.sampler, key.seed,
                       key.budget, key.parallel, self.grounds[key.truth])


_FORKED: RunContext | None = None  # the context a forked worker inherits (set just before the pool starts)


def _run_in_worker(key: RunKey) -> tuple[RunKey, RunScore]:
    assert _FORKED is not None
    return key, _FORKED.run(key)


def run_all(context: RunContext, keys: list[RunKey], jobs: int) -> Iterator[tuple[RunKey, RunScore]]:
    """Each run's score as it finishes: in this process for one job, else over `jobs` forked workers (the
    context is large, and forking shares it instead of pickling it into every task)."""
    if jobs == 1 or len(keys) <= 1:
        yield from ((key, context.run(key)) for key in keys)
        return
    global _FORKED
    _FORKED = context
    with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("fork")) as pool:
        pending: list[Future[tuple[RunKey, RunScore]]] = [pool.submit(_run_in_worker, key) for key in keys]
        try:
            for future in as_completed(pending):
                yield future.result()
        except BaseException:  # a failed run or ^C: the runs not started are dropped, the finished ones are logged
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def truths(kind: str, count: int, first: int) -> list[tuple[int, Backend, float]]:
    """(truth id, backend, its measurement noise)."""
    if kind == "exact":
        return [(0, SimulatedBackend(noise=EXACT_NOISE), EXACT_NOISE)]
    out: list[tuple[int, Backend, float]] = []
    for i in range(first, first + count):
        truth = HiddenTruth.draw(i)
        out.append((i, HiddenTruthBackend(truth), truth.noise))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--truth", choices=["hidden", "exact"], default="hidden")
    ap.add_argument("--truths", type=int, default=5, help="hidden truths (seeds of the truth)")
    ap.add_argument("--first-truth", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=5, help="sampler seeds per truth")
    ap.add_argument("--phases", nargs="+", default=["prefill", "decode"])
    ap.add_argument("--samplers", nargs="+", default=["auto", "gp", "tpe", "nsga2", "random"])
    ap.add_argument("--budget-pct", type=float, default=10.0, help="trials per run, %% of the exhaustive count")
    ap.add_argument("--max-trials", type=int,
                    help="stop each run here (a screening run: figures past it are read at the cap)")
    ap.add_argument("--parallel", type=int, default=1, help="trials in flight (batched proposals)")
    ap.add_argument("--json", action="store_true", help="print the figures as JSON (the tables go to stderr)")
    ap.add_argument("--runs", type=Path, help="JSON-lines log of finished runs: appended to, and resumed from")
    ap.add_argument("--per-truth", action="store_true",
                    help="also a table per truth (the row's figures for its seeds, each run's trials to 95%%)")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes the runs are spread over (same figures)")
    args = ap.parse_args()
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1 (got {args.jobs})")
    if args.max_trials is not None and args.max_trials < 1:
        ap.error(f"--max-trials must be at least 1 (got {args.max_trials})")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    space, model, gpu = unconstrained(load_space(SPACE)), load_model(MODEL), get_gpu("gb300")
    out: dict[str, dict[str, dict[str, object]]] = {}
    chosen = truths(args.truth, args.truths, args.first_truth)
    done = read_runs(args.runs) if args.runs else {}
    for phase in args.phases:
        t0 = time.perf_counter()
        grounds = {i: ground_truth(space, phase, model, gpu, b, noise) for i, b, noise in chosen}
        count = next(iter(grounds.values())).count
        n5, n10 = math.ceil(0.05 * count), math.ceil(0.1 * count)
        budget = max(n10, math.ceil(args.budget_pct / 100 * count))
        capped = args.max_trials is not None and args.max_trials < budget
        budget = min(budget, args.max_trials) if capped else budget
        fronts = ", ".join(f"{len(g.front)} ({len(g.strict_front)})" for g in grounds.values())
        log = sys.stderr if args.json else sys.stdout
        print(f"\n## {phase}: {args.truth} truth x{len(chosen)}, {args.seeds} seeds; {count} fitting configs, "
              f"true-front configs per truth, within noise (1%): {fronts}; budget {budget} trials"
              f"{' (capped: a figure past the cap is read at it)' if capped else ''}; ground truth in "
              f"{time.perf_counter() - t0:.1f} s", file=log, flush=True)
        print_header(n5, n10, log)
        keys = {sampler: [RunKey(args.truth, phase, sampler, i, seed, budget, args.parallel)
                          for i, _, _ in chosen for seed in range(args.seeds)] for sampler in args.samplers}
        context = RunContext(space, model, gpu, {i: b for i, b, _ in chosen}, grounds)
        finishing = run_all(context, [k for ks in keys.values() for k in ks if k not in done], args.jobs)
        summaries: dict[str, dict[str, object]] = {}
        for sampler in args.samplers:
            row = Row(sampler)
            for key in keys[sampler]:  # in (truth, seed) order, whichever process finished first
                while key not in done:
                    finished, s = next(finishing)
                    done[finished] = s
                    if args.runs:
                        append_run(args.runs, finished, s)
                row.scores.append(done[key])
                row.per_truth.setdefault(key.truth, []).append(done[key])
            summaries[sampler] = summarise(row, n5, n10, budget)
            print("| " + " | ".join(_cells(sampler, summaries[sampler])) + " |", file=log, flush=True)
            if args.per_truth:
                summaries[sampler]["per_truth"] = {i: per_truth(runs, n5, n10, budget)
                                                   for i, runs in row.per_truth.items()}
        assert next(finishing, None) is None  # every run was read: the workers are done and the pool closes
        if args.per_truth:
            print_per_truth(args.samplers, summaries, log)
        out[phase] = summaries
    if args.json:
        print(json.dumps(out, indent=2))


def _cells(name: str, s: dict[str, object]) -> list[str]:
    to95, per_front, strict = s["trials_to_95pct"], s["trials_per_front_point"], s["trials_per_front_point_1pct"]
    return [name, f"{s['hv_ratio_at_5pct']:.1%}", _percent(s["hv_ratio_at_10pct"], s["hv_ratio_at_10pct_se"]),
            _percent(s["worst_truth_hv_ratio_at_10pct"], s["worst_truth_hv_ratio_at_10pct_se"]),
            f"{to95:.0f} ({s['runs_reaching_95pct']} runs)" if to95 is not None else f"> {s['budget']}",
            (f"{per_front:.2f}" + _se(s["trials_per_front_point_se"]) if per_front is not None else "-")
            + (f" ({strict:.1f})" if strict else " (-)"),
            f"{s['tuner_cpu_s_per_trial']:.3f} ({s['tuner_wall_s_per_trial']:.2f})"]


def _se(se: object) -> str:
    return f" ± {se:.2f}" if isinstance(se, float) else ""


def _percent(mean: object, se: object) -> str:
    return f"{float(mean):.1%}" if not isinstance(se, float) else f"{float(mean) * 100:.1f} ± {se * 100:.1f}%"


if __name__ == "__main__":
    main()
