"""In-sample floor of the replay's error on the published workload rows: can #45's targets be met by this model?

`benchmarks/workload_fidelity.py --replay` scores each vLLM row with its GPU class's calibration fitted on the
fixed-length table without the row's source (held out). Here the calibration is instead fitted on the very figures it
is scored on: for each target (TTFT p50, TTFT p90/p99, ITL), the held-out path's factors (fidelity.FIT_FACTORS)
within the same bounds (fidelity._factor_bounds), with no prior and no other rows, are fitted by bounded least
squares (soft-L1 loss, close to the median the target takes) to that target's figures on the replayed rows, twice:
- one calibration for every row (the class calibration topotune ships, fitted on the evaluated rows themselves),
  starting from the class fit on every fixed-length source;
- one calibration per held-out fit (rows that share a held-out calibration share one), each starting from it. The
  held-out path's calibrations are one assignment of this family fitted on less, so its error on these rows is not
  below this floor: a floor above a target puts the target out of reach of this model on these rows.
The fit is local (a few steps of a finite-difference least squares on a replay that moves in small jumps), so a
floor printed is an upper bound of the true in-sample minimum: far above a target is strong evidence, just above it
weak, below it proves nothing. The per-fit floor printed is the lower of the fit and the held-out figure (both are
points of its family).

Also printed: the rows' own noise, where the data allow (rows of one source that differ only by what should not move
the figure, the rounding of the printed figures), and the spread between two sources at one model, GPU and step size.

Fitting replays the rows hundreds of times (`--refit`) and stores the calibrations in
benchmarks/data/workload_floor.json; the default run re-scores them (1,000 requests per row, as the held-out path)
beside the held-out figures.

Run: PYTHONPATH=. .venv/bin/python benchmarks/workload_floor.py [--refit] [--rows]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fidelity
import workload_fidelity as wf

from tuner.perf import Calibration

STORED = Path(__file__).resolve().parent / "data" / "workload_floor.json"
REFUSED_LOG_ERROR = math.log(10.0)  # a row the replay refuses counts as x10 off in the fit (it must not drop out)


@dataclass(frozen=True)
class Target:
    """One of #45's accuracy targets: the figures it pools, the median bound (%) and the worst bound (x)."""

    name: str
    keys: tuple[str, ...]
    median_pct: float
    worst_x: float | None


TARGETS = (Target("TTFT p50", ("ttft_p50",), 20.0, 2.0),
           Target("TTFT p90/p99", ("ttft_p90", "ttft_p99"), 20.0, 2.0),
           Target("ITL", wf.TPOT_KEYS + wf.ITL_KEYS, 15.0, None))


class Pinned:
    """Stands where workload_fidelity.Calibrations does in replay_row: every row gets its group's given calibration."""

    def __init__(self, cals: wf.Calibrations, fits: dict[str, Calibration]) -> None:
        self.cals, self.fits = cals, fits

    def held_out(self, gpu: str, source: str) -> tuple[Calibration, str]:
        cls, _ = self.cals.key(gpu, source)
        return self.fits[group_of(self.cals, gpu, source)], cls


def group_of(cals: wf.Calibrations, gpu: str, source: str) -> str:
    """The held-out fit a row is scored with, as a name: its class and the fixed-length sources held out."""
    cls, held = cals.key(gpu, source)
    return f"{cls}|{','.join(sorted(held)) or 'none held out'}"


def target_errors(row: dict, errors: dict[str, float], target: Target) -> list[float]:
    """The row's log errors on the target's figures; a figure the source reports but the replay did not give (it
    refused the row) counts as REFUSED_LOG_ERROR."""
    measured = wf._measured(row)
    return [errors.get(k, REFUSED_LOG_ERROR) for k in target.keys if k in measured]


def fit_floor(rows: Sequence[dict], pinned: Pinned, groups: Sequence[str], target: Target, requests: int,
              steps: int) -> Calibration:
    """One calibration for the rows of `groups` (starting from the first group's held-out fit) fitted to the
    target's figures on those rows (see the module docstring)."""
    from scipy.optimize import least_squares

    names = fidelity.FIT_FACTORS
    bounds = [fidelity._factor_bounds(n) for n in names]
    start = pinned.fits[groups[0]]
    x0 = [math.log(min(max(getattr(start, n), lo * 1.001), hi * 0.999)) for n, (lo, hi) in zip(names, bounds,
                                                                                               strict=True)]

    def calibration(x: Sequence[float]) -> Calibration:
        return start.model_copy(update={n: math.exp(v) for n, v in zip(names, x, strict=True)})

    def residuals(x: Sequence[float]) -> list[float]:
        cal = calibration(x)
        trial = Pinned(pinned.cals, {**pinned.fits, **{g: cal for g in groups}})
        return [e for row in rows for e in target_errors(row, wf.replay_row(row, trial, requests).errors, target)]

    result = least_squares(residuals, x0, bounds=([math.log(lo) for lo, _ in bounds],
                                                  [math.log(hi) for _, hi in bounds]),
                           loss="soft_l1", f_scale=0.1, diff_step=0.03, max_nfev=steps)
    return calibration(result.x)


def refit(rows: Sequence[dict], cals: wf.Calibrations, requests: int, steps: int, only: Sequence[str],
          store: Path) -> dict[str, dict]:
    """The floor fits: {"joint": {target: fields or None}, "per_fit": {target: {group: fields} or None}}.

    The one-calibration fit starts from the held-out fit that holds no source out (the class fit on every source).
    What the other floor would add is skipped (None): the per-fit floor where one calibration already reaches the
    target (the per-fit family contains it), the one-calibration floor where the per-fit one misses it."""
    groups = sorted({group_of(cals, str(r["gpu"]), str(r["source"])) for r in rows}, key=lambda g: "|none" not in g)
    held = Pinned(cals, {g: cals.held_out(*_gpu_source(rows, cals, g))[0] for g in groups})
    out: dict[str, dict] = json.loads(store.read_text())["fits"] if store.exists() else {"joint": {}, "per_fit": {}}
    began = time.perf_counter()
    for target in [t for t in TARGETS if not only or t.name in only]:
        mine = [r for r in rows if any(k in wf._measured(r) for k in target.keys)]
        order = ("per_fit", "joint") if target.worst_x is not None and "p90" in target.name else ("joint", "per_fit")
        out["joint"][target.name] = out["per_fit"][target.name] = None
        for kind in order:
            if kind == "joint":
                fields = fit_floor(mine, held, groups, target, requests, steps).model_dump(mode="json")
                pins = Pinned(cals, {g: Calibration(**fields) for g in groups})
            else:
                fields = {g: _fit_part(mine, cals, held, g, target, requests, steps) for g in groups}
                pins = Pinned(cals, {g: Calibration(**f) for g, f in fields.items()})
            out[kind][target.name] = fields
            store.write_text(json.dumps({"fit_requests": requests, "steps": steps, "fits": out}, indent=1,
                                        sort_keys=True) + "\n")  # after every fit: a long refit can be stopped
            figure = pooled(score(mine, pins), target).median_pct
            print(f"  fitted {target.name:<13} {kind:<8} on {len(mine):>2} rows: median {figure:5.1f}% "
                  f"({time.perf_counter() - began:5.0f} s)", flush=True)
            if (figure <= target.median_pct) == (kind == "joint"):
                break
    return out


def _fit_part(rows: Sequence[dict], cals: wf.Calibrations, held: Pinned, group: str, target: Target, requests: int,
              steps: int) -> dict:
    part = [r for r in rows if group_of(cals, str(r["gpu"]), str(r["source"])) == group]
    return (fit_floor(part, held, [group], target, requests, steps) if part else held.fits[group]).model_dump(
        mode="json")


def _gpu_source(rows: Sequence[dict], cals: wf.Calibrations, group: str) -> tuple[str, str]:
    row = next(r for r in rows if group_of(cals, str(r["gpu"]), str(r["source"])) == group)
    return str(row["gpu"]), str(row["source"])


@dataclass(frozen=True)
class Figures:
    """A target's pooled figures: median error (%), worst (x), how many."""

    median_pct: float
    worst_x: float
    n: int


def pooled(scored: Sequence[tuple[dict, dict[str, float]]], target: Target) -> Figures:
    """As workload_fidelity.replay_targets pools a target: the figures the replay gave, over the rows it scored."""
    values = [abs(errors[k]) for _, errors in scored for k in target.keys if k in errors]
    return Figures(statistics.median(wf._pct(v) for v in values), math.exp(max(values)), len(values))


def score(rows: Sequence[dict], source_of_cal: object, requests: int = 1000) -> list[tuple[dict, dict[str, float]]]:
    """Each row replayed with the calibration `source_of_cal.held_out` gives it: (row, log errors)."""
    out = []
    for row in rows:
        s = wf.replay_row(row, source_of_cal, requests)
        if s.errors:
            out.append((row, s.errors))
    return out


Scores = list[tuple[dict, dict[str, float]]]


def target_lines(held: Scores, joint: dict[str, Scores | None], per_fit: dict[str, Scores | None]) -> list[str]:
    """Per target: the held-out figure, the two in-sample floors ("-": not fitted, see refit), the target, and
    what they say."""
    lines = [f"\n#45's targets, vllm rows replayed: held out (as --replay) and the in-sample floors (fitted on these "
             f"figures: one calibration for every row | one per held-out fit)\n  {'':<40} {'held out':>9} "
             f"{'one cal.':>9} {'per fit':>9} {'target':>8}   verdict"]
    for t in TARGETS:
        h = pooled(held, t)
        j = pooled(joint[t.name], t) if joint[t.name] else None
        p = pooled(per_fit[t.name], t) if per_fit[t.name] else None
        lines.append(_line(f"{t.name} median error (n={h.n})", h.median_pct, j and j.median_pct,
                           p and min(p.median_pct, h.median_pct), t.median_pct, "%"))
        if t.worst_x is not None:
            lines.append(_line(f"{t.name} worst error (x)", h.worst_x, j and j.worst_x,
                               p and min(p.worst_x, h.worst_x), t.worst_x, "x"))
    return lines


def _line(name: str, held: float, joint: float | None, per_fit: float | None, goal: float, unit: str) -> str:
    """A target line; per_fit is the lower floor (the held-out assignment is one of its candidates)."""
    if held <= goal:
        verdict = "met"
    elif per_fit is not None and per_fit > goal:
        verdict = "out of reach: missed even fitted on these figures, one calibration per held-out fit"
    elif joint is not None and joint > goal:
        verdict = "out of reach for one class calibration fitted on these figures (per-source ones reach it)"
    elif joint is not None:
        verdict = "not met; not excluded (one calibration fitted on these figures reaches it)"
    else:
        verdict = "not met; not excluded (calibrations per held-out fit reach it)"

    def cell(v: float | None) -> str:
        return "-" if v is None else f"{v:.1f}%" if unit == "%" else f"x{v:.2f}"
    return f"  {name:<40} {cell(held):>9} {cell(joint):>9} {cell(per_fit):>9} {'<= ' + cell(goal):>8}   {verdict}"


def row_lines(held: Scores, joint: dict[str, Scores | None], per_fit: dict[str, Scores | None]) -> list[str]:
    """Per row and target figure: pred / measured held out, at the one-calibration floor, at the per-fit floor."""
    lines = ["\nper row, pred/measured: held out | one-calibration floor | per-fit floor (each target's own fit):"]
    for row, errors in held:
        cells = []
        for t in TARGETS:
            j = next((e for r, e in joint[t.name] or [] if r["id"] == row["id"]), {})
            p = next((e for r, e in per_fit[t.name] or [] if r["id"] == row["id"]), {})
            cells += [f"{k} x{math.exp(errors[k]):.2f}|{_x(j, k)}|{_x(p, k)}" for k in t.keys if k in errors]
        lines.append(f"  {row['id']:<32} {'  '.join(cells)}")
    return lines


def _x(errors: dict[str, float], key: str) -> str:
    return f"x{math.exp(errors[key]):.2f}" if key in errors else "-"


@dataclass(frozen=True)
class Twins:
    """Rows of one source that differ only in what should barely move a figure: their spread is the rows' noise
    (or an upper bound of it where a real effect is mixed in, as `why` says)."""

    what: str
    ids: tuple[str, ...]
    keys: tuple[str, ...]
    why: str


TWINS = (
    Twins("GPUStack Qwen3-8B ShareGPT, c1/c2/c4/c8", tuple(f"gs-q8b-h100-sharegpt-c{c}" for c in (1, 2, 4, 8)),
          ("ttft_p50",), "a p50 of 230-token prompts at <= 8 clients has no queue to move it; not monotone in load"),
    Twins("vLLM blog gpt-oss-20b, KV bf16/fp8/fp8-skip-sw",
          ("vb-fp8kv-gptoss20b-h100-bf16", "vb-fp8kv-gptoss20b-h100-fp8", "vb-fp8kv-gptoss20b-h100-fp8-skip-sw"),
          ("ttft_p50", "itl_p50"), "only the KV dtype differs (a real effect is mixed in: an upper bound)"),
    Twins("vLLM blog Llama-3.1-8B, KV bf16/fp8", ("vb-fp8kv-llama8b-h100-bf16", "vb-fp8kv-llama8b-h100-fp8"),
          ("ttft_p50",), "only the KV dtype differs (its ITL differs by the halved KV read: a real effect)"),
    Twins("llm-d 37-cap precise routing, 6/10/20 req/s",
          ("llmd37-precise-qps6", "llmd37-precise-qps10", "llmd37-precise-qps20"), ("ttft_mean", "ttft_p90"),
          "prefix-aware routing kept every stage unqueued: TTFT flat over a 3.3x load"),
)


def noise_lines(rows: Sequence[dict]) -> list[str]:
    """The rows' own spread (model-free): max / min - 1 within each group of twins, and the printed rounding of
    llm-d's ITL means."""
    by_id = {r["id"]: r for r in rows}
    lines = [f"\nthe rows' own noise (from the measured figures alone)\n  {'rows':<46} {'figure':<10} "
             f"{'values':<26} {'spread':>7}   why comparable"]
    for t in TWINS:
        for key in t.keys:
            values = [wf._measured(by_id[i])[key] for i in t.ids]
            lines.append(f"  {t.what:<46} {key:<10} {' / '.join(f'{v:g}' for v in values):<26} "
                         f"{(max(values) / min(values) - 1) * 100:6.1f}%   {t.why}")
    itl = [wf._measured(r)["itl_mean"] for r in rows if r["source"] in wf.LINE_TIMESTAMP_SOURCES]
    lines.append(f"  {'llm-d ITL means, printed to 1 ms':<46} {'itl_mean':<10} {f'{min(itl):g}..{max(itl):g} ms':<26} "
                 f"{50 / min(itl):6.1f}%   rounding alone (0.5 ms of the smallest)")
    return lines


def cross_source_lines(cals: wf.Calibrations, held: list[tuple[dict, dict[str, float]]]) -> list[str]:
    """gpt-oss-20b on one H100 measured by two sources, scored with the one calibration both get here (the class
    fit on every fixed-length source; GPUStack's bursts are in it, the vLLM blog is not): the model's prefill-bound
    speed over the measured one on each. A calibration between them errs by >= sqrt(ratio) - 1 on one source."""
    cal, _ = cals.held_out("h100", "vllm-blog-fp8-kvcache")
    bursts = [r for r in cals.rows if r.source == "gpustack-gpt-oss-20b-h100" and r.is_vllm]
    gs = [cals.replayer.predict(r, cal).tok_s_per_gpu / r.tok_s_per_gpu for r in bursts]
    blog = [math.exp(-e["ttft_p50"]) for r, e in held if r["id"].startswith("vb-fp8kv-gptoss20b") and "ttft_p50" in e]
    if not gs or not blog:
        return []
    ratio = statistics.median(gs) / statistics.median(blog)
    return ["\nbetween sources, gpt-oss-20b on one H100 with one calibration (model speed / measured speed):",
            f"  GPUStack bursts of 2k/4k/32k-token prompts (tok/s, vLLM 0.11)  "
            f"{' '.join(f'x{v:.2f}' for v in gs)}",
            f"  vLLM blog, 20k-token prompts at c8 (1 / TTFT p50)              "
            f"{' '.join(f'x{v:.2f}' for v in blog)}",
            f"  the sources disagree by x{ratio:.2f} (medians) at equal model, GPU and 8,192-token steps: one "
            f"calibration errs by >= {(math.sqrt(ratio) - 1) * 100:.0f}% on one of them"]


def load_floors(cals: wf.Calibrations, groups: Sequence[str], path: Path = STORED) -> tuple[dict, dict]:
    """The stored floor calibrations per target, as something replay_row takes (None where not fitted):
    (one calibration, per held-out fit)."""
    fits = json.loads(path.read_text())["fits"]
    joint, per_fit = {}, {}
    for t in TARGETS:
        one, per = fits["joint"].get(t.name), fits["per_fit"].get(t.name)
        if per is not None and set(groups) - set(per):
            raise SystemExit(f"{path.name} has no floor fit for {sorted(set(groups) - set(per))}: re-run --refit")
        joint[t.name] = None if one is None else Pinned(cals, {g: Calibration(**one) for g in groups})
        per_fit[t.name] = None if per is None else Pinned(cals, {g: Calibration(**per[g]) for g in groups})
    return joint, per_fit


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refit", action="store_true", help=f"fit the floors again and store them in {STORED.name}")
    ap.add_argument("--rows", action="store_true", help="print every row's figures held out and at the floor")
    ap.add_argument("--fit-requests", type=int, default=300, help="requests per row replayed while fitting")
    ap.add_argument("--steps", type=int, default=3, help="least-squares steps per fit (each ~14 replays per row)")
    ap.add_argument("--only", nargs="*", default=(), help="refit only these targets (by name) and stop")
    ap.add_argument("--store", type=Path, default=STORED, help="where the fitted floors are kept")
    args = ap.parse_args(argv)
    rows = [r for r in yaml.safe_load(wf.TABLE.read_text())["rows"] if r["engine"] == "vllm"]
    cals = wf.Calibrations()
    held = score(rows, cals)
    if args.refit or not args.store.exists():
        refit([r for r, _ in held], cals, args.fit_requests, args.steps, args.only, args.store)
        if args.only:
            return 0
    groups = sorted({group_of(cals, str(r["gpu"]), str(r["source"])) for r, _ in held})
    joint_pins, per_fit_pins = load_floors(cals, groups, args.store)
    scored = [r for r, _ in held]
    joint = {t.name: score([r for r in scored if any(k in wf._measured(r) for k in t.keys)], joint_pins[t.name])
             if joint_pins[t.name] else None for t in TARGETS}
    per_fit = {t.name: score([r for r in scored if any(k in wf._measured(r) for k in t.keys)], per_fit_pins[t.name])
               if per_fit_pins[t.name] else None for t in TARGETS}
    print("\n".join(target_lines(held, joint, per_fit)))
    if args.rows:
        print("\n".join(row_lines(held, joint, per_fit)))
    print("\n".join(noise_lines(rows)))
    print("\n".join(cross_source_lines(cals, held)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
