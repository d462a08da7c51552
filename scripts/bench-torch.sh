#!/usr/bin/env bash
# bench-torch.sh — PyTorch with and without libcgpu.so, same run, as ratios:
#   startup  import torch + torch.zeros(1, device='cuda'), fresh processes
#   step     per-step time of a training-like loop (goal: <= 1.01x): median
#            of per-round ratios, interleaved rounds, with quartiles and range
# On the simulated driver unless --gpu (a real GPU and its driver).
#
# Usage: scripts/bench-torch.sh [--gpu] [--lib PATH] [--python PATH] [startup|step]...
#   --lib     libcgpu.so (default target/release/libcgpu.so; cgpuctl next to it)
#   --python  a Python with torch (default: scripts/frameworks.sh torch, pinned)
#   BENCH_STARTUP_ROUNDS (7) startup rounds; BENCH_ROUNDS (15) step rounds of
#   BENCH_STEP_SECONDS (1.0) each; BENCH_VARIANTS=native adds a process under
#   policy 5 (no compute control); BENCH_PERF=1 profiles each step process
#   with perf (share of CPU samples in libcgpu.so). On the sim every kernel
#   takes CGPU_SIM_KERNEL_NS (5000): the step is host-bound; 50000 makes it
#   bound by the device, as training usually is.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SIM=1
LIB="$ROOT/target/release/libcgpu.so"
PY=""
WHAT=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) SIM=0; shift ;;
    --lib) LIB="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) WHAT+=("$1"); shift ;;
  esac
done
[ -f "$LIB" ] || { echo "bench-torch: $LIB missing (cargo build --release)" >&2; exit 2; }
PY="${PY:-$("$ROOT/scripts/frameworks.sh" torch)}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/bench-torch.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
if [ "$SIM" = 1 ]; then
  SIM_LIB="$(dirname "$LIB")/libcgpu_sim.so"
  [ -f "$SIM_LIB" ] || { echo "bench-torch: $SIM_LIB missing (cargo build --release -p cgpu-sim)" >&2; exit 2; }
  mkdir -p "$WORK/lib" "$WORK/state"
  for n in libcuda.so.1 libcuda.so libnvidia-ml.so.1 libnvidia-ml.so; do ln -s "$SIM_LIB" "$WORK/lib/$n"; done
  export LD_LIBRARY_PATH="$WORK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CGPU_SIM_STATE="$WORK/state" CGPU_SIM_GPUS="${CGPU_SIM_GPUS:-15109:Tesla T4}"
fi
mkdir -p "$WORK/ledger"
export CGPU_LEDGER_DIR="$WORK/ledger" BENCH_LIB="$LIB" BENCH_WORK="$WORK" PYTHONDONTWRITEBYTECODE=1
echo "bench-torch: $("$PY" -c 'import torch; print("torch", torch.__version__)' 2>/dev/null), $([ "$SIM" = 1 ] && echo "simulated driver" || echo "real GPU"), $(nproc) CPUs, $(date -u '+%Y-%m-%d %H:%M UTC')"
exec "$PY" "$ROOT/scripts/gpu_check/bench_torch.py" "${WHAT[@]}"
