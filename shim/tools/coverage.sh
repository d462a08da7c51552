#!/usr/bin/env bash
# Measures how much of what NVIDIA's cuda-bindings resolves at start the
# simulated driver has: every cuGetProcAddress look-up of `cuInit` through the
# bindings, answered by the sim (CGPU_SIM_TRACE=1), then counted by
# shim/tools/coverage.py. Run from anywhere:
#   shim/tools/coverage.sh [--names]
# Environment: CUDA_BINDINGS (the pinned version, default 13.5.0),
# CGPU_SIM_DRIVER_VERSION (the simulated driver, default 13050: the sim's own
# default, the newest it implements, as new as those bindings). Fetches the
# bindings into target/sim-coverage/venv.
set -euo pipefail
cd "$(dirname "$0")/../.."
VER="${CUDA_BINDINGS:-13.5.0}"
DRIVER="${CGPU_SIM_DRIVER_VERSION:-13050}"
OUT=target/sim-coverage
VENV="$OUT/venv-$VER"
if [ ! -f "$VENV/.done" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV" >&2
  "$VENV/bin/pip" install --disable-pip-version-check -q "cuda-bindings==$VER" >&2
  touch "$VENV/.done"
fi
cargo build -q -p cgpu-sim >&2
target/debug/cgpu-sim-stat --install-dir "$OUT/lib" --lib target/debug/libcgpu_sim.so >/dev/null
STATE=$(mktemp -d)
trap 'rm -rf "$STATE"' EXIT
CGPU_SIM_STATE="$STATE" CGPU_SIM_TRACE=1 CGPU_SIM_DRIVER_VERSION="$DRIVER" \
  LD_LIBRARY_PATH="$OUT/lib" "$VENV/bin/python" -c '
from cuda.bindings import driver as d
err, = d.cuInit(0)
assert err == d.CUresult.CUDA_SUCCESS, err
' 2> "$OUT/trace.txt"
echo "cuda-bindings $VER on cgpu-sim (driver version $DRIVER)"
python3 shim/tools/coverage.py "$OUT/trace.txt" "$@"
