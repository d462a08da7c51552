#!/usr/bin/env bash
# Fetches what the tests need from PyPI into a venv under target/ (never committed):
#   - cuda-bindings     NVIDIA's Python driver bindings (run unmodified on the sim; pinned:
#                       shim/tests/coverage.rs checks what this version resolves)
#   - nvidia-ml-py      pynvml (run unmodified on the sim)
#   - nvidia-cuda-runtime-cu12, nvidia-nvml-dev: the real cuda.h / nvml.h headers,
#                       and NVIDIA's CUDA 12 runtime (libcudart.so.12, pinned)
#   - in VENV/cuda13 (apart, so that its headers never shadow CUDA 12's):
#     nvidia-cuda-runtime (libcudart.so.13 and its headers, pinned) and
#     nvidia-cuda-crt (crt/host_defines.h, which cuda_runtime_api.h includes;
#     the CUDA 12 runtime tests use it too: CUDA 12 ships it only with nvcc)
# Usage: scripts/test-deps.sh [VENV_DIR]   (default: target/test-deps/venv)
# Idempotent: does nothing when the venv is complete. Prints the venv path.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-target/test-deps/venv}"
STAMP="$VENV/.cgpu-test-deps-v2"
PKGS=(cuda-bindings==13.5.0 nvidia-ml-py==13.615.71 nvidia-cuda-runtime-cu12==12.9.79 nvidia-nvml-dev)
CUDA13=(nvidia-cuda-runtime==13.5.37 nvidia-cuda-crt==13.5.37)
if [ -f "$STAMP" ]; then echo "$VENV"; exit 0; fi
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  echo "test-deps: python3-venv missing; installing it with apt-get" >&2
  (apt-get update && apt-get install -y python3-venv) >&2
fi
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV" >&2
"$VENV/bin/pip" install --disable-pip-version-check -q "${PKGS[@]}" >&2
"$VENV/bin/pip" install --disable-pip-version-check -q --no-deps --target "$VENV/cuda13" "${CUDA13[@]}" >&2
# sanity: the headers are where the tests look for them
"$VENV/bin/python" - <<'PY' >&2
import glob, sys, sysconfig
site = sysconfig.get_paths(vars={"base": sys.argv[0] and sys.prefix})["purelib"]
for h in ("cuda.h", "nvml.h", "cuda_runtime_api.h"):
    if not glob.glob(f"{site}/nvidia/**/include/{h}", recursive=True):
        sys.exit(f"test-deps: {h} not found under {site}/nvidia")
for f in ("lib/libcudart.so.13", "include/cuda_runtime_api.h", "include/crt/host_defines.h"):
    if not glob.glob(f"{sys.prefix}/cuda13/nvidia/cu13/{f}"):
        sys.exit(f"test-deps: {f} not found under {sys.prefix}/cuda13/nvidia/cu13")
PY
touch "$STAMP"
echo "$VENV"
