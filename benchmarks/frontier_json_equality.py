"""Does `topotune frontier --json` answer the same after a refactor? Save its JSON (and its errors) for a set of
commands, then compare a later tree's against them, key by key, `elapsed_s` aside.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/frontier_json_equality.py save /tmp/frontier-before
    ... change the code ...
    PYTHONPATH=$PWD .venv/bin/python benchmarks/frontier_json_equality.py compare /tmp/frontier-before

The commands cover closed and open loop; fixed lengths, a lognormal mix and the example trace; the hybrid reference
model (examples/models/qwen3.8-2.4t-a95b-nvfp4) and a non-hybrid MoE (examples/models/deepseek-v3); both modes and
one of each; SLA misses and budgets too small (an error's one line, stderr, and the exit code are compared too).
Prints one line per command and, last, `N of N commands compare equal`; exits 1 on any difference.
`compare DIR --ignore KEY[,KEY]` leaves out keys a change adds on purpose, at any depth (e.g. `operating_point`).
`--append ARG[,ARG]` adds arguments to every command (e.g. `--no-replay-verify`: a tree whose default decides with
the replay, compared against one that did not, with the replay off).

Since the replay decides under an SLA by default (#45), 4 commands with an SLA differ on purpose in
`recommendation.operating_point` (what the replay kept; its source reads "frontier (replay-verified)") and add
`replay_verification`; every command adds `recommendation.decided_by`; `compare DIR --append --no-replay-verify
--ignore decided_by` is equal on all 18 (docs/workloads.md, "Deciding with it", lists each difference).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REF = str(ROOT / "examples/models/qwen3.8-2.4t-a95b-nvfp4")
DSV3 = str(ROOT / "examples/models/deepseek-v3")
TRACE = str(ROOT / "examples/traces/chat-multiturn.jsonl")
LOGNORMAL = str(ROOT / "examples/workloads/chat-lognormal.yaml")
SLA = ["--max-ttft-ms", "1000", "--max-itl-ms", "30", "--min-tok-s-user", "40"]

# name -> the arguments after `topotune frontier MODEL`
COMMANDS: dict[str, list[str]] = {
    "ref-closed-fixed": [REF, "--gpus", "72", "--max-mtp", "1"],
    "ref-closed-trace-sla": [REF, "--gpus", "32", "--max-mtp", "1", "--workload", TRACE, *SLA],
    "ref-closed-lognormal-sla-p99": [REF, "--gpus", "72", "--max-mtp", "0", "--workload", LOGNORMAL,
                                     "--max-ttft-ms", "2000", "--max-itl-ms", "50", "--percentile", "p99"],
    "ref-closed-fixed-agg": [REF, "--gpus", "16", "--max-mtp", "2", "--mode", "agg", "--isl", "2000", "--osl", "500"],
    "ref-open-fixed-rate": [REF, "--gpus", "32", "--max-mtp", "0", "--isl", "2000", "--osl", "200",
                            "--request-rate", "5", "--max-ttft-ms", "2000", "--max-itl-ms", "40"],
    "ref-open-trace-own-rate": [REF, "--gpus", "16", "--max-mtp", "0", "--workload", TRACE, "--arrival", "trace",
                                "--max-ttft-ms", "1000", "--max-itl-ms", "30"],
    "ref-open-lognormal-rate": [REF, "--gpus", "32", "--max-mtp", "1", "--workload", LOGNORMAL,
                                "--request-rate", "3"],
    "dsv3-closed-fixed": [DSV3, "--gpus", "32", "--max-mtp", "1", "--isl", "4096", "--osl", "1024"],
    "dsv3-closed-trace-sla-disagg": [DSV3, "--gpus", "32", "--max-mtp", "0", "--workload", TRACE, "--mode", "disagg",
                                     *SLA],
    "dsv3-closed-lognormal": [DSV3, "--gpus", "24", "--max-mtp", "1", "--workload", LOGNORMAL, "--hardware", "b200"],
    "dsv3-open-fixed-rate": [DSV3, "--gpus", "32", "--max-mtp", "0", "--isl", "2000", "--osl", "200",
                             "--request-rate", "4", "--max-itl-ms", "50"],
    "dsv3-open-trace-rate": [DSV3, "--gpus", "32", "--max-mtp", "1", "--workload", TRACE, "--request-rate", "2",
                             "--arrival", "trace"],
    # errors: the field and the fix as the user reads them
    "err-ref-ttft-impossible": [REF, "--max-ttft-ms", "10"],
    "err-ref-budget-disagg": [REF, "--gpus", "8", "--mode", "disagg"],
    "err-ref-open-needs-gpus": [REF, "--max-mtp", "0", "--isl", "2000", "--osl", "200", "--request-rate", "60",
                                "--gpus", "8"],
    "err-ref-open-itl": [REF, "--gpus", "32", "--max-mtp", "0", "--isl", "2000", "--osl", "200",
                         "--request-rate", "5", "--min-tok-s-user", "2000"],
    "err-dsv3-bad-percentile": [DSV3, "--percentile", "p95"],
    "err-dsv3-arrival-poisson-no-rate": [DSV3, "--arrival", "poisson"],
}


def _run(args: list[str]) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    command = [sys.executable, "-c", "from tuner.cli import run; run()", "frontier", *args, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    out: dict[str, object] = {"exit": done.returncode}
    if done.returncode == 0:
        data = json.loads(done.stdout)
        data.pop("elapsed_s", None)
        out["json"] = data
    else:
        out["stderr"] = " ".join(done.stderr.split())
    return out


def _first_difference(a: object, b: object, path: str = "", ignore: frozenset[str] = frozenset()) -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted((set(a) | set(b)) - ignore):
            if key not in a or key not in b:
                return f"{path}.{key}: only in {'after' if key not in a else 'before'}"
            found = _first_difference(a[key], b[key], f"{path}.{key}", ignore)
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items before, {len(b)} after"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _first_difference(x, y, f"{path}[{i}]", ignore)
            if found:
                return found
        return None
    return None if a == b else f"{path}: {a!r} before, {b!r} after"


def main(argv: list[str]) -> int:
    options = dict(zip(argv[2::2], argv[3::2], strict=False))
    ignore = frozenset(options.pop("--ignore", "").split(",")) - {""}
    append = [a for a in options.pop("--append", "").split(",") if a]
    argv = argv[:2]
    if options or len(argv) != 2 or argv[0] not in ("save", "compare"):
        print(__doc__)
        return 2
    folder = Path(argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    same = 0
    for name, args in COMMANDS.items():
        got = _run([*args, *append])
        path = folder / f"{name}.json"
        if got["exit"] != (2 if name.startswith("err-") else 0):
            print(f"{name}: unexpected exit {got['exit']}: {got.get('stderr', '')}")
            continue
        if argv[0] == "save":
            path.write_text(json.dumps(got, indent=1, sort_keys=True))
            print(f"{name}: exit {got['exit']}, saved")
            same += 1
            continue
        diff = _first_difference(json.loads(path.read_text()), got, ignore=ignore)
        print(f"{name}: {'equal' if diff is None else 'DIFFERS ' + diff}")
        same += diff is None
    print(f"{same} of {len(COMMANDS)} commands compare equal" if argv[0] == "compare" else f"{same} saved")
    return 0 if same == len(COMMANDS) else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
