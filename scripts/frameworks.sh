#!/usr/bin/env bash
# frameworks.sh — installs a pinned deep-learning framework, with NVIDIA's
# CUDA libraries from PyPI, into a cached virtualenv, for the framework runs
# of scripts/gpu-check.sh (on the simulated driver or a real GPU).
#
# Usage: scripts/frameworks.sh torch|tensorflow|jax [CACHE_DIR]
#   CACHE_DIR: $CGPU_FRAMEWORKS_CACHE, else ~/.cache/cgpu/frameworks (outside
#   the repository, so every checkout and CI run on the machine reuses it).
# Prints the virtualenv's python. Idempotent: does nothing when the pinned
# set is already installed. Needs PyPI (pip) the first time:
#   torch       torch 2.15.0 (CUDA 13.2 wheels: cuBLAS 13.4, cuDNN 9.26), ~5.4 GB
#   tensorflow  tensorflow[and-cuda] 2.21.0 (CUDA 12.9 wheels), ~4 GB
#   jax         jax[cuda12] 0.10.2 (CUDA 12.9 wheels, cuDNN 9.28) with
#               cuda-bindings, so gpu-check's check 6 runs JAX beside its
#               cuda-bindings backend, ~5.5 GB. On a machine without an NVIDIA
#               GPU, JAX needs the device nodes shim/tools/sim-devnodes.sh gives
#               (it looks for /dev/nvidiactl before it tries CUDA)
# A new framework version is a new pinned set here (a new directory), never a
# silent change.
set -euo pipefail
NAME="${1:-}"
CACHE="${2:-${CGPU_FRAMEWORKS_CACHE:-$HOME/.cache/cgpu/frameworks}}"
case "$NAME" in
  torch)
    VER=2.15.0
    PKGS=(torch==2.15.0 numpy==2.4.6 nvidia-ml-py==13.615.71) ;;
  tensorflow)
    VER=2.21.0
    PKGS=("tensorflow[and-cuda]==2.21.0" nvidia-ml-py==13.615.71) ;;
  jax)
    VER=0.10.2
    PKGS=("jax[cuda12]==0.10.2" cuda-bindings==13.5.0 nvidia-ml-py==13.615.71) ;;
  *)
    echo "usage: scripts/frameworks.sh torch|tensorflow|jax [CACHE_DIR]" >&2
    exit 2 ;;
esac
VENV="$CACHE/$NAME-$VER"
STAMP="$VENV/.cgpu-frameworks-v1"
if [ -f "$STAMP" ]; then echo "$VENV/bin/python"; exit 0; fi
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock-$NAME"
flock 9
if [ -f "$STAMP" ]; then echo "$VENV/bin/python"; exit 0; fi
echo "frameworks: installing ${PKGS[*]} into $VENV (several GB, minutes)" >&2
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >&2
"$VENV/bin/pip" install --disable-pip-version-check -q --no-cache-dir "${PKGS[@]}" >&2
"$VENV/bin/python" - "$NAME" >&2 <<'PY'
import importlib, sys
m = importlib.import_module(sys.argv[1])
print("frameworks:", sys.argv[1], m.__version__, "installed")
PY
touch "$STAMP"
echo "$VENV/bin/python"
