"""Runs NVIDIA aiconfigurator on every public measurement it can represent and stores its figures.

For each row of benchmarks/data/public_measurements.yaml this maps the row's model, GPU, engine, parallel layout,
load and lengths onto `aiconfigurator cli estimate` (aiconfigurator 0.12, Apache-2.0, on PyPI), runs it, and writes
its figures WITH the exact command to benchmarks/data/aiconfigurator.yaml, plus, for every row it cannot represent,
why. benchmarks/fidelity.py reads that file, so the side-by-side comparison runs without aiconfigurator installed.

aiconfigurator pins its own dependencies, so it lives in a venv of its own and is only ever run as a command
(never imported by topotune):

    python3 -m venv ~/.cache/topotune/aic-venv && ~/.cache/topotune/aic-venv/bin/pip install aiconfigurator==0.12.0
    .venv/bin/python benchmarks/aiconfigurator_runs.py --run      # ~10 min on 2 cores; rewrites the stored file

Mapping (a new user's reading of aiconfigurator's --help, checked against its source, aiconfigurator/cli/api.py):
- model: the checkpoint's config shipped in aiconfigurator_core/model_configs when there is one (no hub access
  here), else the row's own config.json directory (the path the row replays with);
- system: h100 -> h100_sxm, h200 -> h200_sxm, b200 -> b200_sxm, gb200 / gb300 as named;
- layout: --tp TP; DP ranks as attention DP (--dp); MoE layers over TP x DP GPUs, split by experts with EP
  (--moe-ep-size, --moe-tp-size 1) or by tensor without (--moe-tp-size, --moe-ep-size 1);
- load: --batch-size is per attention-DP rank (aiconfigurator prints Concurrency = batch x DP): a closed loop's
  clients, a burst's prompts, capped by --max-num-seqs; the peak of a sweep is the best of aiconfigurator's own
  estimates over the same concurrency ladder topotune sweeps (the layout is fixed by the row, so `cli default`,
  which searches layouts, would answer another question);
- --isl / --osl the row's mean lengths; --ctx-tokens the vLLM row's --max-num-batched-tokens (the chunked-prefill
  budget per step); --kvcache-quant-mode fp8 with --kv-cache-dtype fp8; --free-gpu-memory-fraction the row's own
  --gpu-memory-utilization when the source set one;
- role: aggregated rows use the default IFB mode (agg); a PD decode role uses static_gen (a decode-only batch);
  a prefill-only closed loop (one output token, where agg reports 0 tokens/s) uses static_ctx with the prompts
  vLLM prefills per step and rank (--max-num-batched-tokens // ISL).
aiconfigurator answers with its own performance database (vLLM 0.24.0, SGLang 0.5.14, TRT-LLM 1.3.0rc20 data):
the engine version of a row is not an input it takes.

Run: .venv/bin/python benchmarks/aiconfigurator_runs.py [--run] [--aic PATH] [--only ID ...]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fidelity import TABLE, Row, load_table, peer_throughput

from tuner.models import load_model
from tuner.perf import DECODE_LADDER
from tuner.topology import Role, Topology

REPO = Path(__file__).resolve().parents[1]
STORED = REPO / "benchmarks" / "data" / "aiconfigurator.yaml"
DEFAULT_AIC = Path(os.environ.get("TOPOTUNE_AIC", Path.home() / ".cache/topotune/aic-venv/bin/aiconfigurator"))
AIC_VERSION = "0.12.0"
SYSTEMS = {"h100": "h100_sxm", "h200": "h200_sxm", "b200": "b200_sxm", "gb200": "gb200", "gb300": "gb300"}
MODES = {"aggregated": "agg", "decode": "static_gen", "prefill": "static_ctx"}
RUN_TIMEOUT_S = 300
#: The summary box's lines (aiconfigurator/cli/main.py) and the stored field each becomes.
FIGURES = {"TTFT": "ttft_ms", "TPOT": "tpot_ms", "tokens/s/gpu": "output_tok_s_per_gpu", "seq/s": "seq_per_s",
           "Concurrency": "concurrency", "Memory (GPU)": "memory_gb"}
WARNINGS = (re.compile(r"exceeds estimated KV cache capacity"), re.compile(r"OOM: .*"))


@dataclass(frozen=True)
class Plan:
    """One row's aiconfigurator invocation(s), or why there is none."""

    row: Row
    args: tuple[str, ...] = ()
    batches: tuple[int, ...] = ()  # per attention-DP rank; several = the peak of a sweep
    why: str = ""


def shipped_configs(aic: Path) -> set[str]:
    """HF ids whose config.json aiconfigurator ships (it has no hub access here)."""
    root = aic.parent.parent / "lib"
    found = set()
    for d in root.glob("python3*/site-packages/aiconfigurator_core/model_configs"):
        found |= {p.name.removesuffix("_config.json").replace("--", "/", 1) for p in d.glob("*_config.json")}
    return found


def plan(row: Row, shipped: set[str]) -> Plan:
    """Maps a row onto aiconfigurator's estimate flags (see the module docstring)."""
    system = SYSTEMS.get(row.gpu)
    if system is None:
        return Plan(row, why=f"GPU {row.gpu!r} has no aiconfigurator system")
    if row.role not in MODES:
        return Plan(row, why=f"role {row.role!r} has no aiconfigurator mode")
    model_path = row.checkpoint if row.checkpoint in shipped else row.model
    config = json.loads((REPO / row.model / "config.json").read_text())
    arch = (config.get("architectures") or ["?"])[0]
    unsupported = {"Glm4MoeForCausalLM": "GLM-4.x MoE (Glm4MoeForCausalLM)",
                   "Qwen3NextForCausalLM": "Qwen3-Next's hybrid linear attention (Qwen3NextForCausalLM)"}
    if arch in unsupported and model_path == row.model:
        return Plan(row, why=f"aiconfigurator 0.12 does not support {unsupported[arch]}: 'The model's "
                             f"architecture {arch} is not supported'")
    topo = Topology.parse(row.topology, role=Role.BOTH)
    if topo.dp > 1 and not topo.ep:
        return Plan(row, why="DP without expert parallelism has no aiconfigurator layout (its --dp is attention DP "
                             "inside one MoE group)")
    moe = load_model(REPO / row.model).moe is not None
    flags = row.engine_flags
    # a prefill-only closed loop (one output token): agg mode reports no throughput for it (0 output tokens), so
    # it is a static prefill batch of what vLLM prefills per step and rank, its token budget in whole prompts
    prefill_only = row.role == "aggregated" and round(row.osl) <= 1
    mode = "static_ctx" if prefill_only else MODES[row.role]
    args = ["--model", model_path, "--system", system, "--backend", row.engine,
            "--estimate-mode", mode, "--isl", str(max(1, round(row.isl))),
            "--osl", str(max(1, round(row.osl))), "--tp", str(topo.tp)]
    if topo.dp > 1:
        args += ["--dp", str(topo.dp)]
    if moe:
        group = topo.tp * topo.dp
        args += ["--moe-ep-size", str(group), "--moe-tp-size", "1"] if topo.ep else \
            ["--moe-tp-size", str(group), "--moe-ep-size", "1"]
    serve = dict(row.serve)
    if row.engine == "vllm" and mode == "agg":
        args += ["--ctx-tokens", str(flags["max_num_batched_tokens"])]
    if str(flags["kv_cache_dtype"]).startswith("fp8"):
        args += ["--kvcache-quant-mode", "fp8"]
    if "gpu_memory_utilization" in serve:
        args += ["--free-gpu-memory-fraction", str(serve["gpu_memory_utilization"])]
    per_rank_cap = int(flags["max_num_seqs"])
    if prefill_only:
        per_rank_cap = min(per_rank_cap, max(1, int(flags["max_num_batched_tokens"]) // max(1, round(row.isl))))
    if row.load_kind == "peak":
        batches = tuple(sorted({min(per_rank_cap, max(1, c // topo.dp)) for c in DECODE_LADDER
                                if c <= row.load_value}))
    else:
        batches = (min(per_rank_cap, max(1, math.ceil(row.load_value / topo.dp))),)
    return Plan(row, tuple(args), batches)


def command(aic_name: str, args: Sequence[str], batch: int) -> list[str]:
    return [aic_name, "cli", "estimate", *args, "--batch-size", str(batch), "--no-color"]


def parse(text: str) -> dict[str, object]:
    """The figures of aiconfigurator's summary box, and the warnings it printed."""
    out: dict[str, object] = {}
    for label, key in FIGURES.items():
        m = re.search(rf"^\s*{re.escape(label)}:\s+([\d,.]+)", text, re.MULTILINE)
        if m:
            out[key] = float(m.group(1).replace(",", ""))
    m = re.search(r"^\s*Backend:\s+(\S+) \(([^)]+)\)", text, re.MULTILINE)
    if m:
        out["perf_db"] = f"{m.group(1)} {m.group(2)}"
    warnings = sorted({w.group(0) for pattern in WARNINGS for w in pattern.finditer(text)})
    if warnings:
        out["warnings"] = warnings
    return out


def run_one(aic: Path, args: Sequence[str], batch: int) -> tuple[dict[str, object] | None, str]:
    cmd = command(str(aic), args, batch)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                          env={**os.environ, "AICONFIGURATOR_LOG_LEVEL": "WARNING"})
    text = proc.stdout + proc.stderr
    if proc.returncode != 0:
        err = [ln for ln in text.splitlines() if ln.startswith("Error") or "Error:" in ln]
        return None, (err[-1] if err else text.strip().splitlines()[-1]).strip()
    figures = parse(text)
    if "seq_per_s" not in figures:
        return None, "no figures in aiconfigurator's output"
    return figures, ""


def throughput(figures: dict[str, object], row: Row) -> float:
    """The row's own throughput figure from aiconfigurator's (output) tokens/s/gpu."""
    return peer_throughput(figures, row)


def _is_oom(figures: dict[str, object] | None, err: str) -> bool:
    return "OOM" in err or any(str(w).startswith("OOM") for w in (figures or {}).get("warnings", []))  # type: ignore[union-attr]


def fitting_batch(aic: Path, args: Sequence[str], batch: int) -> tuple[int, dict[str, object]] | None:
    """The largest batch up to `batch` that aiconfigurator does not call OOM, and its figures.

    aiconfigurator sizes the KV cache for every request of the batch at full length and refuses a batch that does
    not fit; vLLM admits only what fits and queues the rest, so the row runs at that capacity. Bisects over the
    concurrency ladder (a few runs)."""
    candidates = sorted({c for c in DECODE_LADDER if c < batch} | {batch})
    lo, hi, best = 0, len(candidates) - 1, None
    while lo <= hi:
        mid = (lo + hi) // 2
        figures, err = run_one(aic, args, candidates[mid])
        if figures is not None and not _is_oom(figures, err):
            best, lo = (candidates[mid], figures), mid + 1
        elif _is_oom(figures, err):
            hi = mid - 1
        else:
            return None
    return best


def execute(p: Plan, aic: Path) -> dict[str, object]:
    best: dict[str, object] | None = None
    tried = []
    for batch in p.batches:
        figures, err = run_one(aic, p.args, batch)
        note = ""
        if _is_oom(figures, err):
            if len(p.batches) > 1:
                continue  # a sweep's point that does not fit is not a candidate
            fit = fitting_batch(aic, p.args, batch)
            if fit is None:
                return {"id": p.row.id, "why": f"aiconfigurator reports OOM even at batch 1: {err or figures}",
                        "command": shlex.join(command("aiconfigurator", p.args, batch))}
            note = (f"batch {batch} per rank is OOM for aiconfigurator (KV for the whole batch at full length); "
                    f"the largest batch it accepts stands for the KV-bound run")
            batch, figures = fit
        elif figures is None:
            return {"id": p.row.id, "why": f"aiconfigurator failed: {err}",
                    "command": shlex.join(command("aiconfigurator", p.args, batch))}
        tried.append(batch)
        entry = {"id": p.row.id, "command": shlex.join(command("aiconfigurator", p.args, batch)),
                 "batch_per_rank": batch, **figures}
        if note:
            entry["note"] = note
        if best is None or throughput(entry, p.row) > throughput(best, p.row):
            best = entry
    if best is None:
        return {"id": p.row.id, "why": "aiconfigurator reports OOM at every batch of the sweep"}
    if len(tried) > 1:
        best["swept_batches_per_rank"] = tried
    return best


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", action="store_true", help="run aiconfigurator and rewrite the stored file")
    parser.add_argument("--aic", type=Path, default=DEFAULT_AIC, help="the aiconfigurator executable")
    parser.add_argument("--only", nargs="*", default=None, help="re-run these row ids, keep the others stored")
    args = parser.parse_args(argv)
    _, rows = load_table(TABLE)
    if not args.aic.exists():
        print(f"aiconfigurator not found at {args.aic}: install it in its own venv (see this file's docstring) "
              f"or pass --aic PATH")
        return 0 if not args.run else 2
    plans = [plan(r, shipped_configs(args.aic)) for r in rows]
    if not args.run:
        for p in plans:
            print(f"{p.row.id:<36} " + (shlex.join(command("aiconfigurator", p.args, p.batches[-1]))
                                         if p.args else f"(not run: {p.why})"))
        return 0
    old = {e["id"]: e for e in yaml.safe_load(STORED.read_text())["rows"]} if STORED.exists() and args.only else {}
    entries = []
    for p in plans:
        if args.only is not None and p.row.id not in args.only and p.row.id in old:
            entries.append(old[p.row.id])
            continue
        entry = execute(p, args.aic) if p.args else {"id": p.row.id, "why": p.why}
        print(f"{p.row.id:<36} " + (f"{throughput(entry, p.row):10,.0f} tok/s/GPU  TPOT {entry.get('tpot_ms')} ms"
                                     if "why" not in entry else f"not run: {entry['why']}"), flush=True)
        entries.append(entry)
    header = ("# aiconfigurator's estimates of benchmarks/data/public_measurements.yaml's rows, written by\n"
              "# benchmarks/aiconfigurator_runs.py --run (each `command` reproduces its row from the repository's\n"
              "# root with aiconfigurator 0.12.0 in its own venv). output_tok_s_per_gpu is aiconfigurator's\n"
              "# tokens/s/gpu (output tokens); benchmarks/fidelity.py adds the prompts' tokens for rows counting\n"
              "# total tokens.\n"
              "# Rows with `why` were not estimated, for that reason.\n")
    STORED.write_text(header + yaml.safe_dump({"aiconfigurator": AIC_VERSION, "rows": entries}, sort_keys=False,
                                              width=100_000))
    print(f"wrote {STORED.relative_to(REPO)}: {sum('why' not in e for e in entries)} estimated, "
          f"{sum('why' in e for e in entries)} not")
    return 0


if __name__ == "__main__":
    sys.exit(main())
