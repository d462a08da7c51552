#!/usr/bin/env bash
# Fetches what the tests need from PyPI, at pinned versions, into a venv under
# target/ (never committed):
#   - cuda-bindings      NVIDIA's Python driver bindings (run unmodified on the
#                        sim; shim/tests/coverage.rs checks what this version
#                        resolves)
#   - nvidia-ml-py       pynvml (run unmodified on the sim)
#   - nvidia-cuda-runtime-cu12, nvidia-nvml-dev: the real cuda.h / nvml.h headers,
#                        and NVIDIA's CUDA 12 runtime (libcudart.so.12)
#   - prometheus-client  the reference parser of the exporter's text format
#   - gpustat            a monitoring tool on NVML (run unmodified on the sim)
#   - in VENV/cuda13 (apart, so that its headers never shadow CUDA 12's):
#     nvidia-cuda-runtime (libcudart.so.13 and its headers) and
#     nvidia-cuda-crt (crt/host_defines.h, which cuda_runtime_api.h includes;
#     the CUDA 12 runtime tests use it too: CUDA 12 ships it only with nvcc)
# Usage: scripts/test-deps.sh [VENV_DIR]   (default: target/test-deps/venv)
# Idempotent: does nothing when the venv is complete. Prints the venv path on
# stdout; progress and errors on stderr. The tests run it themselves (once,
# under a lock) on first use.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-target/test-deps/venv}"
PKGS=(
  cuda-bindings==13.5.0
  nvidia-ml-py==13.615.71
  nvidia-cuda-runtime-cu12==12.9.79
  nvidia-nvml-dev==13.5.37
  prometheus-client==0.26.0
  gpustat==1.1.1
)
CUDA13=(nvidia-cuda-runtime==13.5.37 nvidia-cuda-crt==13.5.37)
# The stamp names the pins: changing a pin rebuilds the venv.
STAMP="$VENV/.cgpu-test-deps-$(echo "${PKGS[*]} ${CUDA13[*]}" | cksum | cut -d' ' -f1)"
if [ -f "$STAMP" ]; then echo "$VENV"; exit 0; fi
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  echo "test-deps: python3-venv missing; installing it with apt-get" >&2
  (apt-get update && apt-get install -y python3-venv) >&2
fi
echo "test-deps: fetching ${PKGS[*]} ${CUDA13[*]} from PyPI into $VENV (once)" >&2
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV" >&2
if ! "$VENV/bin/pip" install --disable-pip-version-check -q --retries 2 --timeout 30 \
    "${PKGS[@]}" >&2 ||
   ! "$VENV/bin/pip" install --disable-pip-version-check -q --retries 2 --timeout 30 \
    --no-deps --target "$VENV/cuda13" "${CUDA13[@]}" >&2; then
  rm -rf "$VENV"
  cat >&2 <<MSG
test-deps: could not install the test dependencies from PyPI (pip's error is above).
  The tests need them: the real cuda.h and nvml.h, cuda-bindings, pynvml,
  prometheus-client and NVIDIA's CUDA runtimes. Make PyPI reachable (or point
  PIP_INDEX_URL at a mirror that has these versions), then run
  scripts/test-deps.sh, or the tests again.
MSG
  exit 1
fi
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
echo "test-deps: ready" >&2
echo "$VENV"
