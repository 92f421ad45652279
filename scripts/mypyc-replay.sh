#!/usr/bin/env bash
# Measurement only (docs/benchmarks/replay-speed.md, "Compiled with mypyc"): the replay's hot modules compiled
# with mypyc into a *copy* of the tree, never in place (a compiled module shadows the .py file a developer edits,
# and an editable install would keep running the stale build). Not part of `make venv`: it was measured and not
# adopted. Usage, from the repository root:
#   bash scripts/mypyc-replay.sh [OUT]     (OUT defaults to /tmp/topotune-mypyc; ~2-5 min)
#   cd OUT && taskset -c 0 env PYTHONPATH=$PWD $REPO/.venv/bin/python benchmarks/replay_speed.py
set -euo pipefail
REPO=$(pwd)
OUT=${1:-/tmp/topotune-mypyc}
PY=${PYTHON:-$REPO/.venv/bin/python}
BASE=$("$PY" -c 'import sys; print(sys.base_prefix)')/bin/python3
rm -rf "$OUT" && mkdir -p "$OUT"
cp -r tuner examples benchmarks pyproject.toml README.md "$OUT/"
"$BASE" -m venv "$OUT/.mypyc-venv"
"$OUT/.mypyc-venv/bin/pip" install --quiet mypy==2.4.1 'setuptools>=77'
cd "$OUT"
"$OUT/.mypyc-venv/bin/mypyc" --follow-imports=silent --python-executable "$PY" \
    tuner/replay/_engine.py tuner/replay/_decoding.py tuner/replay/_kvcache.py tuner/replay/_pricing.py \
    tuner/replay/_requests.py tuner/replay/_replay.py tuner/replay/_router.py tuner/replay/_arrivals.py \
    tuner/replay/_report.py tuner/replay/_gaps.py > "$OUT/mypyc.log"
echo "compiled into $OUT; run: cd $OUT && taskset -c 0 env PYTHONPATH=$OUT $PY benchmarks/replay_speed.py"
