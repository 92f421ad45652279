"""The JSON of simulate, memory, frontier and plan commands, from this tree and from an earlier commit, compared.

    python benchmarks/knob_json_equality.py [--base 7dd0d64] [--models /work/shared/models]

Checks that deriving the knobs from Topology's fields (issue 50) changed no answer: each command runs once with the
base commit's code (git archive into a temporary folder) and once with this tree's, and the two JSON documents must
be equal (`elapsed_s`, wall time, aside). Prints one line per command; exits 1 when any differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMANDS = {  # name: topotune arguments ({m}: the models folder)
    "sim-dsv3-tep8": "simulate {m}/deepseek-v3 --topology TEP8 --mtp 2",
    "sim-dsv3-dep16-prefill": "simulate {m}/deepseek-v3 --topology DEP16 --role prefill --kv-cache-dtype fp8",
    "sim-dsv3-wide": "simulate {m}/deepseek-v3 --topology DEP32 --all2all-backend deepep_low_latency "
                     "--stream-interval 4",
    "sim-llama-agg": "simulate {m}/llama-3.1-70b --topology TP4 --role aggregated --max-num-seqs 128",
    "sim-qwen-next-rate": "simulate {m}/qwen3-next-80b-a3b --topology TP2 --request-rate 3",
    "mem-dsv3-eplb": "memory {m}/deepseek-v3 --topology DEP16 --num-redundant-experts 16",
    "mem-sweep": "memory {m}/deepseek-v3 --sweep --gpus 16",
    "fr-dsv3-itl": "frontier {m}/deepseek-v3 --gpus 32 --max-mtp 1 --max-itl-ms 40",
    "fr-llama-ttft": "frontier {m}/llama-3.1-70b --gpus 16 --max-ttft-ms 2000",
    "fr-qwen-rate": "frontier {m}/qwen3-next-80b-a3b --gpus 16 --request-rate 5 --kv-cache-dtype fp8",
    "plan-pd": "plan 3P:TP4DP2+EP,1D:TEP8 --mtp 2 --isl 8192 --osl 1024 --vllm-version 0.32.0",
}


def run(tree: Path, args: str) -> object:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", "from tuner.cli import run; run()", *args.split(), "--json"],
                         env=env, cwd=tree, capture_output=True, text=True, check=False)
    if out.returncode:
        return {"exit": out.returncode, "stderr": out.stderr.strip()[-300:]}
    data = json.loads(out.stdout)
    if isinstance(data, dict):
        data.pop("elapsed_s", None)
    return data


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", default="7dd0d64", help="the commit to compare with (default: issue 50's base)")
    parser.add_argument("--models", default="/work/shared/models", help="folder of the models' config.json folders")
    opts = parser.parse_args()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", opts.base], capture_output=True, check=True).stdout
    different = 0
    with tempfile.TemporaryDirectory() as base:
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(base, filter="data")
        for name, args in COMMANDS.items():
            command = args.format(m=opts.models)
            same = run(Path(base), command) == run(REPO, command)
            different += not same
            print(f"{'equal    ' if same else 'DIFFERENT'} {name}: topotune {command} --json")
    print(f"{len(COMMANDS) - different} of {len(COMMANDS)} equal (base {opts.base})")
    return 1 if different else 0


if __name__ == "__main__":
    sys.exit(main())
